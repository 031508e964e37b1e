"""Sharded learner ranks (``trainer.learner_strategy=fsdp``): torch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

What is sharded, and how the learner drives it
----------------------------------------------
Every decoder layer (the classes HF lists in ``model._no_split_modules``) is one FSDP unit and the causal LM itself is
the root unit: the embeddings, the final norm and the output projection (tied or not: a tied ``lm_head.weight`` is
the embedding's parameter, so both live in the one root unit). Each rank keeps ``1/N`` of every parameter, of its
gradient and of the AdamW moments (DTensors sharded on dim 0); a unit's full parameters exist only while it runs
(all-gathered before its forward, freed after it; again in backward), and gradients are reduce-scattered (averaged
over the ranks, as DDP's all-reduce) at each backward, so no rank ever holds a full gradient.

The learner's loss code is the data-parallel one (:mod:`agent_rl.distributed.data_parallel`): the same global loss
denominators (``global_denominator``: the ranks' losses over ``D / N``, averaged by the reduce-scatter, give the
single learner's gradient), the same ``global_max`` / ``global_min``. Two things differ from DDP:

- The learner calls the trunk (``model.base_model``) and ``lm_head`` apart, never the causal LM's ``forward``, which is
  where FSDP hooks the root. The root's pre-/post-forward hooks are therefore attached to the trunk (what
  ``torch.distributed.fsdp.register_fsdp_forward_method`` does for a method); the root stays unsharded after forward
  (FSDP's root rule), so ``lm_head`` (and a tied embedding) is usable until the backward's end, when FSDP's final
  callback reduce-scatters the root's gradients.
- All-gathers and reduce-scatters are collective: every rank must run the same number of forward (and backward)
  passes. ``lockstep = True`` tells the learner to pad its micro-batch loops to the ranks' maximum with idle passes
  (one row, a zero loss that touches every trainable parameter: ``PolicyForward.idle_pass``). DDP needs none of this (it
  accumulates locally and all-reduces once, :meth:`DataParallel.sync_gradients`).

Gradient accumulation (``sync_every_micro_batch``): by default the reduce-scatter runs at every micro-batch's backward
and the sharded gradients accumulate (``set_requires_gradient_sync(True)``, FSDP's default: ZeRO-3 memory).
``sync_every_micro_batch=False`` turns it off for all but the mini-batch's last backward (the learner tells the
count, :meth:`FullyShardedDataParallel.lockstep_padding`, and a hook on the trunk's forward counts down): one
reduce-scatter per optimiser step instead of one per micro-batch, at the price of an unsharded fp32 gradient of every
parameter on every rank until then (DDP's gradient memory). Same update either way (tests/distributed/test_fsdp.py).

Clipping: ``torch.nn.utils.clip_grad_norm_`` over DTensor gradients computes each shard's norm and all-reduces it (the
global norm of the full gradient; tests/distributed/test_fsdp.py checks it against the single learner's).

On CUDA: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the all-gathered parameters and the compute
are bf16, the gradients are reduced in fp32 into fp32 sharded master weights (the trained parameters are cast to fp32
before sharding; a frozen LoRA base keeps its dtype), AdamW steps in fp32. ``trainer.fsdp_offload=true``:
``CPUOffloadPolicy``: the sharded parameters, gradients and AdamW moments live in (pinned) CPU memory, the optimiser
steps on the CPU, each unit is copied to the GPU for its forward/backward.

Weights for the engines (:meth:`FullyShardedDataParallel.full_state_dict`): parameter by parameter, each rank's
shard all-gathered (``DTensor.full_tensor``), rank 0 keeps a CPU copy, every other rank drops it at once: the
transient device memory is one parameter's full tensor, never a full copy of the model per rank.

Not sharded: the reference model of ``algo.kl_coef > 0`` (a full frozen copy per rank) and the value head of
``algo=ppo`` (refused at load time, ``agent_rl.config.trainable``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from agent_rl.distributed.data_parallel import RankCollectives
from agent_rl.learner.learner import lr_scheduler, policy_trunk


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM: the modules whose class is in ``model._no_split_modules``
    (what HF and accelerate wrap one by one).

    Raises:
        ValueError: the model declares no such classes, or none of its modules has one (the message names them).
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no decoder-layer classes "
                         f"(_no_split_modules={sorted(names)}) that FSDP could shard one by one")
    return layers


def _fsdp_modules(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_causal_lm(model: nn.Module, device: torch.device, *, offload: bool = False) -> nn.Module:
    """``fully_shard`` every decoder layer of ``model`` and then ``model`` (the root) over a 1-D device mesh of the
    default process group; hook the root's forward onto the trunk (module docstring). In place; returns ``model``.

    Args:
        model: a transformers causal LM on ``device``. device: ``cpu`` (gloo) or ``cuda:i`` (NCCL; bf16 mixed
            precision, fp32 reduction). offload: ``CPUOffloadPolicy`` (CUDA only).
    Raises:
        RuntimeError: no default process group. ValueError: ``offload`` on a CPU device.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("FSDP needs torch.distributed.init_process_group first")
    if offload and device.type != "cuda":
        raise ValueError("trainer.fsdp_offload=true offloads GPU shards to CPU memory: it needs a CUDA learner")
    cuda = device.type == "cuda"
    if cuda:  # fp32 master weights of what is trained; the all-gathered copies are bf16 (MixedPrecisionPolicy);
        for p in model.parameters():  # a frozen base (LoRA) keeps its dtype (bf16 presets: 2 B/parameter)
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if cuda:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    trunk, _ = policy_trunk(model)
    state = model._get_fsdp_state()  # the root's (as register_fsdp_forward_method does for a method)

    def pre(_module: nn.Module, args: tuple, kw: dict) -> tuple[tuple, dict]:
        return state._pre_forward(model, args, kw)

    def post(_module: nn.Module, args: tuple, out: Any) -> Any:
        return state._post_forward(model, args, out)

    trunk.register_forward_pre_hook(pre, with_kwargs=True)
    trunk.register_forward_hook(post)
    return model


def tensor_bytes(tensors: Any) -> int:
    """Bytes of the local data of ``tensors`` (a DTensor counts its local shard), each tensor once (by address and
    size: tied parameters count once, views into one flat buffer each count their own part)."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        key = (local.data_ptr(), local.numel()) if local.numel() else id(local)
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def learner_memory(learner: Any) -> dict[str, int]:
    """Tensor bytes this rank holds for ``learner`` now: ``params`` (its trainable parameters, local shards),
    ``grads`` (their ``.grad``), ``optimizer`` (AdamW moments and steps), ``total``; frozen parameters and buffers
    (a reference model) apart as ``frozen``."""
    params = list(learner.params)
    trainable = {id(p) for p in params}
    frozen_t = [p for p in learner.model.parameters() if id(p) not in trainable] + list(learner.model.buffers())
    if getattr(learner, "ref_model", None) is not None:
        frozen_t += list(learner.ref_model.parameters())
    out = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
           "optimizer": tensor_bytes(v for st in learner.optimizer.state.values() for v in st.values()
                                     if isinstance(v, Tensor))}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    out["frozen"] = tensor_bytes(frozen_t)
    return out


class FullyShardedDataParallel(RankCollectives):
    """The hooks a :class:`agent_rl.learner.Learner` calls when it is one of ``world_size`` FSDP ranks
    (``learner.data_parallel = FullyShardedDataParallel(learner)``); the default process group must be initialised
    (a world of 1 is fine: one rank, sharding nothing, for CPU offload).

    Shards the learner's policy in place (:func:`shard_causal_lm`) and rebuilds its AdamW and LR schedule over the
    sharded parameters (``learner.params``, ``learner.optimizer``, ``learner.scheduler``; fresh, as at construction:
    a checkpoint is loaded afterwards). Every rank must call it with the same model (same initial weights are not
    needed: FSDP shards each rank's own copy, so seed the ranks alike, as ``LearnerRank`` does).

    Raises:
        ValueError: the learner has a value head (``algo=ppo``: not sharded), or ``offload`` without CUDA.
    """

    lockstep = True  # every rank runs the same number of forward / backward passes (collective all-gathers)

    def __init__(self, learner: Any, *, offload: bool = False, sync_every_micro_batch: bool = True) -> None:
        super().__init__(torch.device(learner.device))
        if getattr(learner, "value_head", None) is not None:
            raise ValueError("trainer.learner_strategy=fsdp does not shard a value head (algo=ppo): use ddp")
        self.model = shard_causal_lm(learner.model, self.device, offload=offload)
        cfg = learner.optim_cfg
        learner.params = [p for p in self.model.parameters() if p.requires_grad]
        learner.optimizer = torch.optim.AdamW(learner.params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                              weight_decay=cfg.weight_decay)
        learner.scheduler = lr_scheduler(learner.optimizer, cfg.warmup, unit=cfg.warmup_unit)
        self.learner = learner
        self.sync_every_micro_batch = bool(sync_every_micro_batch)
        self._backwards_left = 0
        policy_trunk(self.model)[0].register_forward_pre_hook(self._count_backward)
        #: tensor bytes of the last :meth:`full_state_dict` (``max_gathered``: the largest transient full tensor on
        #: a rank's device; ``rank0_copy``: the gathered copy rank 0 returns, on CPU).
        self.last_gather: dict[str, int] = {}

    def lockstep_padding(self, n: int) -> int:
        """The idle passes this rank adds to its ``n`` (``global_max(n) - n``); with gradient enabled (the grad
        pass) the ``global_max(n)`` backwards of the mini-batch are what :meth:`_count_backward` counts down."""
        total = self.global_max(n)
        if torch.is_grad_enabled():
            self._backwards_left = total
        return total - n

    def _count_backward(self, *_args: Any) -> None:
        """Trunk pre-forward hook: with ``sync_every_micro_batch=False``, reduce-scatter only in the mini-batch's last
        backward (every grad-pass forward is followed by its backward)."""
        if self.sync_every_micro_batch or not torch.is_grad_enabled() or self._backwards_left <= 0:
            return
        self.set_gradient_sync(self._backwards_left == 1)
        self._backwards_left -= 1

    def sync_gradients(self) -> None:
        """Nothing to do: FSDP reduce-scattered (averaged) the gradients in the backward passes."""

    def set_gradient_sync(self, enabled: bool) -> None:
        """``set_requires_gradient_sync(enabled)`` on every unit (off: gradients accumulate unsharded, see module
        docstring)."""
        for m in _fsdp_modules(self.model):
            m.set_requires_gradient_sync(enabled, recurse=False)

    def reshard(self) -> None:
        """Free every unit's unsharded parameters (the root keeps them after a forward until a backward)."""
        for m in _fsdp_modules(self.model):
            m.reshard()

    def full_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, Tensor] | None:
        """The policy's full state dict on rank 0 (CPU tensors, tied entries one tensor), None on the other ranks;
        every rank must call it (all-gathers, one parameter at a time). ``dtype``: cast floating tensors to it
        (None: as trained). Records :attr:`last_gather`."""
        from torch.distributed.tensor import DTensor

        self.reshard()
        out: dict[str, Tensor] | None = {} if self.rank == 0 else None
        done: dict[int, Tensor] = {}
        max_gathered = 0
        for name, t in self.model.state_dict().items():
            local = t.to_local() if isinstance(t, DTensor) else t
            key = (local.data_ptr(), tuple(t.shape)) if local.numel() else (id(t), tuple(t.shape))  # tied: once
            if key in done:
                if out is not None:
                    out[name] = done[key]
                continue
            if isinstance(t, DTensor) and local.device.type != t.device_mesh.device_type:  # CPU-offloaded shard
                t = DTensor.from_local(local.to(t.device_mesh.device_type), t.device_mesh, t.placements,
                                       shape=t.shape, stride=t.stride())
            full = t.full_tensor() if isinstance(t, DTensor) else t
            max_gathered = max(max_gathered, full.numel() * full.element_size())
            if out is not None:
                cpu = full.detach().to("cpu", dtype=dtype if dtype is not None and full.is_floating_point() else None,
                                       copy=True)
                out[name] = done[key] = cpu
            else:
                done[key] = torch.empty(0)
            del full
        self.last_gather = {"max_gathered": max_gathered,
                            "rank0_copy": tensor_bytes(out.values()) if out is not None else 0}
        return out

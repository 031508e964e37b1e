"""Atomic checkpoints: policy (``save_pretrained``), tokenizer, learner state (optimizer, scheduler, value head),
RNG states (python, numpy, torch CPU/CUDA) and a JSON ``extra`` dict (step, data position, ...).

Layout of one checkpoint folder (``DIR/checkpoints/step_N`` by convention of ``train.py``)::

    model.safetensors (or shards) + config.json   policy weights (a loadable transformers folder; LoRA: merged)
    adapter/                                       LoRA runs only: the adapter as peft saves it
    tokenizer files
    learner.pt                                     Learner.state_dict()
    rng.pt                                         RNG states
    extra.json                                     the caller's ``extra`` dict

:func:`load_checkpoint` restores every state file it is asked for or refuses (:class:`IncompleteCheckpoint`): a
missing ``learner.pt`` is never replaced by a fresh optimizer in silence; ``weights_only=True`` asks for exactly that.

The folder is written under a temporary name in the same parent, its files and the folder flushed to disk
(``fsync``), and renamed into place (``os.replace``), so a crash (SIGKILL, power loss) never leaves a half-written
checkpoint where :func:`latest_checkpoint` would pick it up. Replacing an existing checkpoint moves the old one
aside first; a crash between the two renames is undone by :func:`recover_checkpoints` (the trainer calls it before
resuming), which also deletes the temporary folders of interrupted saves.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent_rl.lora import adapter_state, is_lora, load_adapter, save_policy

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_RE = re.compile(r"^\.(step_\d+)\.tmp-")
_OLD_RE = re.compile(r"^\.(step_\d+)\.old-")


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` and the folder itself to disk."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: str | os.PathLike, model: torch.nn.Module, tokenizer: Any, learner: Any,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically to ``directory`` (replacing an existing one); returns its path.

    Args:
        directory: target folder, e.g. ``out/checkpoints/step_10``.
        model: the policy (saved with ``save_pretrained``, fp32/bf16 as it is; a LoRA model as its merged weights
            plus ``adapter/``, ``agent_rl.lora.save_policy``).
        tokenizer: saved with ``save_pretrained`` (None skips it).
        learner: object with ``state_dict()`` (``agent_rl.learner.Learner``), or None.
        extra: JSON-serialisable dict (step, data position, ...), returned by :func:`load_checkpoint`.
    """
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        save_policy(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if learner is not None:
            torch.save(learner.state_dict(), tmp / "learner.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "extra.json").write_text(json.dumps(extra or {}, indent=1))
        _replace_atomically(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _replace_atomically(tmp: Path, target: Path) -> None:
    """Flush the finished folder ``tmp`` and rename it to ``target`` (moving an existing one aside first)."""
    _fsync_tree(tmp)
    if target.exists():  # replace: move the old one aside first (os.replace cannot overwrite a non-empty dir)
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
    _fsync_dir(target.parent)


#: what each state file of a checkpoint restores (the names a refusal or a weights-only resume prints).
STATE_FILES = {
    "learner.pt": "the optimizer (AdamW moments and step count), the LR schedule's position (warm-up), the value head "
                  "(algo=ppo) and the mini-batch shuffling generator",
    "rng.pt": "the python / numpy / torch RNG states",
    "extra.json": "the step and the task sampler's position",
    "distcp": "the optimizer shards of a sharded learner (trainer.learner_strategy=fsdp: AdamW moments and step "
              "counts, written with torch.distributed.checkpoint; learner.pt then holds the rest)",
}

#: a sharded checkpoint's folder of torch.distributed.checkpoint files (model and optimizer, any number of ranks),
#: and its marker (``{"strategy", "world_size", "format"}``): a folder with the marker needs ``distcp/.metadata``.
SHARDED_DIR = "distcp"
SHARDED_MARKER = "sharded.json"


class IncompleteCheckpoint(FileNotFoundError):
    """A checkpoint folder lacks a state file (:data:`STATE_FILES`) that the load was asked to restore."""


def missing_state(directory: str | os.PathLike) -> list[str]:
    """The :data:`STATE_FILES` that checkpoint folder ``directory`` lacks (empty: complete); ``distcp`` only for a
    sharded checkpoint (:data:`SHARDED_MARKER`) without its ``distcp/.metadata``."""
    path = Path(directory)
    absent = [name for name in STATE_FILES if name != SHARDED_DIR and not (path / name).is_file()]
    if (path / SHARDED_MARKER).is_file() and not (path / SHARDED_DIR / ".metadata").is_file():
        absent.append(SHARDED_DIR)
    return absent


def incomplete_message(directory: str | os.PathLike, absent: list[str]) -> str:
    """The one-line refusal to resume checkpoint ``directory`` without its state files ``absent``: what each one
    restores, and the two ways on (``trainer.resume_weights_only=true``; ``model.path`` for a new run)."""
    return (f"checkpoint {directory} has no {' and no '.join(absent)} ({'; '.join(STATE_FILES[n] for n in absent)}): "
            "resuming would restart that state silently. Set trainer.resume_weights_only=true to resume from its "
            "weights, step and data position only (the run prints what restarts), or start a new run from its "
            f"weights with model.path={directory}")


def _weight_files(path: Path, with_learner: bool, restore_rng: bool, weights_only: bool) -> list[str]:
    """The checkpoint's ``*.safetensors`` files, after the checks every loader makes.

    Raises:
        FileNotFoundError: no weights in ``path``. IncompleteCheckpoint: ``learner.pt`` (``with_learner``),
            ``rng.pt`` (``restore_rng``) or a sharded checkpoint's ``distcp/`` missing, unless ``weights_only``.
    """
    files = sorted(glob.glob(str(path / "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no checkpoint weights (*.safetensors) in {path}")
    wanted = [name for name, needed in (("learner.pt", with_learner), ("rng.pt", restore_rng)) if needed]
    absent = [name for name in wanted if not (path / name).is_file()]
    if with_learner and SHARDED_DIR in missing_state(path):
        absent.append(SHARDED_DIR)
    if absent and not weights_only:
        raise IncompleteCheckpoint(incomplete_message(path, absent))
    return files


def load_checkpoint(directory: str | os.PathLike, model: torch.nn.Module, learner: Any = None,
                    restore_rng: bool = True, *, weights_only: bool = False) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (in place) and ``learner``; restore the
    RNG states; return the ``extra`` dict.

    ``weights_only``: load the weights (and ``extra``) only: ``learner`` keeps its fresh state, whether or not the
    checkpoint has ``learner.pt``; the RNG states are restored when ``rng.pt`` is there. Otherwise a state file
    the call restores (``learner.pt`` when ``learner`` is given, ``rng.pt`` when ``restore_rng``) must be there:
    nothing is silently left fresh.

    A LoRA ``model`` (peft) gets the checkpoint's adapter (``adapter/``, ``agent_rl.lora.load_adapter``); its base
    weights stay those it was loaded with (the run's ``model.*``, which a resume must keep: the merged weights of
    the folder are base + adapter).

    Raises:
        FileNotFoundError: no checkpoint there, or a LoRA ``model`` and no ``adapter/`` (a checkpoint of a run
            without LoRA). ValueError: the adapter does not fit the model (rank, alpha, target modules).
            IncompleteCheckpoint (a FileNotFoundError): ``learner.pt`` or
            ``rng.pt`` missing without ``weights_only`` (the message names the file, what it restores and the way
            out). RuntimeError: the weights do not match ``model`` (a missing key is accepted only for a parameter
            tied to a loaded one, e.g. ``lm_head.weight`` tied to the embeddings).
    """
    from safetensors.torch import load_file

    path = Path(directory)
    files = _weight_files(path, learner is not None, restore_rng, weights_only)
    if is_lora(model):
        load_adapter(model, path)
    else:
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        missing, unexpected = model.load_state_dict(state, strict=False)
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
        bad = [k for k in missing if k not in params or params[k].data_ptr() not in loaded_ptrs]
        if unexpected or bad:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing={bad} unexpected={unexpected}")
    if learner is not None and not weights_only:
        sd = torch.load(path / "learner.pt", map_location=learner.device, weights_only=False)
        if sd.get("optimizer") == SHARDED_DIR:  # written by sharded ranks: this learner's full moments from DCP
            sd["optimizer"] = _load_sharded_optimizer(path, model, learner)
        learner.load_state_dict(sd)
    if restore_rng and (path / "rng.pt").is_file():
        _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    extra_file = path / "extra.json"
    return json.loads(extra_file.read_text()) if extra_file.is_file() else {}


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The ``step_N`` folder with the largest N under ``output_dir/checkpoints`` (or ``output_dir`` itself), or None.

    Temporary folders of an interrupted save (``.step_N.tmp-*``) are ignored.
    """
    best: tuple[int, Path] | None = None
    for parent in (Path(output_dir) / "checkpoints", Path(output_dir)):
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            m = _STEP_RE.match(child.name)
            if m and child.is_dir() and (child / "extra.json").is_file():
                if best is None or int(m.group(1)) > best[0]:
                    best = (int(m.group(1)), child)
    return best[1] if best else None


def recover_checkpoints(folder: str | os.PathLike) -> list[str]:
    """Clean up after a crash during :func:`save_checkpoint` in ``folder`` (e.g. ``DIR/checkpoints``): an old
    checkpoint moved aside (``.step_N.old-*``) whose replacement never arrived is renamed back to ``step_N``; the
    temporary folders of interrupted saves (``.step_N.tmp-*``) and leftover moved-aside ones are deleted.
    Returns what was done, one line per folder. Call it only when no other process writes checkpoints there."""
    root = Path(folder)
    done: list[str] = []
    if not root.is_dir():
        return done
    for child in sorted(root.iterdir()):
        old, tmp = _OLD_RE.match(child.name), _TMP_RE.match(child.name)
        if old and child.is_dir():
            target = root / old.group(1)
            if not target.exists() and (child / "extra.json").is_file():
                os.replace(child, target)
                done.append(f"restored {target.name} from {child.name}")
            else:
                shutil.rmtree(child, ignore_errors=True)
                done.append(f"deleted {child.name}")
        elif tmp and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            done.append(f"deleted {child.name} (interrupted save)")
    return done


# ------------------------------------------------------------------------------------------------ sharded learners
def _load_sharded_optimizer(path: Path, model: torch.nn.Module, learner: Any) -> dict[str, Any]:
    """The AdamW state of a sharded checkpoint (``path/distcp``) for ``learner``'s optimizer, in the layout its
    parameters have (full tensors for a single or DDP learner, this rank's shards for an FSDP one: DCP reshards),
    as ``optimizer.state_dict()`` gives it (the caller passes it on to ``Learner.load_state_dict``, which applies the
    run's hyper-parameters). Works without a process group (one process reads every shard)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    osd = get_optimizer_state_dict(model, learner.optimizer)  # FQN-keyed template (a fresh optimizer is initialised)
    dcp.load({"optim": osd}, checkpoint_id=str(path / SHARDED_DIR))
    set_optimizer_state_dict(model, learner.optimizer, osd)
    return learner.optimizer.state_dict()


def save_sharded_checkpoint(directory: str | os.PathLike, model: torch.nn.Module, tokenizer: Any, learner: Any,
                            extra: dict[str, Any] | None, full_state: dict[str, torch.Tensor] | None) -> Path:
    """:func:`save_checkpoint` for sharded learner ranks (FSDP): every rank of the default process group calls it.

    Layout: the plain checkpoint's (a loadable transformers folder from ``full_state``, rank 0's gathered weights;
    tokenizer; ``learner.pt`` with the scheduler, generator and ``"optimizer": "distcp"``; ``rng.pt``; ``extra.json``)
    plus ``distcp/``: the model and optimizer shards of every rank, written with ``torch.distributed.checkpoint``
    (``get_state_dict`` FQN keys), and ``sharded.json``. Any number of ranks and any strategy resumes it (DCP
    reshards on load; :func:`load_checkpoint` and :func:`load_sharded_checkpoint`). Atomic as
    :func:`save_checkpoint`: rank 0 picks the temporary folder (on a file system every rank sees) and renames it.

    Args:
        full_state: the policy's full state dict on rank 0 (CPU), None elsewhere
            (``FullyShardedDataParallel.full_state_dict``).
    Raises:
        RuntimeError: rank 0 failed to write its part (its error, on every rank).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    target = Path(directory)
    box: list[Any] = [None]
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        box[0] = tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    msd, osd = get_state_dict(model, learner.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / SHARDED_DIR))
    error: list[Any] = [None]
    if rank == 0:
        try:
            if full_state is None:
                raise ValueError("rank 0 needs the gathered full_state")
            # a copy: save_pretrained empties the state dict it is given (the caller keeps its gathered weights)
            save_policy(model, tmp, dict(full_state))  # LoRA: merged weights + adapter/ from the gathered state
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if learner is not None:
                sd = learner.state_dict()
                sd["optimizer"] = SHARDED_DIR
                torch.save(sd, tmp / "learner.pt")
            torch.save(_rng_state(), tmp / "rng.pt")
            (tmp / "extra.json").write_text(json.dumps(extra or {}, indent=1))
            (tmp / SHARDED_MARKER).write_text(json.dumps({"strategy": "fsdp", "world_size": world,
                                                          "format": "torch.distributed.checkpoint"}))
            _replace_atomically(tmp, target)
        except BaseException as exc:  # noqa: BLE001 (told to every rank, then raised)
            shutil.rmtree(tmp, ignore_errors=True)
            error[0] = f"{type(exc).__name__}: {exc}"
    dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise RuntimeError(f"saving sharded checkpoint {target} failed on rank 0: {error[0]}")
    return target


def load_sharded_checkpoint(directory: str | os.PathLike, model: torch.nn.Module, learner: Any = None,
                            restore_rng: bool = True, *, weights_only: bool = False) -> dict[str, Any]:
    """:func:`load_checkpoint` for an FSDP-sharded ``model`` (every rank of the process group calls it), from any
    checkpoint: a sharded one (weights and AdamW moments from ``distcp/``, resharded to this rank count by DCP) or
    a plain one (single or DDP learner: the full weights and ``learner.pt``'s full moments, each rank keeping its
    shards). Same refusals as :func:`load_checkpoint` (``IncompleteCheckpoint``, mismatching weights)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)
    from torch.distributed.tensor import DTensor, distribute_tensor

    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    files = _weight_files(path, learner is not None, restore_rng, weights_only)
    sharded = (path / SHARDED_MARKER).is_file()
    if sharded and (path / SHARDED_DIR / ".metadata").is_file():
        msd = get_model_state_dict(model)
        dcp.load({"model": msd}, checkpoint_id=str(path / SHARDED_DIR))
        set_model_state_dict(model, msd)
    elif is_lora(model):  # a plain LoRA checkpoint: the adapter onto the shards (the frozen base is the run's)
        set_model_state_dict(model, adapter_state(path), options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        names = dict(model.named_parameters(remove_duplicate=False))
        params = dict(model.named_parameters())  # tied parameters once, under their first name
        unexpected = [k for k in state if k not in names and k not in dict(model.named_buffers())]
        by_param = {id(names[k]) for k in state if k in names}
        missing = [k for k, p in params.items() if id(p) not in by_param]
        if unexpected or missing:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing={missing} "
                               f"unexpected={unexpected}")
        full = {k: state[k] if k in state else next(state[n] for n, q in names.items() if q is p and n in state)
                for k, p in params.items()}
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=False))
    if learner is not None and not weights_only:
        sd = torch.load(path / "learner.pt", map_location="cpu", weights_only=False)
        if sd.get("optimizer") == SHARDED_DIR:
            sd["optimizer"] = _load_sharded_optimizer(path, model, learner)
        else:  # full moments, index-keyed as learner.params: this rank's shard of each
            for i, st in sd["optimizer"]["state"].items():
                p = learner.params[int(i)]
                for k, v in list(st.items()):
                    if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape:
                        st[k] = distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh, p.placements)
        learner.load_state_dict(sd)
    if restore_rng and (path / "rng.pt").is_file():
        _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    extra_file = path / "extra.json"
    return json.loads(extra_file.read_text()) if extra_file.is_file() else {}

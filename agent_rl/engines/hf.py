"""``hf`` engine: batched sampling with transformers' forward + KV cache, per-row temperature, on any device.

Why a hand-written loop rather than ``model.generate``: one call mixes rows at different temperatures (TGRL's T0
and T1 episodes wait for actions together), and the log-probs must be those of the exact tempered distribution the
token was drawn from (log softmax(z / T_row), fp32) so the learner reproduces them to 1e-4. The loop is short: a
prefill over the left-padded prompts, then one token per step with the cache; finished rows are dropped from the
batch (``DynamicCache.batch_select_indices``) so short answers do not pay for long ones, and with more rows than
``batch_size`` the waiting rows take the freed places at once (continuous batching: a prefill of the newcomers whose
cache joins the running one, right-aligned as below).

Sampling randomness is per row, never shared by the rows of a batch: row i draws its noise from its own
``torch.Generator`` seeded with ``row_seeds[i]`` (the orchestrator passes ``agent_rl.engines.row_seed`` of (rollout
seed, group, slot, turn)), so a row samples the same tokens whether it is generated alone, in a batch of any size or
in any order, i.e. whatever the env timing that formed the batch (the last bits of the logits may still differ with
the batch's padding; a token flips only when its noise falls within that rounding of a tie). Without ``row_seeds``, row i of the call uses ``row_seed(seed, i)`` (``seed``: the
call's, else a draw from the engine's generator). Each step samples by the exponential race, the Gumbel-max trick
``torch.multinomial`` itself uses for one sample: token = argmax_v p_v / q_v with q_v ~ Exp(1) from the row's
generator (one draw per vocabulary entry per token). Greedy rows (T = 0) take the argmax and draw nothing.

KV reuse across turns (``engine.kv_reuse``, on by default): with ``episode_ids`` the engine keeps, after each call,
every row's keys and values (the prompt and the response, less its last sampled token, which was never fed) under
the row's episode id. The next prompt of that episode reuses the longest common prefix of the kept token ids and the
new prompt (compared token by token: a prompt that does not start with the kept ids reuses only what matches, and
nothing when the first token differs, so a reuse is never wrong, only smaller) and prefills only the rest. In
trajectory mode turn k+1's prompt is turn k's prompt + its response + the new observation, so every turn prefills
only its response's last token and the observation; per-turn prompts with a history window change after the task
text, so only that common start is reused. The bound ``kv_reuse_max_tokens`` evicts whole episodes, least recently
used first (they then prefill from scratch); :meth:`HFEngine.end_episode` drops one; ``sync_weights`` drops all (a
cache holds the keys of one policy version, algorithms.md section 7). A kept cache is also keyed by the weights it
was computed with, :func:`weights_fingerprint` of the module taken at the start of each call that may reuse or keep
a cache: a checksum of the bits of every parameter and buffer, so any write the next call can see moves it, whatever
path it took: an optimizer step, ``load_state_dict``, ``p.data.copy_(...)`` and ``p.data = ...`` (which leave
``p._version`` unchanged: vllm #9744's kind, where 42 of 49 tokens were reused and log-probs were off by 1.1-1.5
nats), ``torch.nn.utils.vector_to_parameters``, one element changed. Not seen: a write racing with a running call
(the call keeps its start's fingerprint; the asynchronous producer serialises syncs between calls,
``VersionedEngine``), and a change whose checksum collides (a multiset of bit changes summing to 0 mod 2**32 under
the position weights: not a write training makes). Cost: one integer pass over the weights per call that
keeps or reuses caches (measured 2.1 s for SmolLM2-135M's float32 weights on one loaded CPU core, about 5 decode
steps of an 8-row batch; far less on a GPU).

Shared prefill (``shared_prefill``, with ``kv_reuse``): within one prefill, rows that reuse no kept cache and have
equal prompts (a group's G episodes at their first turn, every row of a single-turn GRPO group) are computed once; the other rows get
copies of that row's keys, values and next-token logits, and report the prompt as reused (``cached_tokens``). Exact
in the same sense as the padding: equal inputs give equal logits up to the batch's last bits. On a CPU it removes
(G - 1) / G of a single-turn step's prefill (docs/performance.md).

How rows with different cache lengths share one forward: the batch's cache is laid out right-aligned, row i's
``c_i`` cached columns at ``[C - c_i, C)`` (C = the longest reuse in the batch, zeros before), and its ``n_i`` new
tokens left-padded into the next N columns (N = the longest new part), so every row's next token is again in the
last column and decoding appends one column for all rows. The attention mask marks the real columns (the padding
in front of the cache and between the cache and the new tokens is masked) and ``position_ids`` are explicit:
``c_i + j`` for row i's j-th new token. This is exact because a cached key already carries its rotary position
(applied before caching), attention depends only on the masked set of keys and on positions, never on columns, and
the causal order of columns agrees with the order of positions within every row. Grouping rows by cache length
would avoid the padding but split the batch; per-row forwards would lose batching. The padded columns cost
``b * N * (C + N)`` attention work against ``b * P^2`` for a full prefill.

The engine shares the learner's ``nn.Module``: ``sync_weights`` only drops the caches. With a ``dtype`` other than
the module's (``engine.dtype=bfloat16`` beside float32 training weights) it samples with a copy of its own in that
dtype instead, which ``sync_weights`` refreshes from the learner's module (``load_state_dict``: a cast copy, tied
weights stay tied) before dropping the caches; :meth:`HFEngine.token_js` still scores with the learner's module, so
its JS is the learner's. Generation runs in ``eval()`` mode under ``torch.inference_mode`` and restores the module's
previous mode. Logits are sampled in float32 (float64
for a float64 model, so exactness tests cannot flip a near-tie in the float32 cast).
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from copy import deepcopy
from typing import Any, Iterator

import torch

from agent_rl.algos.logits import js_divergence_from_logits, truncate_logits
from agent_rl.engines.base import (EngineBase, EngineCaps, check_episode_ids, default_eos_token_ids, register_engine,
                                   row_seed)
from agent_rl.engines.hf_cache import EpisodeCache, EpisodeKVStore, join_caches, reuse, right_aligned, row_layers
from agent_rl.memory import release_free_heap
from agent_rl.models import DTYPES
from agent_rl.types import Generation


def _sample_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: float, top_k: int,
                        generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from the tempered, truncated distribution and return its log-prob under it.

    Args:
        logits: (b, V) fp32 raw logits z.
        temperature: (b,) fp32; a row with T == 0 is greedy (its log-prob is then taken at T = 1, untruncated).
        top_p, top_k: truncation of the sampling distribution (1.0 / 0 = off; ``agent_rl.algos.truncation_mask``).
        generators: b per-row generators (None for greedy rows): row j's noise comes from ``generators[j]`` only,
            so its token does not depend on the other rows (module docstring).
    Returns:
        tokens (b,) long, logprobs (b,) fp32 = log softmax(truncate(z) / T)[token]: the distribution sampled from,
        which the learner recomputes with the same truncation.
    """
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(truncate_logits(logits, t, top_k, top_p) / t[:, None], dim=-1)  # (b, V)
    noise = torch.ones_like(logp)  # (b, V): q ~ Exp(1) per sampled row (exponential race = Gumbel-max)
    for j, g in enumerate(generators):
        if g is not None:
            noise[j].exponential_(generator=g)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # q = 0 would turn p = 0 (a truncated token) into 0 / 0
    tokens = (logp.exp() / noise).argmax(-1)  # (b,)
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    full = torch.log_softmax(logits / t[:, None], dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, torch.where(greedy, full, logp.gather(-1, tokens[:, None]).squeeze(-1))


#: elements per chunk of :func:`weights_fingerprint` (bounds its temporaries: 4 MiB of int32 products per chunk).
_FINGERPRINT_CHUNK = 1 << 20
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_fingerprint_weights: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _position_weights(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(_FINGERPRINT_CHUNK,) odd multipliers (a fixed hash of the position) in ``dtype`` (int32 or int64), one copy
    per device and dtype."""
    w = _fingerprint_weights.get((device, dtype))
    if w is None:
        i = torch.arange(_FINGERPRINT_CHUNK, dtype=torch.int64)
        w = ((i * 0x9E3779B1 + 0x7F4A7C15) % (1 << 31)) | 1  # odd: any one changed element moves the sum
        w = _fingerprint_weights[(device, dtype)] = w.to(device=device, dtype=dtype)
    return w


@torch.no_grad()
def weights_fingerprint(module: torch.nn.Module) -> int:
    """A checksum of the bits of every parameter and buffer of ``module`` (an int in [0, 2**61)), on their device.

    Each tensor's elements are read as integers of their width (float32 bits as int32, bf16 as int16 widened to int32,
    float64 as int64), multiplied by an odd weight of their position within a chunk of 2**20 (so a swap of two elements
    moves it too) modulo 2**32 (2**64), where an odd multiple of a nonzero change stays nonzero, summed in int64 and
    mixed with the tensor's and chunk's index and the tensor's data pointer modulo the Mersenne prime
    2**61 - 1. Every single-element change moves it; a write that changes several elements leaves it equal only
    when the weighted bit changes cancel exactly (module docstring). One pass over the weights."""
    total = 0
    tensors = [t for _, t in module.named_parameters(remove_duplicate=True)]
    tensors += [t for _, t in module.named_buffers(remove_duplicate=True)]
    for ti, t in enumerate(tensors):
        flat = t.detach().reshape(-1)
        if flat.numel() == 0:
            continue
        if t.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        ints = flat.view(_INT_OF_SIZE[flat.element_size()])
        if ints.element_size() < 4:
            ints = ints.to(torch.int32)
        weights = _position_weights(flat.device, ints.dtype)
        sums = []
        for start in range(0, ints.numel(), _FINGERPRINT_CHUNK):
            part = ints[start:start + _FINGERPRINT_CHUNK]
            # products wrap modulo 2**32 (2**64 for 8-byte weights): an odd multiple of a nonzero change stays nonzero
            sums.append(torch.mul(part, weights[:part.numel()]).sum(dtype=torch.int64))
        for ci, c in enumerate(torch.stack(sums).tolist()):
            total = (total * 1_000_003 + c + (ti << 20) + ci) % ((1 << 61) - 1)
        total = (total + t.data_ptr()) % ((1 << 61) - 1)
    return total


def _sampling_dtype(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits (float64 stays float64)."""
    return logits if logits.dtype == torch.float64 else logits.float()


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _weights_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``model``'s first floating parameter (None: it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of ``model`` with its floating weights in ``dtype`` (the engine's own, ``HFEngine(dtype=...)``);
    gradients are not copied."""
    grads = {p: p.grad for p in model.parameters()}
    try:
        for p in grads:
            p.grad = None
        copy = deepcopy(model)
    finally:
        for p, g in grads.items():
            p.grad = g
    return copy.to(dtype).requires_grad_(False).eval()


class HFEngine(EngineBase):
    """Engine over a transformers causal LM (see module docstring).

    Args:
        model: the policy (shared with the learner).
        tokenizer: its tokenizer (needs a pad token).
        batch_size: most rows decoded together (prompts are sorted by length first).
        continuous_batching: a finished row's place in the batch goes to a waiting row at once (:meth:`_generate_rows`);
            False: the plain loop, batches of ``batch_size`` rows one after the other (the same tokens).
        eos_token_ids: ids that end a response (default: the model's ``generation_config.eos_token_id`` plus the
            tokenizer's eos).
        seed: seeds the engine's generator, which draws a call's base seed when ``generate`` gets neither
            ``row_seeds`` nor ``seed`` (it advances across such calls).
        kv_reuse: keep each episode's keys/values between calls (module docstring; needs ``episode_ids``).
        kv_reuse_max_tokens: most tokens kept over all episodes between calls (whole episodes are evicted, least
            recently used first). Memory: 2 * layers * kv_heads * head_dim * dtype bytes per token (SmolLM2-135M in
            float32: 46 KiB, so 32768 tokens = 1.4 GiB).
        shared_prefill: with ``kv_reuse``, rows of one prefill with equal prompts and no kept cache are computed
            once (module docstring); False: every row is prefilled (the same tokens).
        dtype: the precision to sample in (``agent_rl.models.DTYPES`` name or torch dtype; None = the module's):
            another dtype than the module's floating weights gives the engine its own cast copy of ``model``
            (module docstring), refreshed by ``sync_weights``. Memory: one copy of the weights in ``dtype``.

    Counters since construction (``stats()``): ``prefill_tokens`` prompt tokens computed, ``kv_reuse_tokens``
    prompt tokens taken from a cache, ``decode_tokens`` tokens sampled, ``evicted_episodes``.

    Raises:
        ValueError: ``kv_reuse_max_tokens < 1``, an unknown ``dtype``.
    """

    caps = EngineCaps(kv_reuse=True, fork_cache=True, token_js=True)

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = 32,
                 eos_token_ids: list[int] | None = None, seed: int = 0, kv_reuse: bool = True,
                 kv_reuse_max_tokens: int = 32768, continuous_batching: bool = True, shared_prefill: bool = True,
                 dtype: str | torch.dtype | None = None, **_: Any) -> None:
        if kv_reuse_max_tokens < 1:
            raise ValueError(f"engine.kv_reuse_max_tokens={kv_reuse_max_tokens}: must be >= 1")
        if isinstance(dtype, str) and dtype:
            if dtype not in DTYPES:
                raise ValueError(f"engine dtype={dtype!r}; valid: {sorted(DTYPES)}")
            dtype = DTYPES[dtype]
        # the learner's module (token_js scores with it) and the one generation runs: itself, or a copy in ``dtype``
        self.policy = model
        self.own_dtype = dtype if dtype and dtype != _weights_dtype(model) else None
        if self.own_dtype is not None:
            model = _cast_copy(model, self.own_dtype)
        self.kv_reuse, self.kv_reuse_max_tokens = bool(kv_reuse), int(kv_reuse_max_tokens)
        self.continuous_batching = bool(continuous_batching)
        self.shared_prefill = bool(shared_prefill) and self.kv_reuse
        self.store = EpisodeKVStore(self.kv_reuse, self.kv_reuse_max_tokens)  # each live episode's keys/values
        # one forward of the shared module at a time (generate's and token_js's, from the rollout's worker threads)
        self._forward_lock = threading.Lock()
        self._counts = dict(prefill_tokens=0, kv_reuse_tokens=0, decode_tokens=0)
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if eos_token_ids is None:
            eos_token_ids = default_eos_token_ids(model, tokenizer)
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
        self._seed = seed
        self._generator: torch.Generator | None = None
        # transformers renamed ``past_key_values`` to ``cache`` (5.x deprecation); use what this model accepts.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """Take ``model``'s weights: the engine holds the learner's module itself (it takes ``model``), or with a
        ``dtype`` of its own copies ``model``'s state into its copy, cast (a copy of another architecture or key set
        is rebuilt from ``model``). Then drop every kept cache (they hold keys and values of the previous weights)
        and give their freed pages back to the OS (``agent_rl.memory``). ``version`` is not kept (a
        :class:`~agent_rl.engines.VersionedEngine` around it stamps versions)."""
        self.policy = model
        if self.own_dtype is None:
            self.model = model
        else:
            with torch.no_grad():
                try:
                    self.model.load_state_dict(model.state_dict())
                except RuntimeError:  # other keys or shapes: another module than the one copied
                    self.model = _cast_copy(model, self.own_dtype)
        self.clear_caches()
        release_free_heap()

    def close(self) -> None:
        """Drop the kept caches (the module is the learner's)."""
        self.clear_caches()

    def end_episode(self, episode_id: str) -> None:
        """Drop the kept cache of ``episode_id`` (the orchestrator calls this when the episode ends or is cancelled;
        unknown ids are fine). A generation of that id in flight, or handed to the engine just before (a cancelled
        episode's last batch), keeps nothing for it."""
        self.store.end(episode_id)

    def fork_episode(self, source_id: str, episode_id: str) -> None:
        """Start ``episode_id``'s kept cache as ``source_id``'s (a forked sibling, ``rollout.fork``: its replayed
        turns are the source's conversation, so its first sampled prompt reuses the whole shared prefix: one prefill
        for the base and all its siblings). The tensors are shared: kept caches are never written in place (a call
        copies them into its batch cache). Nothing happens for an unknown or ended source, or with ``kv_reuse`` off;
        the bound ``kv_reuse_max_tokens`` evicts as for any kept episode."""
        self.store.fork(source_id, episode_id)

    def clear_caches(self) -> None:
        """Drop every kept cache."""
        self.store.clear()

    @property
    def cached_tokens(self) -> int:
        """Tokens whose keys/values are kept now (<= ``kv_reuse_max_tokens``)."""
        return self.store.tokens

    @property
    def cached_episodes(self) -> list[str]:
        """Episode ids with a kept cache, least recently used first."""
        return self.store.episodes()

    def stats(self) -> dict[str, int]:
        """Token counters since construction (class docstring)."""
        return {**self._counts, "evicted_episodes": self.store.evicted}

    def _stamp(self) -> tuple[int, ...]:
        """Identity of the weights a cache is computed with: the module and :func:`weights_fingerprint` of it (moved
        by every write to a parameter or buffer, ``.data`` writes included: module docstring)."""
        return (id(self.model), weights_fingerprint(self.model))

    def _keep(self, episode_id: str | None, token_ids: list[int], cache: Any, row: int, mask_row: torch.Tensor,
              stamp: tuple[int, ...]) -> None:
        """Keep row ``row`` of the batch ``cache`` (its real columns, ``mask_row`` == 1) for ``episode_id``."""
        if episode_id is not None and self.store.wants(episode_id, len(token_ids)):
            self.store.keep(episode_id, token_ids, row_layers(cache, row, mask_row, len(token_ids)), stamp)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None, row_seeds: list[int] | None = None,
                 episode_ids: list[str | None] | None = None) -> list[Generation]:
        """Sample one response per prompt (row i at ``temperatures[i]``); see ``Engine`` for the contract.

        ``episode_ids`` (optional, per row; None entries = not kept): with ``kv_reuse`` the row reuses the kept
        keys/values of its episode's earlier calls as far as the prompt starts with their tokens, and its own are
        kept for the next call (module docstring); ``Generation.cached_tokens`` says how many prompt tokens were
        reused. The tokens sampled do not depend on it (the last bits of the logits may, like with padding).

        ``row_seeds`` (optional, per row, ints in [0, 2**64)): row i's sampling noise comes from a generator seeded
        with ``row_seeds[i]`` alone (module docstring), so its tokens do not depend on the batch. Without it row i
        uses ``row_seed(seed, i)``, with ``seed`` drawn from the engine's generator when None.

        ``repetition_penalties`` (optional, per row; 1.0 = off): CTRL-style penalty on every id already in the row's
        prompt or response (z > 0: z / p, else z * p) before the temperature, as TGRL's reference code does on high
        rows (``algo.high_repetition_penalty``). The reported log-probs are then those of the penalised
        distribution actually sampled from; the learner recomputes unpenalised old log-probs (the PPO ratio's
        denominator), so ``actor/engine_logprob_diff`` shows the gap.

        Raises:
            ValueError: lengths differ, an empty prompt, a negative temperature, an episode id twice in one call.
        """
        check_episode_ids(episode_ids, len(prompts))
        if row_seeds is not None and len(row_seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(row_seeds)} row seeds")
        if repetition_penalties is not None and len(repetition_penalties) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(repetition_penalties)} repetition penalties")
        if len(prompts) != len(temperatures):
            raise ValueError(f"{len(prompts)} prompts but {len(temperatures)} temperatures")
        if any(len(p) == 0 for p in prompts) or any(t < 0 for t in temperatures):
            raise ValueError("prompts must be non-empty and temperatures >= 0")
        if row_seeds is None:
            if seed is None:
                if self._generator is None:
                    self._generator = torch.Generator().manual_seed(self._seed)
                seed = int(torch.randint(2**62, (1,), generator=self._generator))
            row_seeds = [row_seed(seed, i) for i in range(len(prompts))]
        ids = list(episode_ids) if episode_ids is not None and self.kv_reuse else [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths start together
        results: list[Generation | None] = [None] * len(prompts)
        # the weights of this call (a reuse needs an equal stamp)
        stamp = self._stamp() if any(e is not None for e in ids) else ()
        taken = self.store.begin(ids)
        try:
            with self._forward_lock, _eval_mode(self.model), torch.inference_mode():
                pen = None if repetition_penalties is None else [float(repetition_penalties[i]) for i in order]
                outs = self._generate_rows([prompts[i] for i in order], [temperatures[i] for i in order],
                                           max_new_tokens, top_p, top_k, stop or [], [row_seeds[i] for i in order],
                                           pen, [ids[i] for i in order], taken, stamp)
                for i, out in zip(order, outs):
                    results[i] = out
        finally:
            self.store.done(ids)
        return results  # type: ignore[return-value]

    def token_js(self, turns: list[tuple[list[int], list[int]]], t_low: float, t_high: float,
                 chunk_size: int = 64) -> list[list[float]]:
        """TGRL's token JS divergence of one episode's sampled tokens under the engine's weights, for choosing fork
        turns (``rollout.fork.select=js``): algorithms.md section 3.3, ``p0 = softmax(z / t_low)``, ``p1 = softmax(z /
        t_high)`` of the policy's logits z at each response position (no repetition penalty, no top-k / top-p), by
        :func:`agent_rl.algos.js_divergence_from_logits`, the learner's function, so the values are the learner's
        ``OldPolicyOutputs.js`` of the same tokens up to the engine-learner logit gap.

        Args:
            turns: the episode's turns in order, each ``(prompt_ids, response_ids)``. When every turn's prompt +
                response starts the next turn's prompt (trajectory mode) one forward over the last turn's sequence
                scores them all; otherwise each turn is one forward. Only the response positions' logits are formed
                (``logits_to_keep``), ``chunk_size`` rows at a time in the JS.
            t_low, t_high: T0 and T1 (> 0).
        Returns:
            per turn, (len(response_ids),) floats in [0, ln 2] (nats); [] for an empty response.
        Raises:
            ValueError: ``t_low`` or ``t_high`` <= 0, an empty prompt.
        """
        if t_low <= 0 or t_high <= 0:
            raise ValueError(f"token_js needs temperatures > 0 (got t_low={t_low}, t_high={t_high})")
        if any(not prompt for prompt, _ in turns):
            raise ValueError("token_js: a turn with an empty prompt")
        chained = all(list(turns[k + 1][0][:len(p) + len(r)]) == list(p) + list(r)
                      for k, (p, r) in enumerate(turns[:-1]))
        # (sequence, [(turn, first response position, response length)]) per forward
        if chained and turns:
            seq = list(turns[-1][0]) + list(turns[-1][1])
            forwards = [(seq, [(k, len(p), len(r)) for k, (p, r) in enumerate(turns)])]
        else:
            forwards = [(list(p) + list(r), [(k, len(p), len(r))]) for k, (p, r) in enumerate(turns)]
        out: list[list[float]] = [[] for _ in turns]
        with self._forward_lock, _eval_mode(self.policy), torch.inference_mode():
            for seq, spans in forwards:
                spans = [sp for sp in spans if sp[2] > 0]
                if not spans:
                    continue
                # the logits at position i predict token i + 1: a response at [start, start + n) is scored from
                # positions start - 1 .. start + n - 2
                keep = torch.cat([torch.arange(start - 1, start + n - 1) for _, start, n in spans]).to(self.device)
                ids = torch.tensor([seq[:int(keep.max()) + 1]], dtype=torch.long, device=self.device)
                logits = self.policy(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[0]
                js = js_divergence_from_logits(_sampling_dtype(logits), t_low, t_high, chunk_size=chunk_size)
                for (k, _, n), part in zip(spans, js.split([n for _, _, n in spans])):
                    out[k] = part.tolist()
        return out

    def _prefill(self, prompts: list[list[int]], episode_ids: list[str | None], entries: dict[str, EpisodeCache],
                 stamp: tuple[int, ...]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """One forward over ``prompts`` (b rows) with their reused caches (module docstring's right-aligned layout).

        Returns:
            ``(cache, attention_mask (b, C + N) long, logits (b, V) of each row's next token, next_pos (b,) long,
            reused (b,) prompt tokens taken from a kept cache or from an equal row's prefill)``.
        """
        device = self.device
        b = len(prompts)
        taken = [reuse(entries.pop(e, None) if e is not None else None, p, stamp)
                 for e, p in zip(episode_ids, prompts)]
        reused = [m for m, _ in taken]  # (b,) prompt tokens taken from a cache per row
        big_c = max(reused)  # cached columns of the batch (right-aligned, module docstring)
        new = [p[m:] for p, (m, _) in zip(prompts, taken)]
        big_n = max(len(x) for x in new)
        # New tokens left-padded so every row's next token sits in the last column: (b, N); mask over C + N columns.
        input_ids = torch.full((b, big_n), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((b, big_c + big_n), dtype=torch.long)
        position_ids = torch.zeros((b, big_n), dtype=torch.long)
        for r, (x, m) in enumerate(zip(new, reused)):
            input_ids[r, big_n - len(x):] = torch.tensor(x, dtype=torch.long)
            attention_mask[r, big_c - m:big_c] = 1
            attention_mask[r, big_c + big_n - len(x):] = 1
            position_ids[r, big_n - len(x):] = torch.arange(m, m + len(x))  # positions count real tokens only
        input_ids, attention_mask, position_ids = input_ids.to(device), attention_mask.to(device), position_ids.to(device)
        cache = right_aligned(taken, big_c)  # (b, kv_heads, C, head_dim) per layer
        del taken
        # Shared prefill (with kv_reuse): rows that reuse nothing and whose prompts are equal (a group's G episodes
        # at their first turn) are computed once and the row's keys, values and logits copied to its equals; a
        # copy counts as reused tokens (``Generation.cached_tokens``, as vLLM's prefix cache reports them).
        src = list(range(b))  # row -> the row it takes its prefill from
        if self.shared_prefill:
            first: dict[tuple[int, ...], int] = {}
            src = [first.setdefault(tuple(x), r) if m == 0 else r for r, (x, m) in enumerate(zip(new, reused))]
        uniq = sorted(set(src))
        shared = [len(new[r]) if src[r] != r else 0 for r in range(b)]
        self._counts["kv_reuse_tokens"] += sum(reused) + sum(shared)
        self._counts["prefill_tokens"] += sum(len(new[r]) for r in uniq)
        if len(uniq) < b:
            sel = torch.tensor(uniq, device=device)
            cache.batch_select_indices(sel)  # a no-op on the empty cache of a batch without reuse
            fwd = dict(input_ids=input_ids[sel], attention_mask=attention_mask[sel], position_ids=position_ids[sel])
        else:
            fwd = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        logits = _sampling_dtype(self.model(**fwd, use_cache=True, logits_to_keep=1,
                                            **{self._cache_kw: cache}).logits[:, -1])
        if len(uniq) < b:
            at = {r: j for j, r in enumerate(uniq)}
            expand = torch.tensor([at[src[r]] for r in range(b)], device=device)
            cache.batch_select_indices(expand)  # (b, kv_heads, C + N, head_dim) per layer: copies for the equals
            logits = logits[expand]
        return cache, attention_mask, logits, position_ids[:, -1] + 1, [m + c for m, c in zip(reused, shared)]

    def _generate_rows(self, prompts: list[list[int]], temperatures: list[float], max_new_tokens: int,
                       top_p: float, top_k: int, stop: list[str], seeds: list[int],
                       penalties: list[float] | None, episode_ids: list[str | None],
                       entries: dict[str, EpisodeCache], stamp: tuple[int, ...]) -> list[Generation]:
        """Decode every row of a call, at most ``batch_size`` in the batch at once, in the order given.

        Continuous batching (``continuous_batching``, the default): after each decode step the finished rows leave
        the batch (their kept caches stored first) and waiting rows take their places: one prefill of the newcomers,
        whose cache is joined to the running one (:func:`~agent_rl.engines.hf_cache.join_caches`), and the next step
        samples every row. Off: waiting rows start only when the whole batch is done (the plain loop: batches of
        ``batch_size`` rows one after the other). Either way a row's tokens come from its own generator and its own
        logits only, so both give the same tokens (up to the last bits of the logits, as with any padding).
        One function (over 80 lines): the batch's cache, mask, positions and rows change together at every step.
        """
        device = self.device
        n = len(prompts)
        eos = torch.tensor(self.eos_token_ids, device=device)
        stop_window = max((len(s) for s in stop), default=0) + 2  # a stop string spans at most len(s) tokens
        use_penalty = penalties is not None and any(p != 1.0 for p in penalties)
        tokens_out: list[list[int]] = [[] for _ in range(n)]
        logps_out: list[list[float]] = [[] for _ in range(n)]
        reasons = ["length"] * n
        reused = [0] * n
        waiting = list(range(n))  # rows not started, in order
        alive: list[int] = []  # row of the call of each row in the batch
        generators: list[torch.Generator | None] = []  # one stream per row (module docstring); none when greedy
        cache = attention_mask = logits = temps = next_pos = penalty = seen = None
        while alive or waiting:
            room = self.batch_size - len(alive)
            if waiting and room > 0 and (self.continuous_batching or not alive):
                new_rows, waiting = waiting[:room], waiting[room:]
                c_new, am_new, lg_new, pos_new, r_new = self._prefill(
                    [prompts[r] for r in new_rows], [episode_ids[r] for r in new_rows], entries, stamp)
                for r, m in zip(new_rows, r_new):
                    reused[r] = m
                t_new = torch.tensor([temperatures[r] for r in new_rows], dtype=torch.float32, device=device)
                g_new = [torch.Generator(device=device).manual_seed(int(seeds[r]) % 2**64) if temperatures[r] > 0
                         else None for r in new_rows]
                if use_penalty:
                    p_new = torch.tensor([penalties[r] for r in new_rows], dtype=lg_new.dtype, device=device)[:, None]
                    s_new = torch.zeros(len(new_rows), lg_new.shape[-1], dtype=torch.bool, device=device)
                    for j, r in enumerate(new_rows):  # the whole prompt, cached part included: (b, V) ids seen
                        s_new[j, torch.tensor(prompts[r], dtype=torch.long, device=device)] = True
                if alive:
                    cache, attention_mask = join_caches(cache, attention_mask, c_new, am_new)
                    logits, temps = torch.cat([logits, lg_new]), torch.cat([temps, t_new])
                    next_pos = torch.cat([next_pos, pos_new])
                    if use_penalty:
                        penalty, seen = torch.cat([penalty, p_new]), torch.cat([seen, s_new])
                else:
                    cache, attention_mask, logits, temps, next_pos = c_new, am_new, lg_new, t_new, pos_new
                    if use_penalty:
                        penalty, seen = p_new, s_new
                alive, generators = alive + new_rows, generators + g_new
            if penalty is not None:
                logits = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
            tok, lp = _sample_from_logits(logits, temps, top_p, top_k, generators)  # (b',), (b',)
            if seen is not None:
                seen[torch.arange(len(alive), device=device), tok] = True
            tok_l, lp_l = tok.tolist(), lp.tolist()
            is_eos = torch.isin(tok, eos).tolist()
            keep: list[int] = []
            for j, r in enumerate(alive):
                tokens_out[r].append(tok_l[j])
                logps_out[r].append(lp_l[j])
                if is_eos[j]:
                    reasons[r] = "stop"
                elif stop and any(s in self.tokenizer.decode(tokens_out[r][-stop_window:]) for s in stop):
                    reasons[r] = "stop"
                elif len(tokens_out[r]) < max_new_tokens:
                    keep.append(j)
            if len(keep) < len(alive):  # drop finished rows from the batch and the cache (kept first)
                kept = set(keep)
                for j, r in enumerate(alive):
                    if j not in kept:
                        self._keep(episode_ids[r], prompts[r] + tokens_out[r][:-1], cache, j, attention_mask[j], stamp)
                alive = [alive[j] for j in keep]
                generators = [generators[j] for j in keep]
                if not keep:
                    cache = attention_mask = logits = temps = next_pos = penalty = seen = None
                    continue
                keep_t = torch.tensor(keep, device=device)
                cache.batch_select_indices(keep_t)
                tok, temps, next_pos, attention_mask = tok[keep_t], temps[keep_t], next_pos[keep_t], attention_mask[keep_t]
                if penalty is not None:
                    penalty, seen = penalty[keep_t], seen[keep_t]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=1)
            logits = _sampling_dtype(self.model(
                input_ids=tok[:, None], attention_mask=attention_mask, position_ids=next_pos[:, None],
                use_cache=True, **{self._cache_kw: cache}).logits[:, -1])
            next_pos = next_pos + 1
        self._counts["decode_tokens"] += sum(len(t) for t in tokens_out)
        return [
            Generation(token_ids=tokens_out[r], logprobs=logps_out[r],
                       text=self.tokenizer.decode(tokens_out[r], skip_special_tokens=True), finish_reason=reasons[r],
                       cached_tokens=reused[r])
            for r in range(n)
        ]


@register_engine("hf", HFEngine.caps)
def _make_hf(model: Any, tokenizer: Any, **kwargs: Any) -> HFEngine:
    return HFEngine(model, tokenizer, **kwargs)

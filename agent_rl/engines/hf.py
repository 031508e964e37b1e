"""``hf`` engine: batched sampling with transformers' forward + KV cache, per-row temperature, on any device.

Why a hand-written loop rather than ``model.generate``: one call mixes rows at different temperatures (TGRL's T0
and T1 episodes wait for actions together), and the log-probs must be those of the exact tempered distribution the
token was drawn from (log softmax(z / T_row), fp32) so the learner reproduces them to 1e-4. The loop is short: a
prefill over the left-padded prompts, then one token per step with the cache; finished rows are dropped from the
batch (``DynamicCache.batch_select_indices``) so short answers do not pay for long ones.

Sampling randomness is per row, never shared by the rows of a batch: row i draws its noise from its own
``torch.Generator`` seeded with ``row_seeds[i]`` (the orchestrator passes ``agent_rl.engines.row_seed`` of (rollout
seed, group, slot, turn)), so a row samples the same tokens whether it is generated alone, in a batch of any size or
in any order, i.e. whatever the env timing that formed the batch (the last bits of the logits may still differ with
the batch's padding; a token flips only when its noise falls within that rounding of a tie). Without ``row_seeds``, row i of the call uses ``row_seed(seed, i)`` (``seed``: the
call's, else a draw from the engine's generator). Each step samples by the exponential race, the Gumbel-max trick
``torch.multinomial`` itself uses for one sample: token = argmax_v p_v / q_v with q_v ~ Exp(1) from the row's
generator (one draw per vocabulary entry per token). Greedy rows (T = 0) take the argmax and draw nothing.

The engine shares the learner's ``nn.Module``: ``sync_weights`` is a no-op. Generation runs in ``eval()`` mode
under ``torch.inference_mode`` and restores the module's previous mode.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import inspect

import torch

from agent_rl.algos.logits import truncate_logits
from agent_rl.engines.base import default_eos_token_ids, register_engine, row_seed
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


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class HFEngine:
    """Engine over a transformers causal LM (see module docstring).

    Args:
        model: the policy (shared with the learner).
        tokenizer: its tokenizer (needs a pad token).
        batch_size: prompts per forward batch (prompts are sorted by length first).
        eos_token_ids: ids that end a response (default: the model's ``generation_config.eos_token_id`` plus the
            tokenizer's eos).
        seed: seeds the engine's generator, which draws a call's base seed when ``generate`` gets neither
            ``row_seeds`` nor ``seed`` (it advances across such calls).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = 32,
                 eos_token_ids: list[int] | None = None, seed: int = 0, **_: Any) -> None:
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

    def sync_weights(self, model: Any) -> None:
        """No-op: the engine holds the learner's module itself."""
        self.model = model

    def close(self) -> None:
        """Nothing to release (the module is the learner's)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: list[list[int]], temperatures: list[float], *, max_new_tokens: int,
                 top_p: float = 1.0, top_k: int = 0, stop: list[str] | None = None, seed: int | None = None,
                 repetition_penalties: list[float] | None = None,
                 row_seeds: list[int] | None = None) -> list[Generation]:
        """Sample one response per prompt (row i at ``temperatures[i]``); see ``Engine`` for the contract.

        ``row_seeds`` (optional, per row, ints in [0, 2**64)): row i's sampling noise comes from a generator seeded
        with ``row_seeds[i]`` alone (module docstring), so its tokens do not depend on the batch. Without it row i
        uses ``row_seed(seed, i)``, with ``seed`` drawn from the engine's generator when None.

        ``repetition_penalties`` (optional, per row; 1.0 = off): CTRL-style penalty on every id already in the row's
        prompt or response (z > 0: z / p, else z * p) before the temperature, as TGRL's reference code does on high
        rows (``algo.high_repetition_penalty``). The reported log-probs are then those of the penalised
        distribution actually sampled from; the learner recomputes unpenalised old log-probs (the PPO ratio's
        denominator), so ``actor/engine_logprob_diff`` shows the gap.

        Raises:
            ValueError: lengths differ, an empty prompt, a negative temperature.
        """
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
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        results: list[Generation | None] = [None] * len(prompts)
        with _eval_mode(self.model), torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                pen = None if repetition_penalties is None else [float(repetition_penalties[i]) for i in idx]
                outs = self._generate_batch([prompts[i] for i in idx], [temperatures[i] for i in idx],
                                            max_new_tokens, top_p, top_k, stop or [], [row_seeds[i] for i in idx], pen)
                for i, out in zip(idx, outs):
                    results[i] = out
        return results  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[list[int]], temperatures: list[float], max_new_tokens: int,
                        top_p: float, top_k: int, stop: list[str], seeds: list[int],
                        penalties: list[float] | None = None) -> list[Generation]:
        from transformers import DynamicCache

        device = self.device
        b = len(prompts)
        max_len = max(len(p) for p in prompts)
        # Left padding so every row's next token sits in the last column: (b, P).
        input_ids = torch.full((b, max_len), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((b, max_len), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, max_len - len(p):] = torch.tensor(p, dtype=torch.long)
            attention_mask[r, max_len - len(p):] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (b, P): positions count real tokens only
        temps = torch.tensor(temperatures, dtype=torch.float32, device=device)
        generators: list[torch.Generator | None] = [  # one stream per row (module docstring); none when greedy
            torch.Generator(device=device).manual_seed(int(s) % 2**64) if t > 0 else None
            for s, t in zip(seeds, temperatures)]
        eos = torch.tensor(self.eos_token_ids, device=device)
        stop_window = max((len(s) for s in stop), default=0) + 2  # a stop string spans at most len(s) tokens

        tokens_out: list[list[int]] = [[] for _ in range(b)]
        logps_out: list[list[float]] = [[] for _ in range(b)]
        reasons = ["length"] * b
        alive = list(range(b))  # original row of each row still in the batch
        cache = DynamicCache()
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}).logits[:, -1].float()
        next_pos = position_ids[:, -1] + 1  # (b,)
        penalty = seen = None
        if penalties is not None and any(p != 1.0 for p in penalties):
            penalty = torch.tensor(penalties, dtype=torch.float32, device=device)[:, None]  # (b, 1)
            seen = torch.zeros(b, logits.shape[-1], dtype=torch.bool, device=device)  # (b, V) ids seen per row
            rows_real, cols_real = attention_mask.nonzero(as_tuple=True)  # prompt tokens only, not the padding
            seen[rows_real, input_ids[rows_real, cols_real]] = True
        for _step in range(max_new_tokens):
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
                else:
                    keep.append(j)
            if not keep or _step == max_new_tokens - 1:
                break
            if len(keep) < len(alive):  # drop finished rows from the batch and the cache
                keep_t = torch.tensor(keep, device=device)
                cache.batch_select_indices(keep_t)
                tok, temps, next_pos, attention_mask = tok[keep_t], temps[keep_t], next_pos[keep_t], attention_mask[keep_t]
                if penalty is not None:
                    penalty, seen = penalty[keep_t], seen[keep_t]
                alive = [alive[j] for j in keep]
                generators = [generators[j] for j in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=1)
            logits = self.model(input_ids=tok[:, None], attention_mask=attention_mask, position_ids=next_pos[:, None],
                                use_cache=True, **{self._cache_kw: cache}).logits[:, -1].float()
            next_pos = next_pos + 1
        return [
            Generation(token_ids=tokens_out[r], logprobs=logps_out[r],
                       text=self.tokenizer.decode(tokens_out[r], skip_special_tokens=True), finish_reason=reasons[r])
            for r in range(b)
        ]


@register_engine("hf")
def _make_hf(model: Any, tokenizer: Any, **kwargs: Any) -> HFEngine:
    return HFEngine(model, tokenizer, **kwargs)

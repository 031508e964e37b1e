"""TAMPO: a learned distribution over sampling temperatures (algorithms.md section 8; Dang et al., "Temperature as a
Meta-Policy: Adaptive Temperature in LLM Reinforcement Learning", ICLR 2026, arXiv 2602.11779). Pure torch + the
standard library, no grad.

Dims: B rows, T response tokens (the learner's L), E episodes, K candidate temperatures, V vocabulary, n rows of one
logits chunk.

What runs where, one RL step s (drawn T_s, plain GRPO at T_s):
    learner, no-grad pass, per logits chunk z (n, V):
        vlp = virtual_logprobs(z, tokens, temps)                          # 8.2, (n, K), one k at a time
    learner, after the advantages:
        ell = episode_virtual_likelihoods(vlp, response_mask, episode_index)   # 8.2, (B, T, K) -> (E, K)
        stats = tampo_episode_sums(ell, episode_advantages, temps, norm)       # 8.3-8.4, additive over ranks
    driver (``TampoMetaPolicy``): A_B = sums / N (:func:`tampo_statistic` is the same in one call), EMA, pi, the
        nucleus draw of T_{s+1}.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from torch import Tensor

from ._groups import check_1d, check_2d, trajectory_ids

__all__ = ["TAMPO_NORMS", "TAMPO_SCOPES", "virtual_logprobs", "episode_virtual_likelihoods", "sparsemax",
           "tampo_normalise", "tampo_statistic", "tampo_episode_sums", "TAMPO_SUM_PREFIX", "tampo_sum_metrics", "tampo_meta_policy", "tampo_nucleus",
           "tampo_draw", "TampoMetaPolicy", "parse_temperature_schedule", "scheduled_temperature"]

TAMPO_NORMS = ("sparsemax", "softmax", "argmax")
TAMPO_SCOPES = ("step", "group")
_FLAT = 1e-12  # 8.6: max E - min E below this -> uniform pi
_CUM_TOL = 1e-12  # 8.7: "the running sum reaches p", robust to float rounding of sums of equal masses


@torch.no_grad()
def virtual_logprobs(logits: Tensor, token_ids: Tensor, temps: list[float] | tuple[float, ...]) -> Tensor:
    """Virtual-temperature log-probs of the sampled tokens (algorithms.md 8.2): ``lp_{t,k} = z_{t,o_t} / T_k -
    logsumexp_v(z_{t,v} / T_k)`` over the full vocabulary, float32, one candidate at a time (peak extra memory one
    (n, V) float32 buffer: never a (K, n, V) tensor).

    Args:
        logits: (n, V) float (one chunk of the no-grad pass; any float dtype, computed in float32).
        token_ids: (n,) long, the sampled tokens aligned with ``logits``.
        temps: the K candidates ``algo.tampo.temps`` (each > 0).
    Returns:
        (n, K) float32 log-probs in nats (``-inf`` where the token's logit is ``-inf``).
    Raises:
        ValueError: shapes that do not match, a temperature <= 0.
    """
    check_2d("logits", logits)
    check_1d("token_ids", token_ids, logits.shape[0])
    if any(float(t) <= 0 for t in temps):
        raise ValueError(f"temperatures must be > 0, got {list(temps)}")
    z = logits.float()  # (n, V)
    z_o = z.gather(-1, token_ids.long()[:, None]).squeeze(-1)  # (n,)
    shift = z.amax(dim=-1).clamp_min(torch.finfo(torch.float32).min)  # (n,) max-shift: large logits stay finite
    buf = torch.empty_like(z)
    out = torch.empty(z.shape[0], len(temps), dtype=torch.float32, device=z.device)  # (n, K)
    for k, t in enumerate(temps):
        torch.sub(z, shift[:, None], out=buf).mul_(1.0 / float(t)).exp_()  # (n, V) exp((z - max) / T_k) in (0, 1]
        out[:, k] = (z_o - shift) / float(t) - buf.sum(-1).log_()  # the max entry adds exp(0): sum >= 1
    return out


@torch.no_grad()
def episode_virtual_likelihoods(vlp: Tensor, response_mask: Tensor, episode_index: Tensor | None = None
                                ) -> tuple[Tensor, Tensor]:
    """``ell_{i,k}`` = mean of ``lp_{t,k}`` over the masked action tokens of episode i (algorithms.md 8.2): in
    per-turn mode over the union of the episode's turn rows (a token mean, *not* a mean of row means), in
    trajectory mode its one row.

    Args:
        vlp: (B, T, K) float, :func:`virtual_logprobs` scattered to the rows (values off the mask never read).
        response_mask: (B, T) 0/1.
        episode_index: (B,) int: rows sharing a value are one episode; None = each row its own.
    Returns:
        ``(ell (E, K) float64, n_tokens (E,) long)``, episodes in ascending ``episode_index`` order; an episode
        with no action token has ell 0 and n_tokens 0.
    Raises:
        ValueError: ``vlp`` not (B, T, K) with (B, T) of ``response_mask``, ``episode_index`` not (B,).
    """
    check_2d("response_mask", response_mask)
    if vlp.dim() != 3 or tuple(vlp.shape[:2]) != tuple(response_mask.shape):
        raise ValueError(f"vlp must have shape (B, T, K) with (B, T) = {tuple(response_mask.shape)}, "
                         f"got {tuple(vlp.shape)}")
    traj, n_ep = trajectory_ids(response_mask, episode_index)  # (B,) dense episode ids
    m = response_mask > 0
    rows, cols = m.nonzero(as_tuple=True)  # (N,) masked tokens
    seg = traj[rows]  # (N,)
    k = vlp.shape[-1]
    total = torch.zeros(n_ep, k, dtype=torch.float64, device=vlp.device).index_add_(0, seg, vlp[rows, cols].double())
    count = torch.zeros(n_ep, dtype=torch.long, device=vlp.device).index_add_(0, seg, torch.ones_like(seg))
    return total / count.clamp_min(1)[:, None].double(), count


def sparsemax(v: Tensor) -> Tensor:
    """Sparsemax over the last dim (Martins and Astudillo 2016, "From softmax to sparsemax"), exactly algorithms.md
    8.3: sort descending, ``c_j`` the prefix sums, ``k* = max{j : 1 + j v_(j) > c_j}``, ``tau = (c_{k*} - 1) / k*``,
    ``out = max(v - tau, 0)``. Sums to 1, invariant to a constant shift of a row.

    Args:
        v: (..., K) finite float.
    Returns:
        (..., K) float, same dtype.
    """
    srt = torch.sort(v, dim=-1, descending=True).values  # (..., K)
    cum = srt.cumsum(-1)
    j = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)  # (K,)
    support = (1 + j * srt) > cum  # (..., K); always true at j = 1
    k_star = support.to(v.dtype).mul(j).amax(-1, keepdim=True)  # (..., 1) the largest j in the support
    c_k = cum.gather(-1, k_star.long() - 1)
    tau = (c_k - 1) / k_star
    return (v - tau).clamp_min(0.0)


def tampo_normalise(ell: Tensor, norm: str = "sparsemax", norm_tau: float = 1.0) -> Tensor:
    """``hat_ell`` across the candidates of each episode (algorithms.md 8.3): ``sparsemax(ell / norm_tau)``,
    ``softmax(ell / norm_tau)`` or ``argmax`` (one-hot at the best T, ties to the lower T). Non-finite entries get
    0 and the normalisation runs over the finite ones; a row with no finite entry gets all zeros.

    Example: the profile [-inf, -1.0, -1.2] normalises (sparsemax) to [0, 0.6, 0.4].

    Args:
        ell: (E, K) float. norm: ``algo.tampo.norm``. norm_tau: ``algo.tampo.norm_tau`` (> 0).
    Returns:
        (E, K) float64, each row summing to 1 (or all 0).
    Raises:
        ValueError: an unknown ``norm``, ``norm_tau <= 0``, ``ell`` not 2-D.
    """
    check_2d("ell", ell)
    if norm not in TAMPO_NORMS:
        raise ValueError(f"algo.tampo.norm={norm!r} is not valid; valid values: {', '.join(TAMPO_NORMS)}")
    if not norm_tau > 0:
        raise ValueError(f"algo.tampo.norm_tau={norm_tau} must be > 0")
    x = ell.double() / float(norm_tau)
    finite = torch.isfinite(x)  # (E, K)
    if norm == "argmax":
        masked = torch.where(finite, x, -math.inf)
        best = masked.argmax(-1)  # first maximum: ties to the lower T (candidates ascend)
        out = torch.zeros_like(x).scatter_(-1, best[:, None], 1.0)
    elif norm == "softmax":
        out = torch.softmax(torch.where(finite, x, -math.inf), dim=-1)
    else:
        # non-finite entries set below max - 1, where sparsemax gives exactly 0 (tau >= max - 1); rows without a
        # finite entry run on zeros and are zeroed below
        hi = torch.where(finite, x, -math.inf).amax(-1, keepdim=True)
        hi = torch.where(torch.isfinite(hi), hi, 0.0)
        out = sparsemax(torch.where(finite, x, hi - 2.0))
    out = torch.where(finite, out, 0.0)
    return torch.where(finite.any(-1, keepdim=True), out, 0.0)


@torch.no_grad()
def tampo_episode_sums(ell: Tensor, episode_advantages: Tensor, temps: list[float] | tuple[float, ...],
                       norm: str = "sparsemax", norm_tau: float = 1.0, n_tokens: Tensor | None = None
                       ) -> dict[str, Any]:
    """The additive part of the TAMPO statistic of one batch (or one learner rank's shard of it): sums over its
    episodes, so ranks' results add up and the driver divides by N (algorithms.md 8.3-8.4, 8.9).

    Args:
        ell: (E, K) :func:`episode_virtual_likelihoods`. episode_advantages: (E,) the GRPO advantage A_i (before any
            token credit or clamp). temps: the K candidates (ascending). norm, norm_tau: :func:`tampo_normalise`.
        n_tokens: (E,) action tokens per episode; an episode with 0 gets all-zero hat_ell (still counted in N).
    Returns:
        ``{"adv_sum": [K floats] (sum_i hat_ell_{i,k} A_i), "episodes": E, "tstar_pos_sum", "tstar_pos_n",
        "tstar_neg_sum", "tstar_neg_n" (argmax-T of ell summed over episodes with A > 0 / A < 0), "nonfinite":
        non-finite entries of ell}`` (python numbers).
    """
    check_2d("ell", ell)
    e, k = ell.shape
    check_1d("episode_advantages", episode_advantages, e)
    if len(temps) != k:
        raise ValueError(f"ell has {k} candidates, temps {len(temps)}")
    ell = ell.double()
    if n_tokens is not None:
        ell = torch.where((n_tokens > 0)[:, None], ell, math.nan)  # no action token: all zeros below
    hat = tampo_normalise(ell, norm, norm_tau)  # (E, K)
    a = episode_advantages.double().to(hat.device)
    finite = torch.isfinite(ell)
    tstar = torch.tensor(list(temps), dtype=torch.float64, device=hat.device)[
        torch.where(finite, ell, -math.inf).argmax(-1)]  # (E,) argmax-T, ties to the lower T
    has = finite.any(-1)
    pos, neg = (a > 0) & has, (a < 0) & has
    return {"adv_sum": (hat * a[:, None]).sum(0).tolist(), "episodes": int(e),
            "tstar_pos_sum": float(tstar[pos].sum()), "tstar_pos_n": int(pos.sum()),
            "tstar_neg_sum": float(tstar[neg].sum()), "tstar_neg_n": int(neg.sum()),
            "nonfinite": int((~finite).sum())}


@torch.no_grad()
def tampo_statistic(ell: Tensor, episode_advantages: Tensor, norm: str = "sparsemax", norm_tau: float = 1.0,
                    n_tokens: Tensor | None = None) -> Tensor:
    """The TAMPO batch statistic (algorithms.md 8.3-8.4): ``A_B,k = (1/N) sum_i hat_ell_{i,k} A_i`` over all N
    episodes of the step's batch (all-equal groups included: their A_i = 0 still count in N). Invariant:
    ``sum_k A_B,k = 0`` when every profile is finite (the GRPO advantages of each group sum to 0).

    Example (section 8's hand case, sparsemax): A_B = [+0.097381, +0.004181, -0.101562].

    Args:
        ell: (E, K) virtual likelihoods. episode_advantages: (E,) GRPO A_i. norm, norm_tau: the normalisation.
        n_tokens: (E,) or None (see :func:`tampo_episode_sums`).
    Returns:
        (K,) float64 A_B.
    """
    s = tampo_episode_sums(ell, episode_advantages, list(range(ell.shape[-1])), norm, norm_tau, n_tokens)
    return torch.tensor(s["adv_sum"], dtype=torch.float64) / max(s["episodes"], 1)


TAMPO_SUM_PREFIX = "tampo_sum/"
"""Prefix of the learner's additive TAMPO metrics (summed over learner ranks, turned into A_B by the driver)."""


def tampo_sum_metrics(sums: dict[str, Any], temps: list[float] | tuple[float, ...]) -> dict[str, float]:
    """Flat ``tampo_sum/*`` metrics (python floats) of :func:`tampo_episode_sums`, so that a data-parallel run can
    add its ranks' values key by key: ``tampo_sum/adv/<T>``, ``tampo_sum/episodes``, ``tampo_sum/tstar_pos_sum``,
    ``tampo_sum/tstar_pos_n``, ``tampo_sum/tstar_neg_sum``, ``tampo_sum/tstar_neg_n``, ``tampo_sum/nonfinite``."""
    out = {f"{TAMPO_SUM_PREFIX}adv/{float(t):g}": float(a) for t, a in zip(temps, sums["adv_sum"])}
    out.update({f"{TAMPO_SUM_PREFIX}{k}": float(sums[k]) for k in ("episodes", "tstar_pos_sum", "tstar_pos_n",
                                                                   "tstar_neg_sum", "tstar_neg_n", "nonfinite")})
    return out


def tampo_meta_policy(ema: list[float] | Tensor) -> list[float]:
    """pi from the EMA E (algorithms.md 8.6): uniform if ``max E - min E < 1e-12``, else min-max normalised
    ``(E - min E) / (max E - min E)`` divided by its sum (the lowest candidate gets 0).

    Example: E = [0.010, -0.020, 0.030] -> (E - min E) / 0.05 = [0.6, 0, 1] -> pi = [0.375, 0, 0.625].

    Args:
        ema: K floats.
    Returns:
        K floats summing to 1.
    """
    e = [float(x) for x in (ema.tolist() if isinstance(ema, Tensor) else ema)]
    lo, hi = min(e), max(e)
    if hi - lo < _FLAT:
        return [1.0 / len(e)] * len(e)
    t = [(x - lo) / (hi - lo) for x in e]
    s = sum(t)
    return [x / s for x in t]


def tampo_nucleus(pi: list[float], top_p: float) -> list[float]:
    """The tie-inclusive nucleus of pi (algorithms.md 8.7), renormalised: sort descending (ties to the lower T first),
    m = the first candidate at which the running sum reaches ``top_p``, keep every candidate with ``pi >= pi_m`` and
    ``pi > 0`` (a uniform pi keeps all). ``top_p = 0``: greedy, the argmax alone (ties to the lower T).

    Args:
        pi: K probabilities (candidates ascending in T). top_p: in [0, 1].
    Returns:
        K floats, 0 outside the nucleus, summing to 1.
    Raises:
        ValueError: ``top_p`` outside [0, 1].
    """
    if not 0.0 <= top_p <= 1.0:
        raise ValueError(f"algo.tampo.top_p={top_p} must be in [0, 1]")
    order = sorted(range(len(pi)), key=lambda i: (-pi[i], i))
    if top_p == 0.0:
        keep = {order[0]}
    else:
        run, m = 0.0, order[-1]
        for i in order:
            run += pi[i]
            if run >= top_p - _CUM_TOL:
                m = i
                break
        keep = {i for i in range(len(pi)) if pi[i] >= pi[m] and pi[i] > 0}
    s = sum(pi[i] for i in keep)
    return [pi[i] / s if i in keep else 0.0 for i in range(len(pi))]


def tampo_draw(nucleus: list[float], temps: list[float], u: float) -> float:
    """The temperature that ``u`` in [0, 1) draws through the CDF of ``nucleus`` in ascending T (algorithms.md 8.7):
    the first candidate whose cumulative mass exceeds u (the last kept one if rounding leaves u above the total)."""
    run, last = 0.0, None
    for p, t in zip(nucleus, temps):
        if p <= 0:
            continue
        run += p
        last = t
        if u < run:
            return float(t)
    return float(last)


def _entropy(p: list[float]) -> float:
    return float(-sum(x * math.log(x) for x in p if x > 0))


class TampoMetaPolicy:
    """The driver's TAMPO state (algorithms.md 8.5-8.8): the EMA E of the batch statistic per candidate, the meta RNG
    (``random.Random`` seeded from the run seed, one ``u`` per draw) and the draws made so far.

    One step s: :meth:`temperature` (before the collect: idempotent, so every group of the step, DAPO's extra rounds
    and a producer ahead under ``trainer.max_staleness`` included, shares T_s; with ``scope=group``,
    :meth:`group_temperature` draws per group) -> the step trains -> :meth:`observe` (once per RL step, never per
    mini-batch) with the summed learner statistics of the step's batch -> the EMA moves, pi for the next draw.
    :meth:`state_dict` holds everything a resumed run needs to draw what an uninterrupted one would.

    Args:
        temps: ``algo.tampo.temps`` (strictly increasing, > 0). ema_alpha: in (0, 1]. top_p: in [0, 1].
        seed: the run seed. warmup_steps: W >= 0 steps drawn uniformly first. scope: ``step`` | ``group``.
    Raises:
        ValueError: bad candidates, alpha, top_p, warm-up or scope.
    """

    def __init__(self, temps: list[float], *, ema_alpha: float = 0.05, top_p: float = 0.7, seed: int = 0,
                 warmup_steps: int = 0, scope: str = "step") -> None:
        self.temps = [float(t) for t in temps]
        if not self.temps or any(t <= 0 for t in self.temps) or any(b <= a for a, b in zip(self.temps,
                                                                                             self.temps[1:])):
            raise ValueError(f"algo.tampo.temps={self.temps} must be a non-empty, strictly increasing list of "
                             "temperatures > 0")
        if not 0.0 < ema_alpha <= 1.0 or not 0.0 <= top_p <= 1.0 or warmup_steps < 0 or scope not in TAMPO_SCOPES:
            raise ValueError(f"algo.tampo: ema_alpha={ema_alpha} must be in (0, 1], top_p={top_p} in [0, 1], "
                             f"warmup_steps={warmup_steps} >= 0, scope={scope!r} one of {TAMPO_SCOPES}")
        self.alpha, self.top_p, self.warmup_steps, self.scope = float(ema_alpha), float(top_p), int(warmup_steps), scope
        self.ema = [0.0] * len(self.temps)
        self.rng = random.Random(int(seed))
        #: (step, group or -1) -> [T drawn, pi it was drawn from, nucleus size]
        self._draws: dict[tuple[int, int], list[Any]] = {}

    # ------------------------------------------------------------------ drawing
    def pi(self, step: int) -> list[float]:
        """pi the draws of 1-based ``step`` use: uniform in warm-up, else :func:`tampo_meta_policy` of E."""
        return [1.0 / len(self.temps)] * len(self.temps) if step <= self.warmup_steps else tampo_meta_policy(self.ema)

    def _draw(self, step: int, group: int) -> float:
        key = (int(step), int(group))
        if key not in self._draws:
            pi = self.pi(step)
            nucleus = tampo_nucleus(pi, self.top_p)
            t = tampo_draw(nucleus, self.temps, self.rng.random())
            self._draws[key] = [t, pi, sum(1 for p in nucleus if p > 0)]
        return self._draws[key][0]

    def temperature(self, step: int) -> float:
        """T_s of 1-based ``step`` (``scope=step``; drawn once, then the same every call)."""
        return self._draw(step, -1)

    def group_temperature(self, step: int, group: int) -> float:
        """``scope=group``: the T of the ``group``-th group started in ``step`` (drawn once per (step, group))."""
        return self._draw(step, group)

    def draw_metrics(self, step: int) -> dict[str, float]:
        """``tampo/t``, ``tampo/pi/<T>``, ``tampo/pi_entropy``, ``tampo/nucleus_size`` of ``step``'s draw (with
        ``scope=group``: the mean T of its groups, the pi and nucleus of its first draw)."""
        draws = [v for (s, _), v in sorted(self._draws.items()) if s == step]
        if not draws:
            return {}
        pi = draws[0][1]
        out = {"tampo/t": sum(d[0] for d in draws) / len(draws), "tampo/pi_entropy": _entropy(pi),
               "tampo/nucleus_size": float(draws[0][2])}
        out.update({f"tampo/pi/{t:g}": p for t, p in zip(self.temps, pi)})
        return out

    # ------------------------------------------------------------------ the update
    def observe(self, adv_sum: list[float], episodes: int) -> list[float]:
        """One RL step's update (8.4-8.5): ``A_B = adv_sum / N``, ``E <- (1 - alpha) E + alpha A_B``. A step with
        N = 0 (nothing trained) changes nothing. Returns A_B (K floats)."""
        if episodes <= 0:
            return [0.0] * len(self.temps)
        if len(adv_sum) != len(self.temps):
            raise ValueError(f"adv_sum has {len(adv_sum)} entries, algo.tampo.temps {len(self.temps)}")
        a_b = [float(x) / episodes for x in adv_sum]
        self.ema = [(1 - self.alpha) * e + self.alpha * a for e, a in zip(self.ema, a_b)]
        return a_b

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the candidates, E, the meta RNG state and the draws."""
        version, internal, gauss = self.rng.getstate()
        return {"temps": list(self.temps), "ema": list(self.ema),
                "rng": [version, list(internal), gauss],
                "draws": [[s, g, t, pi, n] for (s, g), (t, pi, n) in sorted(self._draws.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        Raises:
            ValueError: the state was saved with other candidates (a resumed run must draw from the same ones).
        """
        temps = [float(t) for t in state["temps"]]
        if temps != self.temps:
            raise ValueError(f"the TAMPO state was saved with algo.tampo.temps={temps}, this run has {self.temps}")
        self.ema = [float(x) for x in state["ema"]]
        version, internal, gauss = state["rng"]
        self.rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
        self._draws = {(int(s), int(g)): [float(t), [float(p) for p in pi], int(n)]
                       for s, g, t, pi, n in state["draws"]}


def parse_temperature_schedule(spec: str) -> tuple[str, float, float, int | None] | None:
    """``rollout.temperature_schedule``: ``""`` (off) or ``linear:T_start:T_end[:steps]`` (algorithms.md 8, the GRPO
    ablation "a linear schedule 0.9 -> 1.5 over the run"). ``steps`` is the schedule's length (T_end from that step
    on); without it the run's ``trainer.total_steps``. A run trained in chunks (``trainer.total_steps`` raised at each
    resume, as ``benchmarks/bench_learning.py`` does) must give it, or each chunk would stretch the line to its own
    end.

    Returns:
        None (off) or ``("linear", T_start, T_end, steps or None)``.
    Raises:
        ValueError: another form, a temperature <= 0, steps < 1.
    """
    if not spec:
        return None
    parts = str(spec).split(":")
    try:
        if len(parts) in (3, 4) and parts[0] == "linear":
            a, b = float(parts[1]), float(parts[2])
            steps = int(parts[3]) if len(parts) == 4 else None
            if a > 0 and b > 0 and (steps is None or steps >= 1):
                return "linear", a, b, steps
    except ValueError:
        pass
    raise ValueError(f"rollout.temperature_schedule={spec!r} is not valid: give '' (off) or "
                     "linear:T_start:T_end[:steps] (temperatures > 0, steps >= 1), e.g. linear:0.9:1.5 or "
                     "linear:0.9:1.5:8")


def scheduled_temperature(spec: tuple[str, float, float, int | None], step: int, total_steps: int) -> float:
    """The temperature of 1-based ``step`` under a parsed schedule: linear from T_start at step 1 to T_end at step
    ``steps`` (the spec's, else ``total_steps``), T_end after it (T_start throughout a one-step schedule)."""
    _, a, b, steps = spec
    n = steps if steps is not None else total_steps
    frac = 0.0 if n <= 1 else min(max((step - 1) / (n - 1), 0.0), 1.0)
    return a + (b - a) * frac

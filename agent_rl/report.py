"""End-of-run report from ``DIR/metrics.jsonl`` (read by row kind: :func:`agent_rl.logging.read_metrics`):
``DIR/curves.png`` (reward, success train and eval, entropy, clip fraction, ``tgrl/delta_R``, JS mean, per step) and
``DIR/summary.md`` (training steps, episodes, eval success before -> after, the last training step's numbers);
:func:`finish_run` writes both and returns the console summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agent_rl.logging import NO_SIGNAL, read_metrics, row_phase

CURVES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("success", ("success/rate",)),  # + every eval/<panel>/success
    ("entropy", ("actor/entropy",)),
    ("clip fraction", ("actor/clipfrac",)),
    ("tgrl/delta_R", ("tgrl/delta_R",)),
    ("JS mean", ("credit/js_mean",)),
)
#: the temperature a run chose per step: TGRL's T1 (picked under ``algo.t_high=auto``), TAMPO's draw, a schedule's value
TEMPERATURE_KEYS = ("tgrl/t_high", "tampo/t", "rollout/temperature")
TABLE_KEYS = ("reward/mean", "success/rate", "tgrl/delta_R", "actor/entropy", "actor/clipfrac", "actor/approx_kl",
              "credit/js_mean", "episode/turns_mean", "episode/invalid_action_frac", "throughput/tokens_per_s",
              "time/rollout_s", "time/update_s")


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def eval_success_keys(records: list[dict[str, Any]]) -> list[str]:
    """``eval/<panel>/success`` keys present in the ``eval`` rows of ``records``."""
    keys = {k for r in records if r.get("kind") == "eval" for k in r
            if k.startswith("eval/") and k.endswith("/success") and k.count("/") == 2}
    return sorted(keys)


def write_curves(records: list[dict[str, Any]], path: Path) -> None:
    """Six panels of per-step curves from the rows of :func:`read_metrics` (training metrics from ``train`` rows,
    eval success from ``eval`` rows; a missing metric leaves its panel empty, titled "n/a")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (title, keys) in zip(axes.flat, CURVES):
        keys = keys + (tuple(eval_success_keys(records)) if title == "success" else ())
        drawn = False
        for key in keys:
            xs, ys = _series([r for r in records if r.get("kind") == ("eval" if key.startswith("eval/") else "train")],
                             key)
            if xs:
                label = "train" if key == "success/rate" else key.split("/")[1] if key.startswith("eval/") else key
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
                drawn = True
        ax.set_title(title if drawn else f"{title} (n/a)", fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        if drawn and title == "success":
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summarize_run(records: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Training steps (``train`` rows), episodes, eval success before (first ``eval`` row) -> after (last) per
    panel, the last training step's numbers. ``records``: the rows of :func:`read_metrics`."""
    steps = [r for r in records if r.get("kind") == "train"]
    evals = {}
    for key in eval_success_keys(records):
        xs, ys = _series([r for r in records if r.get("kind") == "eval"], key)
        evals[key.split("/")[1]] = {"before": ys[0], "after": ys[-1], "first_step": xs[0], "last_step": xs[-1]}
    return {
        "run_dir": str(out),
        "steps": len(steps),
        "sft_steps": sum(r.get("kind") == "sft" for r in records),
        "episodes": int(sum(r.get("rollout/episodes") or 0 for r in steps)),
        "eval": evals,
        "panels": panel_history(records),
        "rounds": warm_start_rounds(records),
        "signal": learning_signal(steps),
        "rollouts": {k: [steps[0].get(k), steps[-1].get(k)] if steps else [None, None]
                     for k in ("success/rate", "episode/invalid_action_frac")},
        "last": {k: steps[-1].get(k) for k in TABLE_KEYS} if steps else {},
        # per step, only for the keys whose value moves over the run or is chosen by a rule (a fixed T1 logs one
        # value every step: still shown, one number)
        "temperatures": {k: list(zip(*_series(steps, k))) for k in TEMPERATURE_KEYS if _series(steps, k)[0]},
        # TGRL's calibration probe (algo.calibration=probe): its row, when the run has one
        "calibration": next((r for r in reversed(records) if r.get("kind") == "calibration"), None),
    }


def warm_start_rounds(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The warm start's rounds (``sft`` rows by ``round``; rows without one are round 0), in order: ``round``,
    ``steps`` (first, last), ``episodes`` (round 0: the expert's ``collect/episodes``; later: ``dagger/episodes``,
    of which ``expert_episodes`` by the expert), ``labels`` (``dagger/labels``; None in round 0, which clones the
    expert's whole episodes), ``dropped`` (labels the expert gave up on), ``policy_success`` (the policy's own episodes
    of the round won), ``loss`` (the last step's ``sft/loss``), ``panel`` (each panel's success at the round's last
    step, when it was evaluated)."""
    rounds: dict[int, dict[str, Any]] = {}
    evals = {int(r["step"]): r for r in records if r.get("kind") == "eval" and row_phase(r) == "warm_start"}
    for r in records:
        if r.get("kind") != "sft":
            continue
        i = int(r.get("round") or 0)
        cur = rounds.setdefault(i, {"round": i, "steps": [int(r["step"]), int(r["step"])], "episodes": None,
                                    "expert_episodes": None, "labels": None, "dropped": None,
                                    "policy_success": None, "loss": None, "panel": {}})
        cur["steps"][1] = int(r["step"])
        cur["loss"] = r.get("sft/loss", cur["loss"])
        for key, name in (("collect/episodes", "episodes"), ("dagger/episodes", "episodes"),
                          ("dagger/expert_episodes", "expert_episodes"),
                          ("dagger/labels", "labels"), ("dagger/labels_dropped", "dropped"),
                          ("dagger/policy_success", "policy_success")):
            if isinstance(r.get(key), (int, float)):
                cur[name] = r[key]
    for cur in rounds.values():
        ev = evals.get(cur["steps"][1], {})
        cur["panel"] = {k.split("/")[1]: v for k, v in ev.items() if k.endswith("/success") and k.startswith("eval/")}
    return [rounds[i] for i in sorted(rounds)]


def rounds_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """The summary's table of the warm start's rounds (none for a run without one)."""
    if not rounds:
        return []
    lines = ["| warm-start round | steps | episodes (by the expert) | labels (dropped: expert gave up) | "
             "policy won | last sft/loss | panel success |", "|---|---|---|---|---|---|---|"]
    for r in rounds:
        eps = "-" if r["episodes"] is None else f"{r['episodes']:.0f}" + (
            f" ({r['expert_episodes']:.0f})" if r["expert_episodes"] is not None else " (expert)")
        labels = "-" if r["labels"] is None else f"{r['labels']:.0f}" + (
            f" ({r['dropped']:.0f})" if r["dropped"] is not None else "")
        panel = ", ".join(f"{name} {_pct(v)}" for name, v in r["panel"].items()) or "-"
        what = "0 (clone the expert)" if r["round"] == 0 else f"{r['round']} (DAgger)"
        lines.append(f"| {what} | {r['steps'][0]}-{r['steps'][1]} | {eps} | {labels} | {_pct(r['policy_success'])} | "
                     f"{_fmt(r['loss'])} | {panel} |")
    return lines + [""]


def panel_history(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per panel, every evaluation in run order: ``phase`` (``agent_rl.logging.PHASES``), ``step``, ``success``,
    ``invalid_action_rate`` (None when not logged)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key in eval_success_keys(records):
        panel = key.split("/")[1]
        for r in records:
            if r.get("kind") == "eval" and isinstance(r.get(key), (int, float)):
                out.setdefault(panel, []).append({"phase": row_phase(r), "step": int(r["step"]), "success": r[key],
                                                  "invalid_action_rate": r.get(f"eval/{panel}/invalid_action_rate")})
    return out


def learning_signal(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the ``train`` rows: how many had a learning signal (some group with unequal rewards:
    ``rollout/groups_equal_frac`` < 1), how many had none (:data:`agent_rl.logging.NO_SIGNAL`: every group's
    rewards equal), and how many updated (``actor/grad_norm`` > 0)."""
    known = [r for r in steps
             if isinstance(r.get("rollout/groups_equal_frac"), (int, float)) and r.get("rollout/groups")]
    none = sum(r["rollout/groups_equal_frac"] >= 1.0 for r in known)
    grad = sum(isinstance(r.get("actor/grad_norm"), (int, float)) and r["actor/grad_norm"] > 0 for r in steps)
    mixed = [r for r in known if isinstance(r.get("rollout/groups_mixed_success_frac"), (int, float))]
    return {"steps": len(steps), "measured": len(known), "with_signal": len(known) - none, "no_signal": none,
            "grad_norm_positive": grad,
            "with_success_signal": sum(r["rollout/groups_mixed_success_frac"] > 0 for r in mixed) if mixed else None}


def signal_line(signal: dict[str, Any]) -> str:
    """The summary's ``learning signal:`` line."""
    n, known, none = signal["steps"], signal["measured"], signal["no_signal"]
    if not n:
        return "learning signal: no RL step ran"
    text = (f"learning signal: {signal['with_signal']} of {known} RL step(s) had a group with unequal rewards; "
            f"{none} of {known} ({none / max(known, 1):.0%}) had {NO_SIGNAL}; actor/grad_norm > 0 in "
            f"{signal['grad_norm_positive']} of {n}")
    if signal.get("with_success_signal") is not None and signal["with_signal"]:
        text += (f"; {signal['with_success_signal']} of {known} had a group with both won and lost episodes (the "
                 "rest of the signal is reward shaping, e.g. rollout.invalid_penalty)")
    if known and none == known:
        text += f" -- this run trained nothing: {NO_SIGNAL} at every step"
    return text


def _pct(v: Any) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{100 * v:.0f}%"


def what_happened(summary: dict[str, Any]) -> str:
    """The summary's short "what happened" paragraph: each panel's success (and invalid actions) before the warm
    start, after it and after RL, the training rollouts' first -> last step, the learning-signal steps."""
    labels = {("warm_start", True): "before the warm start",
              ("warm_start", False): "after the warm start ({n} cloning steps)",
              ("rl", True): "before RL", ("rl", False): "after RL step {step}"}
    parts = []
    ends = {r["steps"][1]: r["round"] for r in summary.get("rounds", [])}  # a round's last step -> the round
    for panel, evals in summary["panels"].items():
        seen = []
        for e in evals:
            label = labels[(e["phase"], e["step"] == 0)].format(n=e["step"], step=e["step"])
            if e["phase"] == "warm_start" and e["step"] in ends and len(ends) > 1:  # a panel per round
                label = f"after warm-start round {ends[e['step']]} (step {e['step']})"
            seen.append(f"{_pct(e['success'])} {label} (invalid actions {_pct(e['invalid_action_rate'])})")
        parts.append(f"the {panel} panel: " + " -> ".join(seen))
    ro = summary["rollouts"]
    if summary["steps"]:
        parts.append(f"training rollouts, RL step 1 -> {summary['steps']}: success {_pct(ro['success/rate'][0])} -> "
                     f"{_pct(ro['success/rate'][1])}, invalid actions {_pct(ro['episode/invalid_action_frac'][0])} -> "
                     f"{_pct(ro['episode/invalid_action_frac'][1])}")
    s = summary["signal"]
    if s["measured"]:
        parts.append(f"{s['with_signal']} of {s['measured']} RL steps had a learning signal")
    return "What happened: " + "; ".join(parts) + "." if parts else "What happened: nothing was logged."


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def calibration_lines(row: dict[str, Any] | None) -> list[str]:
    """The calibration probe's lines of ``summary.md`` (algorithms.md 3b): the chosen pair and the probe's size,
    then every pair's statistics and score as a table; [] without a ``calibration`` row."""
    if not row:
        return []
    c = row["chosen"]
    head = (f"- calibration: T0={c['t_low']:g}, T1={c['t_high']:g} chosen by the probe ({row.get('episodes', 0)} "
            f"episode(s) on {len(row.get('tasks') or [])} task(s), {row.get('wall_s', 0.0):.0f} s, never trained on)")
    if row.get("filter") == "kept":
        head += f"; medium filter: {len(row.get('kept_tasks') or [])} task(s) kept"
    elif row.get("filter") == "fallback":
        head += "; medium filter: none qualified, every task kept"
    table = ["", "| T_low | T_high | gain_std | pos | var | ext | elig | score | chosen |", "|---|---|---|---|---|---|---|---|---|"]
    for p in row["pairs"]:
        mark = "yes" if (p["t_low"], p["t_high"]) == (c["t_low"], c["t_high"]) else ""
        table.append(f"| {p['t_low']:g} | {p['t_high']:g} | {p['gain_std']:.3f} | {p['pos']:.3f} | {p['var']:.3f} | "
                     f"{p['ext']:.3f} | {p['elig']:.3f} | {p['score']:.3f} | {mark} |")
    return [head, *table, ""]


def write_summary(summary: dict[str, Any], path: Path, header: str = "") -> str:
    """``summary.md``; returns its text."""
    lines = [f"# Run summary: {summary['run_dir']}", ""]
    if header:
        lines += [header, ""]
    lines += [what_happened(summary), "", signal_line(summary["signal"]), ""]
    lines += rounds_lines(summary.get("rounds", []))
    lines += [f"- steps: {summary['steps']}", f"- episodes: {summary['episodes']}"]
    if summary.get("sft_steps"):
        lines.append(f"- warm-start (behaviour cloning) steps: {summary['sft_steps']}")
    for panel, e in summary["eval"].items():
        lines.append(f"- eval {panel}: success {100 * e['before']:.1f}% (step {e['first_step']}) -> "
                     f"{100 * e['after']:.1f}% (step {e['last_step']})")
    for key, pairs in summary.get("temperatures", {}).items():
        values = {round(t, 6) for _, t in pairs}
        per_step = ", ".join(f"{s}: {t:g}" for s, t in pairs) if len(values) > 1 else f"{pairs[0][1]:g} every step"
        lines.append(f"- temperature per step ({key}): {per_step}")
    lines += calibration_lines(summary.get("calibration"))
    lines += ["- curves: curves.png; per-step numbers: metrics.jsonl; TensorBoard: tb/", "",
              "| metric (last step) | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in summary["last"].items()]
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def finish_run(out: Path, header: str = "") -> str:
    """Write ``out/curves.png`` and ``out/summary.md`` from ``out/metrics.jsonl``; returns a short console summary."""
    records = read_metrics(out / "metrics.jsonl")
    summary = summarize_run(records, out)
    if records:
        write_curves(records, out / "curves.png")
    write_summary(summary, out / "summary.md", header)
    parts = [f"done: {summary['steps']} step(s), {summary['episodes']} episodes"]
    for panel, e in summary["eval"].items():
        parts.append(f"eval {panel} success {100 * e['before']:.1f}% -> {100 * e['after']:.1f}%")
    r = summary["last"].get("reward/mean")
    if r is not None:
        parts.append(f"last reward {r:.3f}")
    if summary["signal"]["measured"]:
        parts.append(signal_line(summary["signal"]))
    parts.append(f"run dir {out} (summary.md, curves.png)")
    return "; ".join(parts)

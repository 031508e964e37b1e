"""agent_rl against TRL's GRPOTrainer on the same machine, model, tasks, prompt ids, shape and reward (a benchmark,
not a test; SmolLM2 at the default shape takes ~15-30 minutes a side on 2 loaded CPU cores).

    python benchmarks/bench_vs_trl.py --model tiny --steps 1 --out /tmp/vs_trl            # plumbing, ~1 minute
    nice python benchmarks/bench_vs_trl.py --model smollm2 --steps 2 --repeats 2 \\
        --max-new-tokens 128 --trl-python /work/.venv-trl/bin/python --out /tmp/vs_trl      # the published table

TRL is an optional benchmark dependency (``pip install agent_rl[bench-trl]``, or a venv of its own: TRL may move
transformers or torch), never imported by the package. Each side runs in a process of its own (``--side``, started by
this script), so its peak memory is its own; the TRL side runs under ``--trl-python`` (default: this interpreter when
it has ``trl``). Runs alternate A B A B (``--repeats`` pairs) and the ratio is taken pair by pair, so a drift of the
machine's speed moves both sides of a pair together.

The same on both sides:

- model: the parent saves ``--model`` (``agent_rl.models.load_policy``: ``tiny``'s seeded random weights, SmolLM2's
  fp32 conversion, or a path) to ``OUT/model`` in float32 and both sides load that folder;
- tasks: the first ``--prompts`` MATH training problems (``envs.math``'s ``math_train``) with the env's instruction,
  one user message each; the prompt ids are those of the tokenizer's chat template with the generation prompt, and
  the TRL side records the ids its own ``_tokenize_prompts`` made: the parent checks they are equal;
- shape: ``--group`` completions per prompt at T = 1 (no top-k / top-p), at most ``--max-new-tokens`` each (EOS ends
  one early), one optimiser step per step (one mini-batch, one epoch), lr ``--lr``, no KL, no weight decay, gradient
  clip 1.0, constant learning rate, token-mean loss (TRL's ``dapo`` loss type), group-normalised advantages;
- reward: ``math`` mode: the project's grader (``envs.math.score_response`` with its math-verify pool) on both sides;
  ``signal`` mode (default): that reward plus (distinct characters of the completion) / 100, which differs between
  the completions of a group, so every step has a learning signal and the update is compared, not skipped.

Per side and step: ``step_s`` (wall), ``generate_s`` (sampling and reward: agent_rl's ``HFEngine.generate`` and the
grader; TRL's ``_generate_and_score_completions``), ``update_s`` (the rest of the step: agent_rl's
``Learner.update``; TRL's loss, backward and optimiser step), ``cpu_s`` (the process's CPU seconds over the step, all
threads), ``tokens`` (completion tokens), ``tokens_per_s`` and ``tokens_per_cpu_s`` of generation, and per run
``peak_rss_gb`` (the process's maximum resident set). ``results.json`` holds per side the medians over every step
of every run (first step of each run included: both sides pay it), the per-run lists, the load average before and
after, and ``ratio_step`` (agent_rl / TRL: the median of the per-pair ratios of median step times, with the min and
max as the spread). The orchestrator and env servers of a full agent_rl run are not in the agent_rl side (TRL has
none): the step is the engine, the reward and the learner, as the local backend runs them.

Precision: both sides load the saved float32 weights. ``--engine-dtype bfloat16`` makes agent_rl's engine sample
with a bfloat16 copy of them (``engine.dtype``, synced after each update) while its learner trains the float32
weights; ``--trl-dtype bfloat16`` loads TRL's model in bfloat16, which it then samples and trains in (TRL's
generation uses the trained model itself). ``generate_cpu_s`` is measured over each side's generation-and-reward
span; ``tokens_per_cpu_s`` = tokens / generate_cpu_s, and ``engine_logprob_diff`` (agent_rl) is the learner's mean
|old - engine| log-prob: the rounding gap a bfloat16 engine adds.

Multi-turn: the TRL side reports whether TRL can train a tool task with this model (``environment_factory`` needs a
chat template with a tools branch: ``trl.chat_template_utils.supports_tool_calling``), and the reason when not;
``results.json["multi_turn"]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def _distinct_chars_bonus(text: str) -> float:
    return len(set(text)) / 100.0


def make_reward(mode: str):
    """``reward(completion_text, answer, problem) -> float`` of ``mode`` (module docstring) and its pool (close it)."""
    from envs.math import VerifierPool, score_response

    pool = VerifierPool(n_workers=1)

    def reward(text: str, answer: str, problem: str) -> float:
        r = float(score_response(answer, text, pool, question=problem)["reward"])
        return r + _distinct_chars_bonus(text) if mode == "signal" else r

    return reward, pool


def math_tasks(tok: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` MATH training problems as one user message each (the env's instruction appended) and their
    prompt ids (the tokenizer's chat template with the generation prompt)."""
    from envs.math import DEFAULT_INSTRUCTION, load_math

    tasks = []
    for p in load_math("math_train", "train")[:n]:
        messages = [{"role": "user", "content": f"{p.problem}\n\n{DEFAULT_INSTRUCTION}"}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        tasks.append({"uid": p.uid, "problem": p.problem, "answer": p.answer, "messages": messages,
                      "prompt_ids": [int(i) for i in ids]})
    return tasks


def build_spec(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Save the model and write the tasks every side reads (``OUT/spec.json``)."""
    import torch

    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy

    torch.manual_seed(args.seed)
    cfg = ModelConfig(name=args.model) if not Path(args.model).exists() else ModelConfig(name="path", path=args.model)
    model, tok = load_policy(cfg)
    model_dir = out / "model"
    model.float().save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    tasks = math_tasks(tok, args.prompts)
    spec = {"model_dir": str(model_dir), "model": args.model, "tasks": tasks, "group": args.group,
            "max_new_tokens": args.max_new_tokens, "lr": args.lr, "steps": args.steps, "mode": args.mode,
            "seed": args.seed, "threads": args.threads, "trl_dtype": args.trl_dtype}
    (out / "spec.json").write_text(json.dumps(spec))
    return spec


# ----------------------------------------------------------------------------------------------------------------
# agent_rl side
# ----------------------------------------------------------------------------------------------------------------
def run_agent_rl(spec: dict[str, Any], engine_dtype: str = "") -> dict[str, Any]:
    """``spec["steps"]`` agent_rl steps: ``HFEngine.generate`` + reward, then ``Learner.update`` (GRPO), the engine
    in ``engine_dtype`` ("" or float32: the learner's module itself; bfloat16: a cast copy, synced each update)."""
    import torch

    from agent_rl.engines import HFEngine, row_seed
    from agent_rl.learner import AlgoConfig, Learner, OptimConfig
    from agent_rl.learner.config import ModelConfig
    from agent_rl.models import load_policy
    from agent_rl.types import RolloutBatch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    model, tok = load_policy(ModelConfig(name="path", path=spec["model_dir"]))
    learner = Learner(model, tok, AlgoConfig(name="grpo", loss_agg="token_mean"),
                      OptimConfig(lr=spec["lr"], weight_decay=0.0, warmup=0, max_grad_norm=1.0),
                      seed=spec["seed"], sampler_rounds=bool(engine_dtype) and engine_dtype != "float32")
    engine = HFEngine(learner.model, tok, batch_size=len(spec["tasks"]) * spec["group"], dtype=engine_dtype or None)
    reward, pool = make_reward(spec["mode"])
    g = spec["group"]
    rows = [(t, k) for t in spec["tasks"] for k in range(g)]  # prompt-major: the G completions of a prompt together
    pad = tok.pad_token_id
    steps = []
    try:
        for step in range(1, spec["steps"] + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            gens = engine.generate([t["prompt_ids"] for t, _ in rows], [1.0] * len(rows),
                                   max_new_tokens=spec["max_new_tokens"],
                                   row_seeds=[row_seed(spec["seed"] * 1000 + step, i) for i in range(len(rows))])
            rewards = [reward(gen.text, t["answer"], t["problem"]) for (t, _), gen in zip(rows, gens)]
            t1, c_gen = time.perf_counter(), time.process_time()
            seq = max(len(t["prompt_ids"]) + len(gen.token_ids) for (t, _), gen in zip(rows, gens))
            n = len(rows)
            input_ids = torch.full((n, seq), pad, dtype=torch.long)
            attention_mask = torch.zeros(n, seq, dtype=torch.long)
            response_mask = torch.zeros(n, seq)
            engine_logprobs = torch.zeros(n, seq)
            for i, ((t, _), gen) in enumerate(zip(rows, gens)):  # right-padded rows: prompt + response
                p = t["prompt_ids"]
                end = len(p) + len(gen.token_ids)
                input_ids[i, :end] = torch.tensor(p + gen.token_ids)
                attention_mask[i, :end] = 1
                response_mask[i, len(p):end] = 1
                engine_logprobs[i, len(p):end] = torch.tensor(gen.logprobs)
            group = torch.arange(n) // g  # (B,) one group per prompt
            r = torch.tensor(rewards, dtype=torch.float32)
            batch = RolloutBatch(
                input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
                engine_logprobs=engine_logprobs, temperature=torch.ones(n), group_index=group,
                episode_index=torch.arange(n), is_high=torch.ones(n, dtype=torch.bool),
                turn_index=torch.zeros(n, dtype=torch.long), num_turns=torch.ones(n, dtype=torch.long),
                rewards=r, episode_rewards=r, episode_group_index=group,
                episode_is_high=torch.ones(n, dtype=torch.bool))
            metrics = learner.update(batch, step=step, total_steps=spec["steps"])
            engine.sync_weights(learner.model, step)  # the updated weights into the engine (a copy: cast, copied)
            t2, c1 = time.perf_counter(), time.process_time()
            tokens = sum(len(gen.token_ids) for gen in gens)
            steps.append({"step_s": t2 - t0, "generate_s": t1 - t0, "update_s": t2 - t1, "cpu_s": c1 - c0,
                          "generate_cpu_s": c_gen - c0, "tokens": tokens, "reward_mean": float(r.mean()),
                          "engine_logprob_diff": metrics.get("actor/engine_logprob_diff"),
                          "grad_norm": metrics["actor/grad_norm"], "single_pass": metrics["actor/single_pass"],
                          "trained_token_frac": metrics["credit/trained_token_frac"]})
    finally:
        pool.close()
    return {"steps": steps, "peak_rss_gb": _peak_rss_gb(),
            "prompt_ids": [t["prompt_ids"] for t in spec["tasks"]]}


# ----------------------------------------------------------------------------------------------------------------
# TRL side
# ----------------------------------------------------------------------------------------------------------------
def run_trl(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """``spec["steps"]`` steps of TRL's GRPOTrainer on the same model, prompts, shape and reward."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import supports_tool_calling

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    trl_dtype = spec.get("trl_dtype") or "float32"  # TRL samples and trains in one dtype
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=getattr(torch, trl_dtype))
    reward, pool = make_reward(spec["mode"])
    by_problem = {t["problem"]: t for t in spec["tasks"]}
    tasks = spec["tasks"]
    data = Dataset.from_list([{"prompt": t["messages"], "problem": t["problem"], "answer": t["answer"]}
                              for t in tasks])

    def reward_fn(prompts, completions, problem, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(text, a, p) for text, a, p in zip(texts, answer, problem)]

    seen_prompt_ids: list[list[int]] = []
    timing: dict[str, float] = {}

    class Timed(GRPOTrainer):
        def _tokenize_prompts(self, prompts):
            out = super()._tokenize_prompts(prompts)
            seen_prompt_ids.extend([int(i) for i in ids] for ids in out[0])
            return out

        def _generate_and_score_completions(self, inputs):
            t0, c0 = time.perf_counter(), time.process_time()
            out = super()._generate_and_score_completions(inputs)
            timing["generate_s"] = time.perf_counter() - t0
            timing["generate_cpu_s"] = time.process_time() - c0
            timing["tokens"] = float(out["completion_mask"].sum())
            return out

    steps: list[dict[str, float]] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timing.clear()
            timing["t0"], timing["c0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - timing["t0"]
            steps.append({"step_s": step_s, "generate_s": timing["generate_s"],
                          "update_s": step_s - timing["generate_s"], "cpu_s": time.process_time() - timing["c0"],
                          "generate_cpu_s": timing["generate_cpu_s"], "tokens": timing["tokens"]})

    n = len(tasks) * spec["group"]
    config = GRPOConfig(
        output_dir=str(work / "trl_out"), per_device_train_batch_size=n, gradient_accumulation_steps=1,
        num_generations=spec["group"], max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0,
        learning_rate=spec["lr"], beta=0.0, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant",
        warmup_steps=0, loss_type="dapo", num_iterations=1, max_steps=spec["steps"], logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=spec["seed"], disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = Timed(model=model, reward_funcs=reward_fn, args=config, train_dataset=data, processing_class=tok,
                    callbacks=[StepClock()])
    try:
        trainer.train()
    finally:
        pool.close()
    by_ids = {}
    for ids in seen_prompt_ids:  # TRL's rows repeat each prompt G times, in its sampler's order
        by_ids[tuple(ids)] = ids
    tool_ok = bool(supports_tool_calling(tok))
    return {"steps": steps, "peak_rss_gb": _peak_rss_gb(), "prompt_ids": [list(k) for k in by_ids],
            "multi_turn": {"supported": tool_ok, "reason": None if tool_ok else (
                "TRL's environment_factory (GRPOTrainer(tools=..., environment_factory=...)) refuses this model: "
                "trl.chat_template_utils.supports_tool_calling(tokenizer) is False, its chat template cannot render "
                "a tool-calling conversation (GRPOTrainer raises 'The provided chat template does not support tool "
                "calling')")},
            "versions": {"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                         "torch": torch.__version__}}


# ----------------------------------------------------------------------------------------------------------------
# parent: alternate the sides, aggregate
# ----------------------------------------------------------------------------------------------------------------
def trl_python(requested: str | None) -> tuple[str | None, str | None]:
    """(interpreter with trl, None) or (None, why there is none)."""
    candidates = [requested] if requested else [sys.executable]
    for py in candidates:
        probe = subprocess.run([py, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True)
        if probe.returncode == 0:
            return py, None
        return None, f"trl is not importable by {py} (pip install 'agent_rl[bench-trl]' or pass --trl-python)"
    return None, "no interpreter"


def _side_command(python: str, side: str, spec_path: Path, out_path: Path, engine_dtype: str = "") -> list[str]:
    cmd = [python, str(Path(__file__).resolve()), "--side", side, "--spec", str(spec_path), "--side-out",
           str(out_path)]
    return cmd + (["--side-engine-dtype", engine_dtype] if engine_dtype else [])


def agent_rl_sides(engine_dtypes: str) -> dict[str, str]:
    """``{side name: engine dtype}`` of ``--engine-dtypes`` (float32 = the learner's module, side ``agent_rl``;
    another dtype ``d``: side ``agent_rl_d``).

    Raises:
        SystemExit: an unknown dtype, or none.
    """
    sides: dict[str, str] = {}
    for d in (x.strip() for x in engine_dtypes.split(",") if x.strip()):
        if d not in ("float32", "bfloat16", "float16"):
            raise SystemExit(f"--engine-dtypes: {d!r} is not float32 | bfloat16 | float16")
        sides["agent_rl" if d == "float32" else f"agent_rl_{d}"] = "" if d == "float32" else d
    if not sides:
        raise SystemExit("--engine-dtypes names no dtype")
    return sides


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every step of every run, and the per-run lists."""
    steps = [s for r in runs for s in r["steps"]]
    out: dict[str, Any] = {k: _median([s[k] for s in steps]) for k in ("step_s", "generate_s", "update_s", "cpu_s",
                                                                         "tokens")}
    out["tokens_per_s"] = _median([s["tokens"] / s["generate_s"] for s in steps if s["generate_s"] > 0])
    # generation tokens per CPU-second, measured over the generation (and reward) span of each step
    out["tokens_per_cpu_s"] = _median([s["tokens"] / s["generate_cpu_s"] for s in steps
                                       if s.get("generate_cpu_s")])
    out["peak_rss_gb"] = _median([r["peak_rss_gb"] for r in runs])
    out["runs"] = [{"steps": r["steps"], "peak_rss_gb": r["peak_rss_gb"], "wall_s": r.get("wall_s")} for r in runs]
    return out


def _ratios(ours: list[dict[str, Any]], trl: list[dict[str, Any]], a: dict[str, Any], b: dict[str, Any],
            suffix: str) -> dict[str, Any]:
    """One agent_rl side against TRL: ``ratio_step{suffix}`` (median of the per-pair ratios of median step times,
    pair k = the two sides' k-th runs) with its spread and pairs, the ratios of the medians of generate, update and
    CPU seconds and of peak memory, and of generation tokens per CPU-second (measured; ``_est``: from the step's
    CPU seconds times the generation share of its wall, the earlier estimate)."""
    out: dict[str, Any] = {}
    pairs = [statistics.median(s["step_s"] for s in x["steps"]) / statistics.median(s["step_s"] for s in y["steps"])
             for x, y in zip(ours, trl)]
    out[f"ratio_step{suffix}"] = statistics.median(pairs)
    out[f"ratio_step_spread{suffix}"] = [min(pairs), max(pairs)]
    out[f"ratio_step_pairs{suffix}"] = pairs
    for key in ("generate_s", "update_s", "cpu_s", "peak_rss_gb"):
        x, y = a[key], b[key]
        out[f"ratio_{key.removesuffix('_s')}{suffix}"] = x / y if x is not None and y else None
    est = {}
    for name, side in (("a", a), ("b", b)):
        est[name] = side["tokens"] / (side["cpu_s"] * side["generate_s"] / side["step_s"]) if side["step_s"] else None
        side["tokens_per_cpu_s_est"] = est[name]
    out[f"ratio_tokens_per_cpu_s_est{suffix}"] = est["a"] / est["b"] if est["a"] and est["b"] else None
    x, y = a.get("tokens_per_cpu_s"), b.get("tokens_per_cpu_s")
    out[f"ratio_tokens_per_cpu_s{suffix}"] = x / y if x and y else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    ap.add_argument("--steps", type=int, default=1, help="optimiser steps per run")
    ap.add_argument("--repeats", type=int, default=1, help="A B pairs of runs")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 16 for tiny, else 128")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--mode", choices=("signal", "math"), default="signal")
    ap.add_argument("--threads", type=int, default=max(1, min(os.cpu_count() or 1, 2)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-python", default=None, help="python with trl (default: this one when it has trl)")
    ap.add_argument("--engine-dtypes", default="float32",
                    help="agent_rl sides, one per engine precision (engine.dtype), comma-separated: float32 (the "
                         "learner's module itself; side 'agent_rl') and/or bfloat16 (side 'agent_rl_bfloat16')")
    ap.add_argument("--trl-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="TRL's model dtype (it samples and trains in it)")
    ap.add_argument("--out", default=None, help="folder for results.json (required, except for --side)")
    ap.add_argument("--side", choices=("agent_rl", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--side-out", help=argparse.SUPPRESS)
    ap.add_argument("--side-engine-dtype", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    if args.side:  # one side, in its own process
        spec = json.loads(Path(args.spec).read_text())
        result = (run_agent_rl(spec, args.side_engine_dtype) if args.side == "agent_rl"
                  else run_trl(spec, Path(args.side_out).parent))
        Path(args.side_out).write_text(json.dumps(result))
        return 0

    if not args.out:
        ap.error("--out is required")
    if args.max_new_tokens is None:
        args.max_new_tokens = 16 if args.model == "tiny" else 128
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    spec = build_spec(args, out)
    spec_path = out / "spec.json"
    py_trl, why_not = trl_python(args.trl_python)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ours = agent_rl_sides(args.engine_dtypes)
    # side name -> (interpreter, side kind, engine dtype)
    sides = {**{name: (sys.executable, "agent_rl", d) for name, d in ours.items()},
             **({"trl": (py_trl, "trl", "")} if py_trl else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for rep in range(args.repeats):
        for name, (py, kind, dtype) in sides.items():  # A B A B ... (A B C A B C with two engine dtypes)
            side_out = out / f"{name}_{rep}.json"
            t0 = time.perf_counter()
            proc = subprocess.run(_side_command(py, kind, spec_path, side_out, dtype), env=env, cwd=str(REPO),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
                raise SystemExit(f"the {name} side failed (exit {proc.returncode})")
            result = json.loads(side_out.read_text())
            result["wall_s"] = time.perf_counter() - t0
            expected = [t["prompt_ids"] for t in spec["tasks"]]
            if sorted(result["prompt_ids"]) != sorted(expected):
                raise SystemExit(f"the {name} side's prompt ids differ from the spec's")
            runs[name].append(result)
            print(f"run {rep} {name}: step_s {[round(s['step_s'], 2) for s in result['steps']]}", flush=True)
    load_after = os.getloadavg()

    results: dict[str, Any] = {
        "model": args.model, "mode": args.mode, "steps": args.steps, "repeats": args.repeats,
        "shape": {"prompts": args.prompts, "group": args.group, "max_new_tokens": args.max_new_tokens,
                  "lr": args.lr, "temperature": 1.0, "threads": args.threads},
        "engine_dtypes": {name: d or "float32 (the learner's module)" for name, d in ours.items()},
        "trl_dtype": args.trl_dtype,
        "prompt_ids_checked": True, "load_before": load_before, "load_after": load_after,
        **{name: summarise(runs[name]) for name in ours},
    }
    if py_trl:
        results["trl"] = summarise(runs["trl"])
        results["trl"]["versions"] = runs["trl"][0].get("versions")
        for name in ours:  # ratio keys: plain for "agent_rl", suffixed "_bfloat16" for "agent_rl_bfloat16"
            results.update(_ratios(runs[name], runs["trl"], results[name], results["trl"],
                                   name.removeprefix("agent_rl")))
        results["multi_turn"] = {
            "agent_rl": "runs: env=gym env.id=agent_rl/Calculator-v0 env.action_format=tools (not timed here)",
            "trl": runs["trl"][0]["multi_turn"]}
    else:
        results["trl"] = {"skipped": why_not}
        results["ratio_step"] = None
        results["multi_turn"] = {"trl": {"supported": None, "reason": why_not}}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k not in ("agent_rl", "trl")}, indent=2))
    for name in (*ours, "trl"):
        s = results.get(name, {})
        if "step_s" in s:
            print(f"{name:18s} step {s['step_s']:.2f} s  generate {s['generate_s']:.2f} s  update {s['update_s']:.2f} s"
                  f"  cpu {s['cpu_s']:.2f} s  tokens/s {s['tokens_per_s']:.1f}  peak {s['peak_rss_gb']:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Throughput and latency of the two single-turn verifiers: math-verify checks and sandboxed code runs.

    OMP_NUM_THREADS=1 python benchmarks/bench_verify.py [--math-checks 300] [--code-runs 40]
        [--concurrency 1 2 4] [--sustain 8 16 32 64]

Prints three tables:
1. math: checks per second and latency percentiles (ms) with the verifier pool (n workers, callers = n threads),
   on MATH500 reference solutions (correct) and perturbed answers (wrong), mixed 1:1;
2. code: HumanEval canonical solutions through ``run_tests``, runs per second and latency percentiles at each
   concurrency (threads, each starting its own pair of sandboxes);
3. sustain: N sandboxes whose program sleeps 3 s, started at once: how many finished correctly and the wall time
   (the number of concurrent sandboxes the machine sustains).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from envs.code import SandboxLimits, isolation_level, load_code, run_tests, summarize
from envs.code.env import build_program
from envs.math import VerifierPool, load_math, score_response


def percentiles(values: list[float]) -> tuple[float, float, float, float]:
    """(p50, p95, p99, max) of ``values`` (same unit in and out)."""
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return q[49], q[94], q[98], ordered[-1]


def bench_math(n_checks: int, workers: list[int]) -> None:
    problems = load_math("math500")
    pairs = []
    for i in range(n_checks):
        prob = problems[i % len(problems)]
        response = prob.solution if i % 2 == 0 else f"\\boxed{{{prob.answer}+1}}"
        pairs.append((prob.answer, response))
    print(f"\nmath verification ({n_checks} checks, MATH500 solutions and wrong answers 1:1)")
    print(f"{'workers':>8}{'checks/s':>10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}{'timeouts':>9}")
    for n in workers:
        pool = VerifierPool(n_workers=n, timeout_s=5.0)
        with ThreadPoolExecutor(n) as ex:  # start the workers (import time excluded)
            list(ex.map(lambda _: pool.check("1", "1"), range(n)))
        latencies: list[float] = []

        def one(pair: tuple[str, str]) -> str:
            started = time.perf_counter()
            out = score_response(pair[0], pair[1], pool)
            latencies.append((time.perf_counter() - started) * 1000)
            return out["verifier"]

        started = time.perf_counter()
        with ThreadPoolExecutor(n) as ex:
            verdicts = list(ex.map(one, pairs))
        wall = time.perf_counter() - started
        p50, p95, p99, top = percentiles(latencies)
        print(f"{n:>8}{n_checks / wall:>10.1f}{p50:>9.1f}{p95:>9.1f}{p99:>9.1f}{top:>9.1f}"
              f"{verdicts.count('timeout'):>9}")
        pool.close()


def bench_code(n_runs: int, concurrency: list[int]) -> None:
    tasks = load_code("humaneval")
    jobs = [(build_program(t, t.canonical), t.spec) for t in (tasks[i % len(tasks)] for i in range(0, 4 * n_runs, 4))]
    print(f"\ncode execution ({n_runs} HumanEval canonical solutions, isolation={isolation_level()})")
    print(f"{'threads':>8}{'runs/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}{'passed':>8}")
    for n in concurrency:
        latencies: list[float] = []

        def one(job: tuple[str, dict]) -> float:
            started = time.perf_counter()
            reward = summarize(run_tests(*job))["reward"]
            latencies.append((time.perf_counter() - started) * 1000)
            return reward

        started = time.perf_counter()
        with ThreadPoolExecutor(n) as ex:
            rewards = list(ex.map(one, jobs))
        wall = time.perf_counter() - started
        p50, p95, p99, top = percentiles(latencies)
        print(f"{n:>8}{len(jobs) / wall:>9.2f}{p50:>9.0f}{p95:>9.0f}{p99:>9.0f}{top:>9.0f}{int(sum(rewards)):>8}")


def bench_sustain(sizes: list[int]) -> None:
    program = "import time\ntime.sleep(3)\ndef f(x):\n    return x + 1\n"
    spec = {"mode": "asserts", "setup": "", "asserts": ["assert f(1) == 2"]}
    limits = SandboxLimits(wall_s=60, load_timeout_s=30, call_timeout_s=10)
    print("\nconcurrent sandboxes (program sleeps 3 s; all started at once)")
    print(f"{'sandboxes':>10}{'passed':>8}{'wall s':>8}")
    for n in sizes:
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as ex:
            rewards = list(ex.map(lambda _: summarize(run_tests(program, spec, limits))["reward"], range(n)))
        print(f"{n:>10}{int(sum(rewards)):>8}{time.perf_counter() - started:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--math-checks", type=int, default=300)
    parser.add_argument("--math-workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--code-runs", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--sustain", type=int, nargs="*", default=[8, 16, 32, 64])
    args = parser.parse_args()
    bench_math(args.math_checks, args.math_workers)
    bench_code(args.code_runs, args.concurrency)
    bench_sustain(args.sustain)


if __name__ == "__main__":
    main()

"""Acceptance check: every canonical solution passes its own tests in the sandbox (HumanEval, HumanEval+, MBPP).

Each canonical solution goes through the env exactly as a model answer would (in a ```python fence). For
HumanEval+ the first run also records the expected outputs (canonical outputs on every input) into the cache.
Prints a table (tasks, passed, failures, wall time) and every failure with its reason.

    OMP_NUM_THREADS=1 python scripts/check_code_canonical.py [--datasets humaneval humanevalplus mbpp ...]
        [--sample N]   # deterministic sample: every k-th task so that about N are checked
"""

from __future__ import annotations

import argparse
import time

from envs.code import LOADERS, CodeEnv, load_code


def sample_indices(n_tasks: int, n_sample: int | None) -> list[int]:
    """Every k-th index (k = ceil(n_tasks / n_sample)); all indices when n_sample is None."""
    if not n_sample or n_sample >= n_tasks:
        return list(range(n_tasks))
    step = -(-n_tasks // n_sample)
    return list(range(0, n_tasks, step))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=list(LOADERS))
    parser.add_argument("--sample", type=int, default=None)
    args = parser.parse_args()
    rows, failures = [], []
    for name in args.datasets:
        env = CodeEnv(datasets=name)
        tasks = load_code(name)
        indices = sample_indices(len(tasks), args.sample)
        started = time.perf_counter()
        n_ok = n_tests = 0
        for i in indices:
            env.reset(options={"dataset": name, "index": i})
            try:
                _, reward, _, _, info = env.step(f"```python\n{tasks[i].canonical}\n```")
            except RuntimeError as exc:  # HumanEval+ expected outputs could not be recorded
                reward, info = 0.0, {"reason": f"record_error: {exc}"[:300]}
            n_ok += reward == 1.0
            n_tests += info.get("n_tests", 0)
            if reward != 1.0:
                bad = [t for t in info.get("tests", []) if not t["passed"]][:1]
                failures.append((tasks[i].uid, info["reason"], info.get("load_error"), bad))
        rows.append((name, len(indices), n_ok, n_tests, time.perf_counter() - started))
    print(f"{'dataset':<16}{'tasks':>7}{'passed':>8}{'tests run':>11}{'wall s':>9}")
    for name, n, n_ok, n_tests, dt in rows:
        print(f"{name:<16}{n:>7}{n_ok:>8}{n_tests:>11}{dt:>9.1f}")
    for fail in failures:
        print("FAIL", *fail)


if __name__ == "__main__":
    main()

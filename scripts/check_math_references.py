"""Acceptance check: every math dataset's reference, fed back as the action, must score 1.

For each dataset the action is the worked solution when it carries a final answer the env can extract (a
``\\boxed{}`` or GSM8K's ``####``), else ``\\boxed{<reference answer>}``. Prints a table of rates, lists failures.

    OMP_NUM_THREADS=1 python scripts/check_math_references.py [--datasets math500 gsm8k ...] [--limit N]
"""

from __future__ import annotations

import argparse
import time

from envs.math import LOADERS, MathEnv, extract_answer, load_math


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=list(LOADERS))
    parser.add_argument("--limit", type=int, default=None, help="first N problems per dataset")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    rows = []
    failures = []
    for name in args.datasets:
        splits = ("train", "test") if name == "gsm8k" else ("test",)
        for split in splits:
            env = MathEnv(datasets=name, split=split, verify_timeout_s=args.timeout, n_workers=args.workers)
            problems = load_math(name, split)[: args.limit]
            t0 = time.perf_counter()
            n_ok = n_solution = 0
            for i, prob in enumerate(problems):
                use_solution = bool(prob.solution) and extract_answer(prob.solution) is not None
                action = prob.solution if use_solution else f"\\boxed{{{prob.answer}}}"
                n_solution += use_solution
                env.reset(options={"dataset": name, "split": split, "index": i})
                _, reward, _, _, info = env.step(action)
                n_ok += reward == 1.0
                if reward != 1.0:
                    failures.append((f"{name}/{split}", i, info["reference"], info["extracted"], info["verifier"]))
            dt = time.perf_counter() - t0
            rows.append((f"{name}/{split}", len(problems), n_solution, n_ok, dt))
    print(f"{'dataset':<22}{'n':>6}{'from solution':>15}{'score 1':>9}{'rate':>8}{'wall s':>9}")
    for name, n, n_sol, n_ok, dt in rows:
        print(f"{name:<22}{n:>6}{n_sol:>15}{n_ok:>9}{n_ok / max(n, 1):>8.4f}{dt:>9.1f}")
    for fail in failures:
        print("FAIL", *fail)


if __name__ == "__main__":
    main()

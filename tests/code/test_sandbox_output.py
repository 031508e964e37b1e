"""The program's printed output is never lost: the worker flushes it before every reply to the checker, since the
parent kills the worker as soon as the checker's verdict is in (before that flush, about 1 run in 11 read empty here
when the machine was loaded, e.g. the python tool answering "(no output)" for ``print(sum(range(5)))``)."""

from envs.code.sandbox import SandboxLimits, run_tests
from envs.tools import run_python


def test_printed_output_survives_every_run():
    outs = [run_python("print(sum(range(5)))") for _ in range(30)]
    assert outs == [("10", True)] * 30


def test_stdout_and_stderr_of_a_judged_program_are_kept():
    program = "import sys\nprint('top')\nsys.stderr.write('warn\\n')\ndef f(x):\n    print('called', x)\n    return x\n"
    spec = {"mode": "asserts", "setup": "", "asserts": ["assert f(2) == 2"]}
    for _ in range(10):
        result = run_tests(program, spec, SandboxLimits(wall_s=10.0, cpu_s=5, load_timeout_s=5.0))
        assert [t["passed"] for t in result.tests] == [True]
        assert result.stdout == "top\ncalled 2\n" and result.stderr == "warn\n"

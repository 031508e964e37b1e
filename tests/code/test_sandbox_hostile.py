"""Hostile programs: each must be contained, reported, never pass, and leave no process behind.

Every program defines ``f`` and the test asserts ``f(1) == 2``; the program only gets ``f(1) == 2`` right if its
hostile action succeeds (or, for the fake-pass attacks, if the harness can be fooled). Limits are small so the
whole file runs in ~30 s.
"""

from __future__ import annotations


import os
import secrets
import socket
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from envs.code import SandboxLimits, run_tests, summarize
from envs.code.sandbox import isolation_level

# The programs whose outcome is not a timeout get clocks that CPU contention cannot reach (they only end a program
# that hangs); CPU time, memory and file size are what these tests bound. The programs that never end (infinite
# loops, the fork bomb) get LOOP_LIMITS' short clocks, so that their timeout comes soon.
LIMITS = SandboxLimits(wall_s=120, cpu_s=3, memory_mb=512, file_size_mb=2, call_timeout_s=60, load_timeout_s=60)
LOOP_LIMITS = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=512, file_size_mb=2, call_timeout_s=1.5, load_timeout_s=1.5)
SPEC = {"mode": "asserts", "setup": "", "asserts": ["assert f(1) == 2"]}
CHECK_SPEC = {"mode": "check", "context": "def f(x):\n    '''doc'''\n", "entry_point": "f",
              "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"}
MARKER = f"agentrlmarker{secrets.token_hex(6)}"

# Without namespaces ("none") nothing here is contained: the suite documents that by skipping. With "userns"
# (unprivileged) the program keeps the caller's uid, so the uid-dependent checks are skipped too. With
# AGENT_RL_SANDBOX_REQUIRE=full (CI) each of those skips is a failure instead (tests/code/conftest.py).
pytestmark = pytest.mark.sandbox("namespaces")
needs_full = pytest.mark.sandbox("full")


def _processes_with(marker: str, uids: list[int]) -> list[str]:
    """Live processes whose command line holds ``marker`` or whose real uid is one of ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "Uid: -1")
        if marker in cmdline or int(uid_line.split()[1]) in uids:
            if "State:\tZ" not in status:
                found.append(f"{entry}: {cmdline[:80]}")
    return found


def run_hostile(program: str, spec: dict = SPEC, limits: SandboxLimits = LIMITS) -> dict:
    result = run_tests(textwrap.dedent(program), spec, limits)
    info = summarize(result)
    # the sandbox has killed its processes when it returns; the kernel may take a moment to tear them down on a busy
    # machine, and only a process that escaped is still there after the ceiling
    ceiling = time.monotonic() + 30
    while (leftovers := _processes_with(MARKER, result.uids)) and time.monotonic() < ceiling:
        time.sleep(0.1)
    assert leftovers == [], leftovers
    assert info["reward"] == 0.0 and not info["passed"], info
    assert result.wall_s < limits.wall_s + 5
    return info


def test_isolation_is_available_here():
    # this machine runs the tests as root with util-linux: the strongest level must be detected
    assert isolation_level() in ("full", "userns", "none")
    if os.geteuid() == 0 and not os.environ.get("AGENT_RL_SANDBOX"):
        assert isolation_level() == "full"
    if os.environ.get("AGENT_RL_SANDBOX_REQUIRE") == "full":
        assert isolation_level() == "full", "AGENT_RL_SANDBOX_REQUIRE=full, but the sandbox runs at a lower level"


def test_honest_program_passes_for_reference():
    result = run_tests("def f(x):\n    return x + 1\n", SPEC, LIMITS)
    info = summarize(result)
    assert info["reward"] == 1.0 and info["reason"] == "passed" and info["n_tests"] == 1


def test_infinite_loop_at_top_level():
    info = run_hostile("while True:\n    pass\n", limits=LOOP_LIMITS)
    assert info["reason"] == "timeout"


def test_infinite_loop_in_function():
    info = run_hostile("def f(x):\n    while True:\n        pass\n", limits=LOOP_LIMITS)
    assert info["reason"] == "timeout"


@needs_full
def test_fork_bomb():
    info = run_hostile(f"""
        import os, time
        # {MARKER}
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
        """, limits=LOOP_LIMITS)
    assert info["reason"] in ("timeout", "crashed", "load_error")


# The memory bombs must meet the memory limit before a clock: filling 512 MiB took longer than the 1.5 s load
# timeout once on 2 cores shared with the vLLM tests (reason "timeout", in a clean-clone CI run). They get clocks
# that CPU contention cannot reach first (LIMITS'); the memory limit and the expected reason stay.
BOMB_LIMITS = LIMITS


def test_memory_bomb():
    info = run_hostile("""
        blocks = []
        while True:
            blocks.append(bytearray(64 << 20))
        def f(x):
            return 2
        """, limits=BOMB_LIMITS)
    assert info["reason"] == "memory"


def test_memory_bomb_inside_call():
    info = run_hostile("def f(x):\n    return len([0] * (10 ** 10)) and 2\n", limits=BOMB_LIMITS)
    assert info["reason"] == "memory"


@needs_full
def test_writing_outside_the_temporary_directory():
    name = f"{MARKER}.txt"
    with tempfile.TemporaryDirectory() as host_dir:
        targets = [str(Path.cwd() / name), str(Path.home() / name), f"{host_dir}/{name}", f"/tmp/{name}",
                   f"/var/tmp/{name}", f"/dev/shm/{name}", str(Path(__file__).resolve().parent / name)]
        info = run_hostile(f"""
            ok = 0
            for path in {targets!r}:
                try:
                    with open(path, "w") as fh:
                        fh.write("pwned")
                    ok += 1
                except OSError:
                    pass
            def f(x):
                return 2 if ok == {len(targets)} else 1
            """)
        for path in targets:
            assert not os.path.exists(path), path
    assert info["reason"] == "wrong_answer"


def test_reading_the_parents_environment(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("AGENT_RL_TEST_SECRET", secret)
    info = run_hostile("""
        import os, glob
        blob = repr(dict(os.environ))
        for path in glob.glob("/proc/*/environ"):
            try:
                blob += open(path, "rb").read().decode("latin-1")
            except OSError:
                pass
        print(blob)
        def f(x):
            return 2 if "AGENT_RL_TEST_SECRET" in blob else 1
        """)
    assert secret not in info["stdout"] and "AGENT_RL_TEST_SECRET" not in info["stdout"]
    assert info["reason"] == "wrong_answer"


def test_opening_a_network_connection():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        info = run_hostile(f"""
            import socket
            def f(x):
                for host in ("127.0.0.1", "1.1.1.1", "pypi.org"):
                    try:
                        socket.create_connection((host, {port} if host == "127.0.0.1" else 443), timeout=0.5)
                        return 2
                    except OSError:
                        pass
                return 1
            """)
    finally:
        server.close()
    assert info["reason"] == "wrong_answer"


def test_child_that_outlives_the_test():
    info = run_hostile(f"""
        import os, subprocess, sys, time
        # the sandbox holds no shell: the children are the interpreter itself (sys.executable)
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)  # {MARKER}"]
        subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.fork() == 0:  # a double-forked daemon in its own session
            os.setsid()
            if os.fork() == 0:
                os.execv(sleeper[0], sleeper)
            os._exit(0)
        if os.fork() == 0:  # a plain forked child that just waits (found by its uid)
            time.sleep(600)
            os._exit(0)
        def f(x):
            return 1
        """)
    assert info["reason"] == "wrong_answer"


def test_printing_one_gigabyte():
    info = run_hostile("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(chunk)
        def f(x):
            return 2
        """)
    assert info["stdout_bytes"] <= LIMITS.file_size_mb << 20
    assert len(info["stdout"]) <= 2000


def test_sys_exit_before_the_tests_run():
    info = run_hostile("import sys\ndef f(x):\n    return 2\nsys.exit(0)\n")
    assert info["reason"] == "load_error" and info["load_error"][0] == "SystemExit"


def test_os_exit_before_the_tests_run():
    info = run_hostile("import os\ndef f(x):\n    return 2\nos._exit(0)\n")
    assert info["reason"] in ("load_error", "crashed")


@pytest.mark.parametrize("spec", [SPEC, CHECK_SPEC], ids=["asserts", "check"])
def test_fake_pass_attacks(spec):
    # 1) print a fake verdict on stdout and on every inherited descriptor, 2) patch the harness, builtins and
    # exit paths, 3) return objects that claim to equal anything, 4) kill every process it can see.
    fake = '{"load_error":null,"tests":[{"name":"x","passed":true,"status":"passed","time_s":0}],"outputs":null}'
    info = run_hostile(f"""
        import builtins, os, signal, sys
        FAKE = {fake!r}
        print(FAKE)
        for fd in range(1, 64):
            try:
                os.write(fd, (FAKE + "\\n").encode())
            except OSError:
                pass
        builtins.AssertionError = type("AssertionError", (Exception,), {{}})
        builtins.print = lambda *a, **k: None
        sys.exit = lambda *a: None
        class AlwaysEqual:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        class LyingDict(dict):
            def __eq__(self, other):
                return True
        calls = []
        def f(x):
            calls.append(x)
            if len(calls) == 1:
                return AlwaysEqual()
            if len(calls) == 2:
                return LyingDict()
            os.kill(-1, signal.SIGKILL)
        """, spec)
    assert info["n_passed"] == 0


def test_always_equal_object_is_a_reference_not_a_value():
    result = run_tests("class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n",
                       SPEC, LIMITS)
    assert result.tests[0]["status"] == "wrong_answer"

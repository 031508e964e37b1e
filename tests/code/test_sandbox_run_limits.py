"""The sandbox is the machine's (issue 32): limits a caller asks for are capped by the server's (``--sandbox-limits``,
``$AGENT_RL_SANDBOX_LIMITS``; default: ``SandboxLimits``' defaults), and memory, processes and CPU are held per RUN
(all of a program's processes together), by a cgroup where the machine gives one and by the accounted cap where it
does not. Before: ``limits={"nproc": 1000, "memory_mb": 65536, ...}`` was taken as given, and one program with 4
processes of 400 MB each held 1.6 GB (the limit was per process: RLIMIT_AS)."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.code import run_limits
from envs.code.sandbox import SANDBOX_LIMITS_ENV, SandboxLimits, capped_limits, parse_sandbox_limits, run_tests

LOOSER = {"nproc": 1000, "memory_mb": 65536, "cpu_s": 3600, "wall_s": 3600}
NO_TESTS = {"mode": "asserts", "setup": "", "asserts": []}

# 4 processes x 400 MB touched (1.6 GB together; each one alone is under the 1 GiB RLIMIT_AS). Each child tells the
# parent (one atomic pipe write) once its 400 MB are written and holds them 2 s; the parent then prints how many
# children hold theirs AT ONCE (alive, reaped ones gone). That count, not how many ever printed, is what a per-run
# limit bounds: under a cgroup the kernel's OOM killer picks the largest process, which on a loaded machine (children
# run one after another) is a child that already holds its 400 MB, so all four may each have held 400 MB in turn
# (a flake of the old assertion "fewer than 4 printed", seen in a full fast-tier run). A child's fill can only finish
# once its victim's memory is freed, i.e. the victim is a zombie the parent reaps before it counts.
FOUR_BY_400 = """
import os, time
r, w = os.pipe()
pids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        time.sleep(STAGGER_S * i)
        b = b"x" * (400 << 20)  # every page written
        os.write(w, b"%d\\n" % os.getpid())
        time.sleep(2)
        os._exit(0)
    pids.append(pid)
os.close(w)
page, holding = os.sysconf("SC_PAGE_SIZE"), set()


def resident(p):  # the kernel's resident pages of p, in bytes (0 once it is killed and its memory reaped)
    try:
        with open("/proc/%d/statm" % p) as f:
            return int(f.read().split()[1]) * page
    except (OSError, IndexError, ValueError):
        return 0


with os.fdopen(r) as messages:
    for line in messages:  # ends when every child has exited (or been killed)
        holding.add(int(line))
        # still holding = still resident, not "not yet reaped": an OOM victim's memory is released (and its rss
        # counted down) before its parent can wait for it, so a wait-based count saw it alive a moment longer
        print("holding at once:", sum(resident(p) >= (380 << 20) for p in holding), flush=True)
for p in pids:
    os.waitpid(p, 0)
print("all done", flush=True)
"""


def _most_at_once(stdout: str) -> int:
    """The largest "holding at once" count FOUR_BY_400 printed (0 if none)."""
    return max((int(line.split(":")[1]) for line in stdout.splitlines() if line.startswith("holding at once:")),
               default=0)


FORK_BOMB = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print("forked", n)
"""


def test_limits_above_the_caps_are_refused_naming_each_key():
    with pytest.raises(ValueError) as info:
        gymnasium.make("agent_rl/Code-v0", limits=LOOSER)
    message = str(info.value)
    for key, cap in [("nproc", 32), ("memory_mb", 1024), ("cpu_s", 10), ("wall_s", 20.0)]:
        assert f"limits.{key}={LOOSER[key]} is above the server's cap {cap}" in message
    with pytest.raises(ValueError, match="plus_wall_s=3600 must be a positive number at most the server's cap 60"):
        gymnasium.make("agent_rl/Code-v0", plus_wall_s=3600)
    with pytest.raises(ValueError, match=r"tool_limits.memory_mb=4096 is above the server's cap 1024"):
        gymnasium.make("agent_rl/Math-v0", action_format="tools", tools=["python"], tool_limits={"memory_mb": 4096})
    with pytest.raises(ValueError, match=r"limits.nproc=-1 \(a positive number\)"):
        capped_limits({"nproc": -1})
    # code's own SandboxLimits is trusted (a client's JSON can only be a dict)
    assert gymnasium.make("agent_rl/Code-v0", limits=SandboxLimits(nproc=64)).unwrapped.limits.nproc == 64
    # tighter is fine, and what is not given keeps its default
    env = gymnasium.make("agent_rl/Code-v0", limits={"nproc": 8, "memory_mb": 256})
    assert env.unwrapped.limits == SandboxLimits(nproc=8, memory_mb=256)


def test_the_server_sets_the_caps(monkeypatch):
    assert parse_sandbox_limits("memory_mb=2048,nproc=64") == {"memory_mb": 2048, "nproc": 64}
    with pytest.raises(ValueError, match="--sandbox-limits: unknown limit 'nprocs'"):
        parse_sandbox_limits("nprocs=3")
    monkeypatch.setenv(SANDBOX_LIMITS_ENV, '{"memory_mb": 2048, "nproc": 64}')
    assert capped_limits({"memory_mb": 2048, "nproc": 64}) == SandboxLimits(memory_mb=2048, nproc=64)
    with pytest.raises(ValueError, match="limits.nproc=65 is above the server's cap 64"):
        capped_limits({"nproc": 65})
    monkeypatch.setenv(SANDBOX_LIMITS_ENV, '{"memory_mb": 512}')  # a cap below a default lowers the default
    assert capped_limits(None).memory_mb == 512


@pytest.fixture(params=["cgroup", "accounted"])
def run_mode(request, monkeypatch):
    """Each per-run mechanism in turn: the cgroup (skipped where the machine gives none) and the accounted cap."""
    run_limits.cgroup_mode.cache_clear()
    if request.param == "accounted":
        monkeypatch.setenv("AGENT_RL_SANDBOX_CGROUP", "none")
    elif run_limits.cgroup_mode() == "none":
        pytest.skip("no writable cgroup (v1 memory+pids or v2) for a run here")
    yield request.param
    run_limits.cgroup_mode.cache_clear()


@pytest.mark.sandbox("full")
@pytest.mark.parametrize("stagger_s", [0.0, 0.5])
def test_four_processes_of_400_mb_are_held_to_the_per_run_memory(run_mode, stagger_s):
    """``stagger_s``: each child starts its fill that much after the one before: 0.5 is the loaded machine's schedule
    (every child fills alone) under which four children each printed "holds 400 MB" in the cgroup (kept as a case)."""
    program = f"STAGGER_S = {stagger_s}\n" + FOUR_BY_400
    result = run_tests(program, NO_TESTS, SandboxLimits(load_timeout_s=15.0))  # room on a loaded machine
    assert result.run_limits == ("accounted" if run_mode == "accounted" else f"cgroup-{run_limits.cgroup_mode()}")
    assert result.limit_hit == "memory", result
    if run_mode == "cgroup":  # the kernel's own count of the run: never above memory_mb (1 GiB) + its tmpfs (128
        # MiB), so never 3 x 400 MB at once; the OOM killer ended some children, the program itself goes on
        assert "all done" in result.stdout, result
        assert 1 <= _most_at_once(result.stdout) <= 2, result.stdout  # without a per-run limit: 4
        assert result.peak_memory_mb is not None and result.peak_memory_mb <= 1024 + 128, result.peak_memory_mb
    else:  # the worker killed at the first read past 1 GiB (one ~20 ms poll late at most)
        assert _most_at_once(result.stdout) < 4, result.stdout
        assert "all done" not in result.stdout
        assert 1024 < result.peak_memory_mb < 1300, result.peak_memory_mb


@pytest.mark.sandbox("full")
def test_a_fork_bomb_is_held_to_nproc(run_mode):
    result = run_tests(FORK_BOMB, NO_TESTS, SandboxLimits(nproc=16))
    forked = int(result.stdout.split()[-1])
    assert 0 < forked < 16, result.stdout  # the program itself is one of the 16
    assert result.peak_processes <= 16


# The task's own test code (a code task's ``setup``, from reset options or a task-file row) forks 4 children that
# each write 400 MB and hold them: it runs in the checker, which was outside the per-run account (the run held
# 2,451 MB and scored 1). The checker's RLIMIT_AS (4 GiB a process) alone allows it.
CHECKER_FORK_AND_TOUCH = """
import os, time
for i in range(4):
    if os.fork() == 0:
        b = b"x" * (400 << 20)
        time.sleep(3)
        os._exit(0)
time.sleep(4)
"""


@pytest.mark.sandbox("full")
def test_the_checkers_fork_and_touch_is_held_by_the_run_cap(run_mode):
    from envs.code.env import summarize

    spec = {"mode": "asserts", "setup": CHECKER_FORK_AND_TOUCH, "asserts": ["assert f() == 1"]}
    result = run_tests("def f():\n    return 1\n", spec, SandboxLimits(wall_s=20.0))
    assert result.limit_hit == "memory", result
    if run_mode == "accounted":
        assert result.peak_memory_mb is not None and result.peak_memory_mb < 1300, result.peak_memory_mb
    else:
        assert result.peak_memory_mb is not None and result.peak_memory_mb <= 1024 + 128, result.peak_memory_mb
    info = summarize(result)  # never a pass, never an infra error: the run's cap, named
    assert (info["reward"], info["reason"], info["limit_hit"]) == (0.0, "memory", "memory"), info


@pytest.mark.sandbox("full")
def test_a_plain_task_still_passes_with_the_checker_in_the_account(run_mode):
    from envs.code.env import summarize

    spec = {"mode": "asserts", "setup": "x = [0] * 1000", "asserts": ["assert f() == 1", "assert len(x) == 1000"]}
    info = summarize(run_tests("def f():\n    return 1\n", spec))
    assert (info["reward"], info["reason"], info["limit_hit"]) == (1.0, "passed", None), info


@pytest.mark.sandbox("full")
def test_the_checkers_busy_loop_is_held_to_the_run_cpu(run_mode):
    """The task's test code spinning in the checker counted against no CPU cap (only the program's CPU did): it ran
    to the wall clock (``wall_s``) and the run was a timeout, not the run's ``cpu`` cap."""
    from envs.code.env import summarize

    spec = {"mode": "asserts", "setup": "while True:\n    pass\n", "asserts": ["assert f() == 1"]}
    result = run_tests("def f():\n    return 1\n", spec, SandboxLimits(cpu_s=2, wall_s=120.0))
    assert (result.limit_hit, result.timed_out) == ("cpu", False), result
    info = summarize(result)
    assert (info["reward"], info["reason"], info["limit_hit"]) == (0.0, "timeout", "cpu"), info

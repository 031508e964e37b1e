"""Issue 20, section 1: a program under test cannot reach the benchmark, the checkout or anything else of the host.

Programs here look their answer up the way a policy would learn to: by the benchmark's file names, by the text of
the canonical solution, through the exact host paths of the data root, the checkout and the cache (given to them
here: the worst case), through ``/proc/<pid>/root`` and ``cwd``, relative ``..`` chains, a symlink they make,
inherited descriptors and the environment, and by walking the whole filesystem. Through the real code env with
real tasks from the data root, each finds nothing and scores 0. The controls run the same lookups without
isolation (``AGENT_RL_SANDBOX=none``): there they find the answer and score 1, so the programs do look right.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from envs.code import CodeEnv, SandboxLimits, load_code, run_tests
from envs.code import sandbox
from envs.code._codec import decode
from envs.code.datasets import expected_cache_path
from envs.code.sandbox import clean_env, sandbox_layout, sandbox_python
from envs.data import REPO_ROOT, cache_dir, dataset_dir

pytestmark = pytest.mark.sandbox("namespaces")

# Walking and reading the whole visible tree (the standard library: some thousands of files) at load time.
LIMITS = SandboxLimits(wall_s=120, cpu_s=90, memory_mb=2048, load_timeout_s=90, call_timeout_s=10)
DATA_NAMES = ("HumanEval.jsonl.gz", "HumanEvalPlus.jsonl.gz", "mbpp_ase.jsonl", "sanitized-mbpp.json")
TASKS = [("humaneval", 0), ("mbpp", 1), ("humanevalplus", 0)]


def host_secrets(task_uid: str) -> list[str]:
    """Host paths that would give the answer away: the data files, the checkout, the cache (HumanEval+ outputs)."""
    code = dataset_dir("code")
    return [str(code / name) for name in DATA_NAMES] + [
        str(code), str(code.parent), str(REPO_ROOT), str(REPO_ROOT / "envs" / "code" / "datasets.py"),
        str(Path(__file__).resolve()), str(REPO_ROOT / ".git" / "HEAD"), str(cache_dir()),
        str(expected_cache_path(task_uid))]


def snippet(task) -> str:
    """The longest line of the canonical solution (without the prompt) that JSON stores verbatim."""
    body = task.canonical[len(task.context):]
    lines = [line.strip() for line in body.splitlines() if '"' not in line and "\\" not in line]
    return max(lines, key=len)


LOOKUP = r'''
import gzip, json, os, stat, sys
KNOWN = {known!r}
NAMES = set({names!r})
SNIPPET = {snippet!r}
TASK_ID = {task_id!r}
WALK = {walk!r}
found, texts, walked = [], [], [0]

def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except Exception:
            pass
    return data.decode("utf-8", "replace")

read_already = set()

def look(how, path):
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    found.append([how, str(path)])
    if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in read_already:
        read_already.add((st.st_dev, st.st_ino))
        text = read(path)
        if text and SNIPPET in text:
            texts.append(text)

pids = [p for p in os.listdir("/proc") if p.isdigit()]
prefixes = ["", "/proc/self/root", "/proc/self/cwd", "/proc/thread-self/root"]
prefixes += ["/proc/%s/%s" % (p, w) for p in pids for w in ("root", "cwd")]
for path in KNOWN:
    for prefix in prefixes:
        look("known " + prefix, prefix + path)
    look("relative", "../" * 16 + path.lstrip("/"))
    link = "/tmp/link%d" % len(found)
    try:
        os.symlink(path, link)
        look("symlink", link)
        os.unlink(link)  # the controls run without isolation: leave nothing in the host's /tmp
    except OSError:
        pass
for fd in range(1024):  # inherited descriptors: a directory would open the host's tree
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if stat.S_ISDIR(st.st_mode):
        found.append(["dir fd", str(fd)])
    elif stat.S_ISREG(st.st_mode):
        text = read("/proc/self/fd/%d" % fd)
        if text and SNIPPET in text:
            texts.append(text)
for value in os.environ.values():  # variables naming paths: what lies in those directories
    for part in value.split(":"):
        try:
            names = os.listdir(part) if part.startswith("/") else []
        except OSError:
            names = []
        for name in names:
            if name in NAMES:
                look("env", os.path.join(part, name))
if WALK:
    for top, dirs, files in os.walk("/"):
        if top == "/":
            dirs[:] = [d for d in dirs if d != "proc"]
        for name in files:
            walked[0] += 1
            path = os.path.join(top, name)
            if name in NAMES:
                look("name", path)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size < (8 << 20):
                text = read(path)
                if text and SNIPPET in text:
                    found.append(["content", path])
                    texts.append(text)
        for name in dirs:
            if name in (".git", "agent_rl", "humanevalplus_expected") or name in NAMES:
                found.append(["dir name", os.path.join(top, name)])
print(json.dumps({{"n_found": len(found), "texts": len(texts), "walked": walked[0], "found": found[:6]}}), flush=True)

def answer_from(text):
    rows = []
    try:
        rows = json.loads(text)
    except ValueError:
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and str(row.get("task_id")) == TASK_ID:
            return row.get("prompt", "") + row["canonical_solution"] if "canonical_solution" in row else row["code"]

for text in texts:
    source = answer_from(text)
    if source:
        exec(source, globals())
        break
else:
    def {entry}(*args, **kwargs):
        return None
'''


def lookup_response(task, walk: bool = True) -> str:
    task_id = task.uid.split("/")[-1] if task.dataset.startswith("mbpp") else task.uid
    program = LOOKUP.format(known=host_secrets(task.uid), names=list(DATA_NAMES), snippet=snippet(task),
                            task_id=task_id, walk=walk, entry=task.entry_point)
    return f"```python\n{program}\n```"


def step(dataset: str, index: int, response) -> dict:
    env = CodeEnv(datasets=dataset, limits=LIMITS)
    env.reset(options={"dataset": dataset, "index": index})
    task = load_code(dataset)[index]
    _, reward, terminated, _, info = env.step(response(task) if callable(response) else response)
    assert terminated
    return {**info, "reward": reward}


@pytest.fixture()
def no_isolation(monkeypatch: pytest.MonkeyPatch):
    """The control: the same programs run with ``AGENT_RL_SANDBOX=none`` (no namespaces, the host's files)."""
    monkeypatch.setenv("AGENT_RL_SANDBOX", "none")
    sandbox.isolation_level.cache_clear()
    sandbox.sandbox_python.cache_clear()
    yield
    monkeypatch.delenv("AGENT_RL_SANDBOX")
    sandbox.isolation_level.cache_clear()
    sandbox.sandbox_python.cache_clear()


def report(info: dict) -> dict:
    line = next((line for line in info["stdout"].splitlines() if line.startswith("{")), None)
    assert line is not None, {k: info.get(k) for k in ("reason", "load_error", "stdout", "stderr", "stdout_bytes")}
    return json.loads(line)


@pytest.mark.parametrize("dataset,index", TASKS)
def test_looking_the_answer_up_finds_nothing_and_scores_zero(dataset, index):
    info = step(dataset, index, lookup_response)
    seen = report(info)
    assert seen["found"] == [] and seen["n_found"] == 0 and seen["texts"] == 0, seen
    assert seen["walked"] > 500, seen  # the walk ran: the interpreter's standard library alone has thousands
    assert info["reward"] == 0.0 and info["reason"] == "wrong_answer", info
    assert info["isolation"] in ("full", "userns")


@pytest.mark.parametrize("dataset,index", TASKS)
def test_control_the_same_lookup_without_isolation_scores_one(dataset, index, no_isolation):
    # Same program (known paths only, no walk): on the host it finds the data file and its canonical solution.
    info = step(dataset, index, lambda task: lookup_response(task, walk=False))
    seen = report(info)
    assert info["isolation"] == "none"
    assert seen["texts"] >= 1 and any(path.endswith(DATA_NAMES) for _, path in seen["found"]), seen
    assert info["reward"] == 1.0 and info["reason"] == "passed", info


CHECKOUT = '''
import sys, types
try:  # the checkout's own loader (envs/data.py, envs/code/datasets.py), read from its files and run here
    for name in ("envs", "envs.code"):
        sys.modules[name] = types.ModuleType(name)
    for name, path in (("envs.data", "envs/data.py"), ("envs.code.datasets", "envs/code/datasets.py")):
        module = types.ModuleType(name)
        module.__file__ = {root!r} + "/" + path
        sys.modules[name] = module
        with open(module.__file__) as fh:
            exec(fh.read(), module.__dict__)
    task = sys.modules["envs.code.datasets"].load_code({dataset!r})[{index}]
    exec(task.canonical, globals())
    print("read the checkout", flush=True)
except Exception as exc:
    print("no checkout:", type(exc).__name__, exc, flush=True)
    def {entry}(*args, **kwargs):
        return None
'''


@pytest.mark.parametrize("dataset,index", TASKS[:2])
def test_running_the_checkouts_loader_scores_zero(dataset, index):
    # The project's own loader knows where the data is: a program that runs it from the checkout gets nothing.
    def response(task):
        return "```python\n" + CHECKOUT.format(root=str(REPO_ROOT), dataset=dataset, index=index,
                                               entry=task.entry_point) + "\n```"

    info = step(dataset, index, response)
    assert "no checkout: FileNotFoundError" in info["stdout"], info["stdout"]
    assert info["reward"] == 0.0 and info["reason"] == "wrong_answer"


@pytest.mark.parametrize("dataset,index", TASKS[:2])
def test_control_running_the_checkouts_loader_without_isolation_scores_one(dataset, index, no_isolation):
    def response(task):
        return "```python\n" + CHECKOUT.format(root=str(REPO_ROOT), dataset=dataset, index=index,
                                               entry=task.entry_point) + "\n```"

    info = step(dataset, index, response)
    assert "read the checkout" in info["stdout"], info["stdout"]
    assert info["reward"] == 1.0


# --- exactly what a program sees ---------------------------------------------------------------------------------
VISIBLE = r'''
import os, stat, sys

def _try(fn, *args):
    try:
        return fn(*args)
    except OSError as exc:
        return type(exc).__name__

def _kind(mode):
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"), (stat.S_ISCHR, "char")):
        if test(mode):
            return name
    return "other"

def f():
    tree = {}
    for top, dirs, files in os.walk("/"):
        if top == "/":
            dirs[:] = [d for d in dirs if d != "proc"]
        for name in dirs + files:
            path = os.path.join(top, name)
            kind = _kind(os.lstat(path).st_mode)
            tree[path] = os.readlink(path) if kind == "link" else kind
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
    writable = []
    interpreter_dir = os.path.dirname(os.path.realpath(sys.executable))
    for top in ["/", "/usr", "/dev", "/proc", os.path.dirname(os.__file__), interpreter_dir]:
        try:
            with open(os.path.join(top, "written"), "w") as fh:
                fh.write("x")
            writable.append(top)
        except OSError:
            pass
    for top in ["/tmp", "/dev/shm"]:
        with open(os.path.join(top, "written"), "w") as fh:
            fh.write("x")
    with open("/dev/null", "w") as fh:
        fh.write("x")
    fds = {}
    for fd in range(256):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        fds[fd] = [_kind(mode) if not stat.S_ISFIFO(mode) else "pipe", _try(os.readlink, "/proc/self/fd/%d" % fd)]
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    caps = [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
    return {"tree": tree, "mounts": mounts, "writable": writable, "cwd": os.getcwd(), "env": dict(os.environ),
            "uid": os.getuid(), "caps": caps, "no_new_privs": status["NoNewPrivs"].strip(), "fds": fds,
            "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
            "proc_1_root": _try(os.readlink, "/proc/1/root"), "self_root": os.readlink("/proc/self/root")}
'''


def _ancestors(path: str) -> set[str]:
    parts = Path(path).parents
    return {str(p) for p in parts if str(p) != "/"}


@pytest.fixture(params=[pytest.param("full", marks=pytest.mark.sandbox("full")), "userns"])
def level(request, monkeypatch: pytest.MonkeyPatch):
    if request.param == "userns" and sandbox.isolation_level() == "full":
        monkeypatch.setenv("AGENT_RL_SANDBOX", "userns")  # root can also run the unprivileged level: test it too
        sandbox.isolation_level.cache_clear()
    yield request.param
    sandbox.isolation_level.cache_clear()


def test_a_program_sees_exactly_the_documented_allow_list(level):
    result = run_tests(textwrap.dedent(VISIBLE), {"mode": "record", "entry_point": "f", "inputs": [[]]}, LIMITS)
    assert result.isolation == level and result.tests[0]["passed"], (result.tests, result.stderr)
    seen = decode(json.dumps(result.outputs[0]))  # record mode returns the codec's encoding
    layout = sandbox_layout(sandbox_python())
    dirs, files, hidden = layout["dirs"], layout["files"], layout["hide"]
    links = dict(layout["links"])
    # the allow-list itself: the interpreter's standard library, the interpreter, shared libraries; nothing else
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    assert dirs and all(any(d.startswith(p + "/") for p in prefixes) for d in dirs), (dirs, prefixes)
    assert os.path.realpath(sys.base_prefix) not in dirs  # not the whole prefix: bin/, include/, share/ stay out
    assert all(re.search(r"\.so(\.[0-9.]+)?$", Path(f).name) for f in files if f != sandbox_python()), files
    assert sandbox_python() in files and hidden == [p for p in hidden if p.endswith("-packages")]
    assert set(layout["devices"]) <= {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}
    sandbox_own = {"/tmp", "/dev", "/dev/shm", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr",
                   "/tmp/written", "/dev/shm/written", *layout["devices"]}
    allowed_exact = set(files) | set(links) | sandbox_own | set(dirs) | set(hidden)
    allowed_exact |= {a for p in [*files, *links, *dirs] for a in _ancestors(p)}
    outside = sorted(p for p in seen["tree"] if p not in allowed_exact
                     and not any(p.startswith(d + "/") for d in dirs))
    assert outside == [], outside[:20]
    inside_hidden = [p for p in seen["tree"] if any(p.startswith(h + "/") for h in hidden)]
    assert inside_hidden == []  # site-packages: an empty directory
    assert {p: t for p, t in seen["tree"].items() if p in links} == links  # the host's own symlinks, as they are
    assert {p for p, kind in seen["tree"].items() if kind == "char"} == set(layout["devices"])
    # every bound file and directory is there; nothing of the data root, the checkout or the cache
    assert set(files) | set(dirs) <= set(seen["tree"])
    for path in [str(dataset_dir("code")), str(REPO_ROOT), str(cache_dir())]:
        assert not any(p == path or p.startswith(path + "/") for p in seen["tree"]), path
    # the mounts: the read-only root, one per bound path, /proc, the two tmpfs; the host's root is detached
    expected_mounts = {"/", *dirs, *files, *hidden, *layout["devices"], "/proc", "/tmp", "/dev/shm"}
    assert sorted(seen["mounts"]) == sorted(expected_mounts)
    assert seen["writable"] == []
    assert seen["cwd"] == "/tmp" and seen["env"] == clean_env("/tmp") and seen["self_root"] == "/"
    assert seen["caps"] == ["0000000000000000"] * 5 and seen["no_new_privs"] == "1"
    assert seen["pids"] == ["1", "2"]  # the launcher (init) and the program: nothing of the host
    # descriptors: /dev/null (stdin after the program was read, and the worker's own copy), stdout and stderr
    # without a name, the two pipe ends; no directory
    kinds = sorted(kind for kind, _ in seen["fds"].values())
    assert kinds == ["char", "char", "file", "file", "pipe", "pipe"], seen["fds"]
    assert all(target == "/dev/null" for kind, target in seen["fds"].values() if kind == "char")
    assert all(target.endswith("(deleted)") for kind, target in seen["fds"].values() if kind == "file"), seen["fds"]
    if level == "full":
        assert seen["uid"] == result.uids[1] and seen["proc_1_root"] == "PermissionError"

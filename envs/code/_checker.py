"""Checker side of the sandbox: runs the TRUSTED test code against a remote proxy of the program.

Run as ``python -I -S -c <_codec.py + this file> REQ_FD RESP_FD LIMITS_JSON`` with the test spec (JSON) on stdin, in
its own sandbox under a different uid than the worker. The program never runs in this process: the test code calls
:class:`Remote` proxies that forward each call to the worker and get back plain data only. The verdict is written
to this process's original stdout, which the worker has no handle on.

Spec modes:
- ``check`` (HumanEval): ``context`` (the prompt, for helpers such as ``poly``), ``test`` (defines ``check``),
  ``entry_point``. Each top-level statement of ``check`` that asserts about the candidate is one test (it holds an
  ``assert`` and names the candidate, or calls a helper of the test code that asserts); definitions of helpers and
  ``assert True`` are not tests.
- ``asserts`` (MBPP): ``setup`` code, ``asserts`` (list of statements). Each assert is one test; names they use
  that the setup does not define are looked up in the program.
- ``io`` (HumanEval+, EvalPlus semantics): ``inputs``, ``expected`` (encoded), ``atol``; each input is one test.
- ``record``: ``inputs`` only; returns the encoded outputs (used to build HumanEval+ expected outputs).
"""

import ast  # noqa: E402
import builtins  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from envs.code._codec import RefMarker, apply_limits, decode, encode  # sandbox: strip

MAX_REPLY_BYTES = 64 * 1024 * 1024


class WorkerGone(Exception):
    """The worker died, hung past the deadline, or sent garbage: every remaining test fails."""


class RemoteError(Exception):
    """An exception raised by the program whose type is not a builtin exception."""


class Rpc:
    def __init__(self, req_fd, resp_fd, call_timeout_s):
        self.req_fd, self.resp_fd = req_fd, resp_fd
        self.call_timeout_s = call_timeout_s
        self.buf = b""
        self.dead = None

    def recv(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.dead = "timeout"
                raise WorkerGone("timeout")
            ready, _, _ = select.select([self.resp_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.resp_fd, 1 << 20)
            if not chunk:
                self.dead = "crashed"
                raise WorkerGone("crashed")
            self.buf += chunk
            if len(self.buf) > MAX_REPLY_BYTES:
                self.dead = "reply_too_large"
                raise WorkerGone("reply_too_large")
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return decode(line.decode("utf-8"))
        except Exception:
            self.dead = "bad_reply"
            raise WorkerGone("bad_reply")

    def request(self, op, target, *operands):
        if self.dead:
            raise WorkerGone(self.dead)
        msg = [op, target if type(target) is str else {"$ref": target.id}]
        body = [encode(o, 0, _ref_of) for o in operands]
        payload = json.dumps([op, msg[1]] + body, separators=(",", ":")) + "\n"
        data = payload.encode("utf-8")
        try:
            while data:
                _, writable, _ = select.select([], [self.req_fd], [], self.call_timeout_s + 1)
                if not writable:
                    self.dead = "timeout"
                    raise WorkerGone("timeout")
                n = os.write(self.req_fd, data[: 1 << 16])
                data = data[n:]
        except (BrokenPipeError, OSError):
            self.dead = "crashed"
            raise WorkerGone("crashed")
        reply = self.recv(self.call_timeout_s + 1.0)
        if type(reply) is not list or not reply:
            self.dead = "bad_reply"
            raise WorkerGone("bad_reply")
        if reply[0] == "ok" and len(reply) == 2:
            return _wrap(reply[1])
        if reply[0] == "exc" and len(reply) == 3:
            name, message = str(reply[1]), str(reply[2])
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and cls is not StopIteration:
                try:
                    raise cls(message)
                except TypeError:  # exception types with other constructors (UnicodeDecodeError, ...)
                    pass
            raise RemoteError(name + ": " + message)
        self.dead = "bad_reply"
        raise WorkerGone("bad_reply")


RPC = None


class Remote:
    """Proxy for an object that lives in the worker (a global of the program, or a reference)."""

    def __init__(self, target, name):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "__name__", name)

    def __call__(self, *args, **kwargs):
        return RPC.request("call", self._target, list(args), kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return RPC.request("getattr", self._target, name)

    def __setattr__(self, name, value):
        RPC.request("setattr", self._target, name, value)

    def __iter__(self):
        return iter(RPC.request("iter", self._target))

    def __len__(self):
        return RPC.request("len", self._target)

    def __bool__(self):  # `assert f(x)` on a returned re.Match, a custom object, ...
        return RPC.request("bool", self._target) is True

    def __str__(self):
        return RPC.request("str", self._target)

    def __repr__(self):
        return "<remote " + str(self.__name__) + ">"


def _ref_of(value):
    if type(value) is Remote:
        target = value._target
        if type(target) is str:
            raise TypeError("a program global cannot be passed as an argument")
        return {"$ref": target.id}
    raise TypeError("argument of type " + type(value).__name__ + " cannot be sent to the program")


def _wrap(value):
    """Replace reference markers in a decoded reply by Remote proxies."""
    if type(value) is RefMarker:
        return Remote(value, "ref")
    if type(value) is list:
        return [_wrap(v) for v in value]
    if type(value) is tuple:
        return tuple(_wrap(v) for v in value)
    if type(value) is dict:
        return {k: _wrap(v) for k, v in value.items()}
    return value


def _classify(exc):
    if isinstance(exc, WorkerGone):
        return {"timeout": "timeout"}.get(str(exc), "crashed")
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, AssertionError):
        return "wrong_answer"
    return "error"


def _result(name, exc, started):
    out = {"name": name[:200], "passed": exc is None, "status": "passed" if exc is None else _classify(exc),
           "time_s": round(time.monotonic() - started, 4)}
    if exc is not None:
        out["error"] = (type(exc).__name__ + ": " + str(exc))[:300]
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _own_nodes(node):
    """Nodes of ``node`` that run when it runs: not the bodies of functions, lambdas or classes it defines."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(c for c in ast.iter_child_nodes(current) if not isinstance(c, _SCOPES))


def _calls(node, names):
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
               for n in _own_nodes(node))


def _asserting_helpers(tree):
    """Names of the functions in the test code that assert when called (directly, or through another one)."""
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != "check"]
    helpers = set()
    changed = True
    while changed:
        changed = False
        for node in defs:
            if node.name in helpers:
                continue
            body = [n for stmt in node.body for n in _own_nodes(stmt)]
            if any(isinstance(n, ast.Assert) for n in body) or any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in helpers for n in body):
                helpers.add(node.name)
                changed = True
    return helpers


def _is_test(stmt, candidate_names, helpers):
    """A statement of ``check`` is one test when running it asserts something about the candidate: it holds an
    ``assert`` (outside any function it defines) and names the candidate, or it calls an asserting helper.
    A definition (``def h(x, y): assert ...``) is not a test, nor is ``assert True``."""
    if isinstance(stmt, _SCOPES):
        return False
    if _calls(stmt, helpers):
        return True
    own = list(_own_nodes(stmt))
    return any(isinstance(n, ast.Assert) for n in own) and any(
        isinstance(n, ast.Name) and n.id in candidate_names for n in own)


class _Recorder(ast.NodeTransformer):
    """Wrap each test statement of ``check`` (see :func:`_is_test`) in try/except -> __record__(i, exc)."""

    def __init__(self, source, tree, entry_point):
        self.source = source
        self.names = []
        self.helpers = _asserting_helpers(tree)
        self.entry_point = entry_point

    def visit_FunctionDef(self, node):
        if node.name != "check":
            return node
        candidate_names = {self.entry_point} | {a.arg for a in node.args.args[:1]}
        body = []
        for stmt in node.body:
            if not _is_test(stmt, candidate_names, self.helpers):
                body.append(stmt)
                continue
            index = len(self.names)
            self.names.append((ast.get_source_segment(self.source, stmt) or "stmt").strip().splitlines()[0])
            wrapped = ast.parse(
                "__t0__ = __clock__()\n__n0__ = __asserts__[0]\n"
                "try:\n    pass\nexcept BaseException as __exc__:\n"
                f"    __record__({index}, __exc__, __t0__, __n0__)\n"
                f"else:\n    __record__({index}, None, __t0__, __n0__)\n"
            ).body
            wrapped[2].body = [stmt]
            body.extend(wrapped)
        node.body = body
        return node


class _CountAsserts(ast.NodeTransformer):
    """Precede every ``assert`` of the test code with ``__assert_ran__()``: a test statement that raised nothing
    and ran no assertion (a loop over nothing, an ``if`` not taken) checked nothing and is not counted."""

    def visit_Assert(self, node):
        count = ast.Expr(ast.Call(ast.Name("__assert_ran__", ast.Load()), [], []))
        return [ast.copy_location(count, node), node]


def run_check(spec, results):
    """HumanEval ``check`` mode. No test statement at all gives no results (the env scores that ``no_tests``),
    never a made-up passing test; a test statement that passes without running an assertion is not counted."""
    ns = {"__name__": "__test__"}
    exec(compile(spec.get("context", ""), "<context>", "exec"), ns)
    ns[spec["entry_point"]] = Remote(spec["entry_point"], spec["entry_point"])
    tree = ast.parse(spec["test"])
    recorder = _Recorder(spec["test"], tree, spec["entry_point"])
    tree = ast.fix_missing_locations(_CountAsserts().visit(recorder.visit(tree)))
    asserts = [0]

    def record(i, exc, t0, n0):
        if exc is not None or asserts[0] > n0:  # passed without running an assertion: not a test
            results.append(_result(recorder.names[i], exc, t0))

    def assert_ran():
        asserts[0] += 1

    ns.update(__clock__=time.monotonic, __record__=record, __asserts__=asserts, __assert_ran__=assert_ran)
    exec(compile(tree, "<test>", "exec"), ns)
    started = time.monotonic()
    try:
        ns["check"](ns[spec["entry_point"]])
    except BaseException as exc:  # a failing setup statement: count it as one failed test
        results.append(_result("check setup", exc, started))


def _bind_program_names(tree, ns, program_names):
    """Names the test code uses that the test namespace lacks but the program defines -> Remote proxies (before
    builtins: a program may define its own ``sum``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in ns and node.id in program_names:
            ns[node.id] = Remote(node.id, node.id)


def run_asserts(spec, results, program_names):
    ns = {"__name__": "__test__"}
    setup_error = None
    started = time.monotonic()
    try:
        setup_tree = ast.parse(spec.get("setup", ""))
        _bind_program_names(setup_tree, ns, program_names)
        exec(compile(setup_tree, "<setup>", "exec"), ns)
    except BaseException as exc:  # every assert fails with the setup error
        setup_error = exc
    for index, stmt in enumerate(spec["asserts"]):
        if setup_error is not None:
            results.append(_result(stmt.strip()[:200], setup_error, started))
            continue
        started = time.monotonic()
        try:
            tree = ast.parse(stmt)
            _bind_program_names(tree, ns, program_names)
            exec(compile(tree, f"<assert {index}>", "exec"), ns)
            exc = None
        except BaseException as err:
            exc = err
        results.append(_result(stmt.strip()[:200], exc, started))


def _is_floats(x):
    if type(x) is float:
        return True
    if type(x) in (list, tuple) and x:
        return all(type(v) is float for v in x)
    return False


def _close(out, exp, atol):
    """EvalPlus comparison: exact, else (for float outputs) allclose with rtol 1e-7 and atol."""
    if out == exp and type(out) is type(exp):
        return True
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if atol == 0:
        return False
    if type(out) is not type(exp):
        if not (type(out) in (int, float) and type(exp) in (int, float)):
            return False
    if type(exp) in (list, tuple):
        if len(out) != len(exp):
            return False
        return all(_close(o, e, atol) for o, e in zip(out, exp))
    if type(exp) in (int, float) and type(out) in (int, float):
        if math.isnan(exp) or math.isnan(out):
            return math.isnan(exp) and math.isnan(out)
        return abs(out - exp) <= atol + 1e-7 * abs(exp)
    return False


def run_io(spec, results, outputs):
    entry = spec["entry_point"]
    fn = Remote(entry, entry)
    ctx = {"__name__": "__test__"}
    if spec.get("context"):
        exec(compile(spec["context"], "<context>", "exec"), ctx)
    inputs = spec["inputs"]
    expected = spec.get("expected")
    atol = spec.get("atol") or 0
    for index, args in enumerate(inputs):
        started = time.monotonic()
        try:
            out = fn(*copy.deepcopy(args))
            if expected is None:
                outputs.append(encode(out))
                exc = None
            elif entry == "find_zero":  # special oracle (EvalPlus): any root within atol
                assert abs(ctx["poly"](*args, out)) <= (atol or 1e-6), "not a root"
                exc = None
            else:
                assert _close(out, expected[index], atol), "wrong output for input " + str(index)
                exc = None
        except BaseException as err:
            exc = err
            if expected is None:
                outputs.append(None)
        results.append(_result(f"input {index}", exc, started))


def _checker_main():
    global RPC
    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    limits = json.loads(sys.argv[3])
    verdict_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything the test code prints goes to stderr, never into the verdict
    spec = decode(sys.stdin.read())
    apply_limits(limits["checker"])
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    RPC = Rpc(req_fd, resp_fd, limits["call_timeout_s"])
    verdict = {"load_error": None, "tests": [], "outputs": None, "infra": None}
    try:  # the worker's first message comes before any program code runs: without it the sandbox did not start
        started = RPC.recv(limits["load_timeout_s"] + 2.0)
        if type(started) is not list or started != ["started"]:
            raise WorkerGone("bad_reply")
    except WorkerGone as exc:
        verdict["infra"] = "the sandboxed worker did not start (" + str(exc) + ")"
        verdict["worker"] = RPC.dead
        verdict_out.write(json.dumps(verdict, separators=(",", ":")))
        verdict_out.flush()
        return
    try:
        ready = RPC.recv(limits["load_timeout_s"] + 2.0)
        if type(ready) is not list or len(ready) != 3 or ready[0] != "ready":
            raise WorkerGone("bad_reply")
        if ready[1] is not None:
            verdict["load_error"] = [str(ready[1]), str(ready[2])[:500]]
        else:
            program_names = {n for n in ready[2] if type(n) is str} if type(ready[2]) is list else set()
    except WorkerGone as exc:
        verdict["load_error"] = ["WorkerGone", str(exc)]
    results = verdict["tests"]
    if verdict["load_error"] is None:
        mode = spec["mode"]
        if mode == "check":
            run_check(spec, results)
        elif mode == "asserts":
            run_asserts(spec, results, program_names)
        elif mode in ("io", "record"):
            outputs = []
            run_io(spec, results, outputs)
            if mode == "record":
                verdict["outputs"] = outputs
        else:
            raise ValueError("unknown mode " + repr(mode))
    verdict["worker"] = RPC.dead
    verdict_out.write(json.dumps(verdict, separators=(",", ":")))
    verdict_out.flush()


if __name__ == "__main__":
    _checker_main()
    # the verdict is written and flushed: skip the interpreter's teardown, the caller is waiting for this exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

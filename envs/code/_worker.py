"""Worker side of the sandbox: runs the UNTRUSTED program and answers the checker's requests.

Run as ``python -I -S -c <_codec.py + this file> REQ_FD RESP_FD LIMITS_JSON`` (in the sandbox: by its launcher, see
``_launcher.py``) with the program on stdin. Nothing here
is trusted after ``exec(program)``: the program may rewrite any of it. That is fine by design, because the worker
only ever sends *values* (plain data, see ``_codec``) over a pipe; the verdict is computed in the separate checker
process, which never runs program code and never learns anything from the worker but those values.

Requests (one JSON list per line): ``[op, target, *operands]`` with op in call/getattr/setattr/iter/bool/len/str,
target a global name (str) or a reference; replies ``["ok", value]`` or ``["exc", type_name, message]``. Each request runs
under ``signal.setitimer`` so an honest slow call reports ``TimeoutError`` and the next test can still run.
"""

import _sitebuiltins  # noqa: E402  (this file is pasted after _codec.py)
import builtins  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from envs.code._codec import RefMarker, apply_limits, decode, encode  # sandbox: strip


def _on_alarm(signum, frame):
    raise TimeoutError("call exceeded its time limit")


def _worker_main():
    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    limits = json.loads(sys.argv[3])
    apply_limits(limits)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    program = sys.stdin.read()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    reader = os.fdopen(req_fd, "r", encoding="utf-8", newline="\n")
    writer = os.fdopen(resp_fd, "w", encoding="utf-8", newline="\n")
    refs = {}

    streams = (sys.stdout, sys.stderr)

    def send(msg):
        # The program's output so far reaches its file BEFORE the checker hears the reply: once the checker has its
        # verdict the parent kills this process, and block-buffered prints would be lost (the tool output and the
        # result's stdout read empty).
        for stream in (*streams, sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # the program closed or replaced it: nothing of ours to keep
                pass
        writer.write(json.dumps(msg, separators=(",", ":")) + "\n")
        writer.flush()

    def as_ref(value):
        refs[len(refs)] = value
        return {"$ref": len(refs) - 1}

    def unwrap(value):
        if type(value) is RefMarker:
            return refs[value.id]
        if type(value) is list:
            return [unwrap(v) for v in value]
        if type(value) is tuple:
            return tuple(unwrap(v) for v in value)
        if type(value) is dict:
            return {k: unwrap(v) for k, v in value.items()}
        return value

    # The interpreter is up and holds its pipes: say so BEFORE any program code runs, so the checker can tell
    # "the sandbox could not start" (an infrastructure failure, never a reward) from "the program crashed".
    send(["started"])
    signal.signal(signal.SIGALRM, _on_alarm)
    # what ``site`` would add (the sandbox runs without it, -S): exit() and quit() raise SystemExit as usual
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        code = compile(program, "<program>", "exec")
        signal.setitimer(signal.ITIMER_REAL, limits["load_timeout_s"])
        exec(code, namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
        ready = ["ready", None, sorted(k for k in namespace if type(k) is str and not k.startswith("__"))]
    except BaseException as exc:  # SyntaxError, SystemExit, anything: the checker fails every test
        signal.setitimer(signal.ITIMER_REAL, 0)
        ready = ["ready", type(exc).__name__, str(exc)[:500]]
    send(ready)
    if ready[1] is not None:
        return
    call_timeout = limits["call_timeout_s"]
    for line in reader:
        try:
            msg = decode(line)
            op, target = msg[0], msg[1]
            obj = refs[target.id] if type(target) is RefMarker else namespace[target]
            signal.setitimer(signal.ITIMER_REAL, call_timeout)
            if op == "call":
                result = obj(*unwrap(msg[2]), **unwrap(msg[3]))
            elif op == "getattr":
                result = getattr(obj, msg[2])
            elif op == "iter":
                result = list(obj)
            elif op == "setattr":
                result = setattr(obj, msg[2], unwrap(msg[3]))
            elif op == "bool":
                result = bool(obj)
            elif op == "len":
                result = len(obj)
            elif op == "str":
                result = str(obj)
            else:
                raise ValueError("unknown op " + repr(op)[:40])
            signal.setitimer(signal.ITIMER_REAL, 0)
            reply = ["ok", encode(result, 0, as_ref)]
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            reply = ["exc", type(exc).__name__, str(exc)[:500]]
        try:
            send(reply)
        except (TypeError, ValueError, RecursionError) as exc:
            send(["exc", type(exc).__name__, "unsendable result"])


if __name__ == "__main__":
    _worker_main()

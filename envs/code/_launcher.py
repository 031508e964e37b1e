"""Sandbox launcher: PID 1 of one run's namespaces. Builds the program's root filesystem, then runs the program.

Run as ``python -I -S -c <this file + "_launcher_main(LAYOUT)">`` (the layout as a Python literal: no json, whose
import alone costs more than the rest of the launcher) by ``unshare --net --mount --pid --ipc --fork --kill-child
--propagation private`` (``--user --map-root-user`` too at level ``userns``), i.e. as root of fresh namespaces, still
in the host's filesystem. Trusted code; the program only runs after step 3. Steps, each a plain syscall:

1. mount a small tmpfs on ``layout["root"]`` (an empty directory of the caller's run directory) and build the new
   root in it: the symlinks of ``links``, and a read-only, nosuid, nodev bind mount of each path in ``dirs`` and
   ``files`` at the same path (the interpreter, its standard library, the shared libraries it loads);
   an empty read-only tmpfs over each of ``hide`` (the site-packages inside the standard library);
   the device nodes of ``devices`` bound one by one (``/dev/null`` ...); a fresh ``proc`` (this PID namespace's
   processes only); a writable tmpfs on each of ``tmpfs`` (``/tmp``: the program's cwd, ``$HOME`` and ``$TMPDIR``,
   and ``/dev/shm``); then the root tmpfs itself is made read-only;
2. ``pivot_root`` into it and detach the old root: nothing of the host's filesystem stays in this mount namespace;
3. fork. The child drops every capability (bounding, ambient, effective, permitted, inheritable sets), sets
   ``no_new_privs``, switches to ``layout["uid"]`` (real, effective, saved uid and gid; no groups) when one is given,
   and runs ``layout["source"]`` as ``python -I -S -c SOURCE *layout["args"]`` would (a fresh ``__main__``,
   ``sys.argv``, cwd ``layout["cwd"]``), in this same interpreter: no second interpreter start per run. This
   process stays as the namespace's init (the program is never PID 1), reaps orphans, and exits with the child's
   status (128 + signal if it was killed), which takes every process of the namespace down with it.

Any failure before the program runs prints ``sandbox launcher: <step>: <error>`` to stderr and exits 125, so the
caller sees an infrastructure error (the worker never said ``started``), never a judged program.
"""

import _signal  # the C module: ``signal`` imports enum (milliseconds per run)
import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND = 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# pivot_root has no glibc wrapper: syscall numbers per machine (asm-generic for arm64/riscv64)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
                  "s390x": 217, "i686": 217, "i386": 217, "armv7l": 218}
# statvfs f_flag bits -> mount flags the kernel refuses to clear on a bind remount (locked in a user namespace)
_KEPT_FLAGS = {os.ST_NOEXEC: MS_NOEXEC, os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME,
               os.ST_RELATIME: MS_RELATIME}


class LaunchError(Exception):
    pass


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, step):
    if ret != 0:
        err = ctypes.get_errno()
        raise LaunchError(step + ": " + os.strerror(err) + " (errno " + str(err) + ")")


def _mount(source, target, fstype, flags, data, step):
    _check(_libc.mount(None if source is None else source.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), ctypes.c_ulong(flags),
                       None if data is None else data.encode()), step + " " + target)


def _bind(source, target, writable=False):
    """Bind ``source`` on ``target`` (created: a directory or an empty file), then remount it read-only (unless
    ``writable``), nosuid, nodev for files and directories, keeping the flags the source mount already has."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    _mount(source, target, None, MS_BIND, None, "bind " + source + " on")
    kept = os.statvfs(source).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if writable else MS_RDONLY | MS_NODEV)
    flags |= sum(ms for st, ms in _KEPT_FLAGS.items() if kept & st)
    if writable:  # a device node: never exec
        flags |= MS_NOEXEC
    _mount(None, target, None, flags, None, "remount read-only")


def _build_root(layout):
    root = layout["root"]
    os.umask(0o022)  # the directories made here must be searchable by the run's uid, whatever the caller's umask
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755", "mount root tmpfs on")

    def inside(path):
        return root + path

    for path, target in layout["links"]:
        os.makedirs(os.path.dirname(inside(path)), exist_ok=True)
        os.symlink(target, inside(path))
    for path in layout["dirs"] + layout["files"]:
        _bind(path, inside(path))
    for path in layout["hide"]:
        _mount("tmpfs", inside(path), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "size=4k,nr_inodes=1,mode=0555", "hide")
    for path in layout["devices"]:
        _bind(path, inside(path), writable=True)
    os.makedirs(inside("/proc"), exist_ok=True)
    _mount("proc", inside("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount proc on")
    for path, options in layout["tmpfs"]:
        os.makedirs(inside(path), exist_ok=True)
        _mount("tmpfs", inside(path), "tmpfs", MS_NOSUID | MS_NODEV, options, "mount tmpfs on")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        if not os.path.lexists(inside("/dev/" + name)):
            os.symlink(target, inside("/dev/" + name))
    _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None, "remount read-only")
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise LaunchError("pivot_root: unknown syscall number on " + os.uname().machine)
    _check(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_privileges(uid, last_cap):
    """Leave nothing to the program: every capability (bounding, ambient, then effective, permitted, inheritable),
    ``no_new_privs``, and at level full the uid and gid ``uid`` with no supplementary groups."""
    for cap in range(last_cap + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), "drop capability " + str(cap))
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    # no execve follows, so nothing recomputes the sets: empty them (a root of a user namespace keeps them else)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "clear capabilities")
    # what execve would do after a uid change: the process stays inspectable by its own uid (its /proc/self)
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")


def _run_program(layout):
    """In the forked child: become the program, as ``python -I -S -c SOURCE ARGS...`` would start it."""
    os.chdir(layout["cwd"])
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c", *layout["args"]]
    exec(compile(layout["source"], "<string>", "exec"), main.__dict__)


def _launcher_main(layout):
    try:
        for procs in layout.get("cgroup_procs", ()):  # the run's cgroup, before anything of the run is forked
            with open(procs, "w") as f:
                f.write("0")
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
        _build_root(layout)
    except (LaunchError, OSError, ValueError) as exc:
        sys.stderr.write("sandbox launcher: " + str(exc) + "\n")
        sys.stderr.flush()
        os._exit(125)
    child = os.fork()
    if child == 0:
        try:
            _drop_privileges(layout["uid"], last_cap)
        except (LaunchError, OSError) as exc:
            os.write(2, ("sandbox launcher: " + str(exc) + "\n").encode())
            os._exit(125)
        _run_program(layout)
        sys.exit(0)  # the program's end: normal interpreter shutdown (flushes its output)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # init of the namespace: only the child's exit ends it
    for fd in layout["close_fds"]:  # the run's pipes belong to the program: a dead program is an EOF at once
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)

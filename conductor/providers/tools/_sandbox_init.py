"""The sandbox's init (issue #17): runs in a bare helper interpreter, not in the engine.

``conductor.providers.tools.sandbox`` starts ``python -I -S -B -c <this file's source>
<config JSON>``. It unshares the namespaces, builds and enters the read-only root, drops
every capability, starts the program as pid 2 and reports how it ended in the status file.
The module docstring of ``sandbox`` says what the isolation is and why it is built this way.

Stdlib and ``ctypes`` only, and nothing from ``conductor``: the interpreter runs with ``-S``
and its ``sys.path`` is not the engine's. Importing this module (for its source) runs nothing.
"""


def _ns_libc():  # noqa: ANN202 - runs in a bare interpreter
    """libc through ctypes, and a checked call that raises OSError with the C errno."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)

    def call(name, *args):
        if getattr(libc, name)(*args) != 0:
            errno = ctypes.get_errno()
            what = f"syscall {args[0]}" if name == "syscall" else name
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    return libc, call


def _ns_setup_root(cfg, call):  # noqa: ANN001, ANN202
    """In pid 1 of the new namespaces: build the new root on a tmpfs and pivot into it."""
    import ctypes
    import os
    import platform

    TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: N806
    rdonly, nosuid, nodev, noexec, remount, bind, rec, private = (
        1,
        2,
        4,
        8,
        32,
        4096,
        16384,
        1 << 18,
    )
    b = os.fsencode

    def mount(src, dst, fstype, flags, data=None):
        call("mount", src and b(src), b(dst), fstype and b(fstype), flags, data and b(data))

    class MountAttr(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "prop", "userns")]

    def read_only(path, extra, recursive=0x8000):  # AT_RECURSIVE
        """Read-only (mount_setattr, Linux 5.12); else a remount that keeps the other flags."""
        attr = MountAttr(1 | extra, 0, 0, 0)  # MOUNT_ATTR_RDONLY | nosuid/nodev/noexec
        try:
            call("syscall", 442, -100, b(path), recursive, ctypes.byref(attr), ctypes.sizeof(attr))
            return
        except OSError:
            pass
        st = os.statvfs(path)
        keep = st.f_flag & (nosuid | nodev | noexec | 1024 | 2048 | 4096)  # + atime flags
        mount(None, path, None, remount | bind | rdonly | keep)

    def bind_into(root, src, *, writable=False, extra=2):  # extra: MOUNT_ATTR_NOSUID
        dst = root + src
        if os.path.islink(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
            return
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        elif os.path.exists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "a").close()
        else:
            return
        mount(src, dst, None, bind | rec)
        if not writable:
            read_only(dst, extra)

    root = cfg["root"]
    mount(None, "/", None, rec | private)
    mount("tmpfs", root, "tmpfs", nosuid | nodev, "size=1m,nr_inodes=4096,mode=0755")
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        bind_into(root, top)
    os.makedirs(root + "/etc")
    etc = "ld.so.cache ld.so.conf ld.so.conf.d localtime passwd group nsswitch.conf hosts ssl"
    etc += " alternatives mime.types os-release"
    for name in etc.split() + [n for n in os.listdir("/etc") if n.startswith("python3")]:
        bind_into(root, "/etc/" + name)
    os.makedirs(root + "/dev")
    for dev in ("null", "zero", "full", "random", "urandom"):
        bind_into(root, "/dev/" + dev, writable=True)  # device nodes: writing needs no rw fs
    os.symlink("/proc/self/fd", root + "/dev/fd")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", nosuid | nodev | noexec)  # this pid namespace only
    # The scratch space, one tmpfs: /sandbox (cwd and HOME), /tmp, /var/tmp and /dev/shm.
    home, uid, scratch = cfg["home"], cfg["sandbox_uid"], root + "/.scratch"
    os.makedirs(scratch)
    opts = f"size={cfg['scratch_mb']}m,nr_inodes=16384,mode=0755,uid={uid},gid={uid}"
    mount("tmpfs", scratch, "tmpfs", nosuid | nodev, opts)
    for name, mode, places in (("home", 0o700, (home,)), ("tmp", 0o1777, TMP_DIRS)):
        os.mkdir(f"{scratch}/{name}", mode)
        os.chown(f"{scratch}/{name}", uid, uid)
        for place in places:
            os.makedirs(root + place)
            mount(f"{scratch}/{name}", root + place, None, bind)
    # The interpreter's own paths last: one may live under a scratch place (a virtualenv in
    # /tmp), where its read-only bind then sits on top of the scratch tmpfs.
    for path in cfg["binds"]:
        if not os.path.exists(root + path):  # else inside /usr or another bind already
            bind_into(root, path)
    with os.fdopen(cfg["code_fd"], "rb") as src, open(root + home + "/main.py", "wb") as dst:
        dst.write(src.read())
    os.chown(root + home + "/main.py", uid, uid)
    # Enter it; the host root is detached and unreachable from here on.
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(platform.machine())
    if number is None:
        raise OSError(0, f"pivot_root: unsupported machine {platform.machine()}")
    os.mkdir(root + "/.old")
    os.chdir(root)
    call("syscall", number, b".", b".old")
    os.chdir("/")
    call("umount2", b"/.old", 2)  # MNT_DETACH
    os.rmdir("/.old")
    read_only("/", nosuid | nodev, 0)  # not recursive: /sandbox stays writable


# Syscalls the sandboxed program has no use for, by machine (issue #38). Refused with EPERM:
# nested namespaces (unshare, setns; clone with a CLONE_NEW* flag is checked below) and new
# mounts, which would give the program a full capability set in a namespace of its own and a
# tmpfs outside the scratch limit; the kernel keyrings (the session keyring is already a
# fresh one); kernel attack surface no program here needs (bpf, userfaultfd, perf events,
# io_uring). With no memory cgroup, memfd and SysV shared memory too: their pages escape
# RLIMIT_AS. clone3 gets ENOSYS, so libc falls back to clone, whose flags a filter can read.
_NS_SYSCALLS = {
    "x86_64": {
        "arch": 0xC000003E, "clone": 56, "clone3": 435,
        "deny": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
                 "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                 "fsmount": 432, "fspick": 433, "mount_setattr": 442, "keyctl": 250,
                 "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
                 "perf_event_open": 298, "io_uring_setup": 425, "io_uring_enter": 426,
                 "io_uring_register": 427},
        "shm": {"memfd_create": 319, "memfd_secret": 447, "shmget": 29},
    },
    "aarch64": {
        "arch": 0xC00000B7, "clone": 220, "clone3": 435,
        "deny": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                 "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                 "fsmount": 432, "fspick": 433, "mount_setattr": 442, "keyctl": 219,
                 "add_key": 217, "request_key": 218, "bpf": 280, "userfaultfd": 282,
                 "perf_event_open": 241, "io_uring_setup": 425, "io_uring_enter": 426,
                 "io_uring_register": 427},
        "shm": {"memfd_create": 279, "memfd_secret": 447, "shmget": 194},
    },
}  # fmt: skip


def _ns_seccomp_program(machine, deny_shm):  # noqa: ANN001, ANN202
    """The classic-BPF seccomp filter, as (code, jt, jf, k) tuples. Pure: tested directly."""
    table = _NS_SYSCALLS.get(machine)
    if table is None:
        raise OSError(0, f"seccomp: unsupported machine {machine}")
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|…|K, BPF_RET
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_*
    eperm, enosys = errno | 1, errno | 38
    new_ns = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
    new_ns |= 0x40000000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, table["arch"]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI: the same calls under other numbers
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    numbers = dict(table["deny"], **(table["shm"] if deny_shm else {}))
    for number in sorted(set(numbers.values())):
        prog += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, table["clone3"]), (ret, 0, 0, enosys)]
    prog += [
        (jeq, 0, 3, table["clone"]),
        (ld, 0, 0, 16),  # seccomp_data.args[0], low 32 bits (little-endian): the flags
        (jset, 0, 1, new_ns),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    return prog


def _ns_seccomp(libc, call, deny_shm):  # noqa: ANN001, ANN202
    """Install the filter on this thread (inherited by every child, kept across execve)."""
    import ctypes
    import platform

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    rows = _ns_seccomp_program(platform.machine(), deny_shm)
    filters = (Filter * len(rows))(*[Filter(*row) for row in rows])
    program = Program(len(rows), filters)
    call("prctl", 22, 2, ctypes.byref(program), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _ns_join_session_keyring(libc):  # noqa: ANN001, ANN202
    """A new, empty session keyring: the caller's (and its keys) is no longer reachable."""
    import ctypes
    import platform

    number = _NS_SYSCALLS.get(platform.machine(), {}).get("deny", {}).get("keyctl")
    if number is None:
        raise OSError(0, f"keyctl: unsupported machine {platform.machine()}")
    libc.syscall.restype = ctypes.c_long
    serial = libc.syscall(number, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    if serial < 0:
        code = ctypes.get_errno()
        if code not in (38, 1):  # ENOSYS: no keyrings in this kernel; EPERM: refused already
            raise OSError(code, "keyctl(JOIN_SESSION_KEYRING) failed")


def _ns_drop(cfg, libc, call):  # noqa: ANN001, ANN202
    """In pid 2, before exec: rlimits, then no way back to any capability."""
    import ctypes
    import os
    import resource

    for name, value in (
        ("AS", cfg["memory_mb"] * 1024 * 1024),
        ("FSIZE", cfg["fsize"]),
        ("CORE", 0),
        ("NPROC", cfg["nproc"]),
        ("NOFILE", cfg["nofile"]),
    ):
        limit = getattr(resource, "RLIMIT_" + name)
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    # SECBIT_NOROOT(+LOCKED), NO_SETUID_FIXUP_LOCKED, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE(+L)
    call("prctl", 28, 1 | 2 | 8 | 32 | 64 | 128, 0, 0, 0)  # PR_SET_SECUREBITS
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        call("prctl", 24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    # The program (and all it forks) is the first victim when the memory cgroup is full, not
    # the init or the helper that report how it ended. Raising the score needs no privilege.
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("1000")
    uid = cfg["sandbox_uid"]
    if cfg["setgroups"]:
        os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    call("capset", header, (ctypes.c_uint32 * 6)())  # effective, permitted, inheritable: none
    call("prctl", 47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    _ns_join_session_keyring(libc)
    _ns_seccomp(libc, call, cfg["deny_shm"])  # last: from here on, no keyctl or prctl games


def _ns_main():  # noqa: ANN202
    """The helper: unshare, map ids, fork pid 1 (setup, then pid 2 = the program), wait."""
    import json
    import os
    import select
    import signal
    import sys

    cfg = json.loads(sys.argv[1])
    status = os.fdopen(cfg["status_fd"], "w", buffering=1)
    os.set_inheritable(cfg["status_fd"], False)
    os.set_inheritable(cfg["code_fd"], False)

    def fail(message):
        status.write(f"error: {message}\n")
        status.flush()
        os._exit(111)

    try:
        libc, call = _ns_libc()
        call("prctl", 1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the caller
    except OSError as exc:
        fail(f"cannot load libc for unshare(2) ({exc.strerror})")
    if os.getppid() != cfg["parent"]:
        os._exit(112)  # the caller is already gone
    if cfg["cgroup_procs"]:  # before anything else: every process of the sandbox is charged
        try:
            with open(cfg["cgroup_procs"], "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as exc:
            fail(f"cannot join the sandbox's memory cgroup ({exc.strerror})")
    host_uid, host_gid = os.geteuid(), os.getegid()
    root_host = host_uid == 0
    mapper = None
    if root_host:  # a helper left in the host namespace writes the maps (it has CAP_SETUID)
        ready_r, ready_w = os.pipe()
        mapper = os.fork()
        if mapper == 0:
            os.close(ready_w)
            if os.read(ready_r, 1) != b"u":
                os._exit(1)
            target = os.getppid()
            try:  # ns uid 0 = host root for the setup; ns uid 1 = nobody runs the program
                for kind in ("uid", "gid"):
                    with open(f"/proc/{target}/{kind}_map", "w") as fh:
                        fh.write("0 0 1\n1 65534 1\n")
            except OSError:
                os._exit(2)
            os._exit(0)
        os.close(ready_r)
    flags = 0x10000000 | 0x00020000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x20000000
    try:  # CLONE_NEWUSER | NEWNS | NEWNET | NEWIPC | NEWUTS | NEWPID
        call("unshare", flags)
    except OSError as exc:
        if mapper:
            os.kill(mapper, signal.SIGKILL)
        fail(
            f"cannot create user namespaces (unshare: {exc.strerror}); enable them "
            "(sysctl user.max_user_namespaces=15000 and kernel.unprivileged_userns_clone=1; "
            "Ubuntu 24.04: kernel.apparmor_restrict_unprivileged_userns=0; containers: a "
            "seccomp profile that allows unshare)"
        )
    try:
        if mapper:
            os.write(ready_w, b"u")
            os.close(ready_w)
            if os.waitpid(mapper, 0)[1] != 0:
                fail("cannot write the uid/gid maps of the new user namespace")
        else:
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"0 {host_uid} 1"),
                ("gid_map", f"0 {host_gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
    except OSError as exc:
        fail(f"cannot map ids in the new user namespace ({exc.strerror})")
    cfg["sandbox_uid"], cfg["setgroups"] = (1, True) if root_host else (0, False)

    init = os.fork()
    if init == 0:  # pid 1 of the new pid namespace
        try:
            call("prctl", 1, signal.SIGKILL, 0, 0, 0)  # dies with the helper
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _ns_setup_root(cfg, call)
        except OSError as exc:
            fail(f"cannot set up the sandbox's filesystem ({exc})")
        program = os.fork()
        if program == 0:
            try:
                _ns_drop(cfg, libc, call)
                os.chdir(cfg["home"])
                argv = [cfg["python"], "-I", "-B", "-u", "-X", "utf8", "main.py"]
                os.execve(cfg["python"], argv, cfg["env"])
            except OSError as exc:
                fail(f"cannot drop privileges or start the interpreter in the sandbox ({exc})")
        while True:  # reap orphans until the program itself ends
            pid, code = os.waitpid(-1, 0)
            if pid == program:
                break
        if os.WIFSIGNALED(code):
            status.write(f"signal {os.WTERMSIG(code)}\n")
        else:
            status.write(f"exit {os.WEXITSTATUS(code)}\n")
        status.flush()
        os._exit(0)  # the kernel now kills what is left in the namespace
    timed_out = False
    try:
        fd = os.pidfd_open(init)
        timed_out = not select.select([fd], [], [], cfg["timeout_s"])[0]
    except OSError:
        signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, cfg["timeout_s"])
        try:
            os.waitpid(init, 0)
            init = 0
        except InterruptedError:
            timed_out = True
    if timed_out:
        os.kill(init, signal.SIGKILL)  # from outside its namespace: pid 1 is not immune
        status.write("timeout\n")
        status.flush()
    if init:
        os.waitpid(init, 0)  # returns once every process of the namespace is gone
    os._exit(0)


# --- code extraction --------------------------------------------------------------------------


if __name__ == "__main__":
    _ns_main()

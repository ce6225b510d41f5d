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
    uid = cfg["sandbox_uid"]
    if cfg["setgroups"]:
        os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    call("capset", header, (ctypes.c_uint32 * 6)())  # effective, permitted, inheritable: none
    call("prctl", 47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


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
                fail(f"cannot start the interpreter in the sandbox ({exc})")
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

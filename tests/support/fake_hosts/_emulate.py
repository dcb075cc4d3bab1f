"""Emulated hosts on this machine, for DeepSpeed's multi-node runner: stand-ins for ``pdsh`` and ``ssh`` (put this
folder first on PATH). A "remote" command runs here, in a new UTS namespace whose hostname is the host's name (so
``socket.gethostname()`` in a rank says where it was sent) and with a fresh login-like environment (HOME, PATH,
USER, LOGNAME, SHELL and the names listed in ``$FAKE_SSH_ENV``, as a remote shell's rc file would set them): only what
DeepSpeed exports itself reaches the ranks, as over real ssh.

Pick host names that resolve to this machine's loopback (``localhost``, ``127.0.0.2``, ...; see docs/export.md).
``pkill`` commands (DeepSpeed's clean-up on a signal) are not run: on one shared machine they would hit processes of
other "hosts" and of other users; the caller kills its own process group instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _unshare_prefix() -> list[str]:
    unshare = shutil.which("unshare") or "unshare"
    if os.geteuid() == 0:
        return [unshare, "--uts"]
    return [unshare, "--user", "--map-root-user", "--uts"]


def host_argv(host: str, command: str) -> list[str]:
    """Run ``command`` (a shell string) on emulated ``host``: own hostname, login-like environment."""
    keep = {k: os.environ[k] for k in ("HOME", "USER", "LOGNAME") if k in os.environ}
    for name in filter(None, os.environ.get("FAKE_SSH_ENV", "").split(",")):
        if name in os.environ:
            keep[name] = os.environ[name]
    env = [f"{k}={v}" for k, v in {**keep, "PATH": LOGIN_PATH, "SHELL": "/bin/sh"}.items()]
    inner = 'hostname "$1" && shift && exec env -i "$@"'
    return [*_unshare_prefix(), "/bin/sh", "-c", inner, "sh", host, *env, "/bin/sh", "-c", command]


def _pump(host: str, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"{host}: ".encode() + line)
        out.flush()


def pdsh(argv: list[str]) -> int:
    """``pdsh [-S] [-f N] [-R rcmd] -w h1,h2 command...``: the command on every host at once (``%n`` = the host's
    position in the list, ``%h`` = its name); exit status the largest of the hosts' (pdsh -S)."""
    hosts: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag in ("-f", "-R", "-l", "-u", "-t"):
            i += 2
            continue
        if flag == "-w":
            hosts = [h for h in argv[i + 1].split(",") if h]
            i += 2
            continue
        i += 1  # -S and other switches
    words = argv[i:]
    if not hosts or not words:
        sys.stderr.write("fake pdsh: need -w HOSTS and a command\n")
        return 2
    if words[0].strip().startswith("pkill"):
        sys.stderr.write("fake pdsh: not running pkill on emulated hosts\n")
        return 0
    command = " ".join(words)
    procs, pumps = [], []
    for n, host in enumerate(hosts):
        cmd = command.replace("%n", str(n)).replace("%h", host)
        p = subprocess.Popen(host_argv(host, cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        t = threading.Thread(target=_pump, args=(host, p.stdout, sys.stdout.buffer), daemon=True)
        t.start()
        procs.append(p)
        pumps.append(t)
    codes = [p.wait() for p in procs]
    for t in pumps:
        t.join(timeout=5)
    return max((c if c >= 0 else 128 - c) for c in codes)


def ssh(argv: list[str]) -> int:
    """``ssh [-o opt] [-p port] host command...``: the command on emulated ``host``."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in ("-o", "-p", "-l", "-i", "-F") else 1
    if i >= len(argv):
        sys.stderr.write("fake ssh: no host\n")
        return 255
    host, words = argv[i], argv[i + 1:]
    if not words:
        sys.stderr.write("fake ssh: interactive logins are not emulated\n")
        return 255
    return subprocess.call(host_argv(host, " ".join(words)), stdin=subprocess.DEVNULL)

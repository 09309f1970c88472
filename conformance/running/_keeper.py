"""The keeper: a tiny process between the harness and one worker that kills the worker's whole tree.

Run as ``python -I -S _keeper.py FD -- COMMAND...`` by :mod:`pagedprefix.conformance.running.lifetime`
(standard library only, so that it starts in milliseconds and imports nothing of the project). It

1. makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphan below it, a
   grandchild that called ``setsid`` or double-forked included, is reparented to it, so the
   worker's whole tree stays below the keeper;
2. starts ``COMMAND`` (the worker) with ``PR_SET_PDEATHSIG(SIGKILL)`` (the worker dies if the
   keeper does) on the keeper's stdin, stdout and stderr, reports ``ok PID`` (or ``error
   MESSAGE`` when it cannot be started) on the socket ``FD``, and lets go of its own copies of
   stdin and stdout (so that the harness reads end-of-file as soon as the worker's tree is gone);
3. waits until the worker exits, the harness closes its end of the socket, or the harness dies
   (the kernel closes the harness's end then: this is what survives a ``SIGKILL`` of the harness);
4. then kills (``SIGKILL``) every process below it and in its process group, reaping them, until it
   has no child left (as a subreaper, no child means no descendant), and exits with the worker's
   status (a worker killed by a signal: the keeper kills itself with the same signal).

The helpers here (:func:`descendants`, :func:`kill_tree`, :func:`set_subreaper`,
:func:`set_parent_death_signal`) are shared with :mod:`pagedprefix.conformance.running.lifetime`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable

LINUX = sys.platform.startswith("linux")
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_TIMEOUT = 10.0
"""Seconds :func:`kill_tree` keeps killing and reaping before it gives up (a process stuck in the
kernel cannot be killed sooner)."""


def _prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)`` through the C library; ``False`` where there is none or it fails."""
    if not LINUX:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_subreaper() -> bool:
    """Make this process a child subreaper (Linux 3.4+): orphans below it reparent to it, not to
    init. ``False`` where that is not possible (other platforms)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(signum: int, parent: int) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent exits (Linux
    ``PR_SET_PDEATHSIG``), then close the race with a parent that is already gone: if the parent is
    no longer ``parent``, exit now. Elsewhere only the check is made."""
    _prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os._exit(128 + signum)


def _table() -> Iterable[tuple[int, int, int]]:
    """``(pid, ppid, pgid)`` of every live process (zombies left out)."""
    if os.path.isdir("/proc/self"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) < 3 or fields[0] in (b"Z", b"X"):
                continue
            yield int(name), int(fields[1]), int(fields[2])
        return
    try:  # macOS and the BSDs
        text = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "pgid=", "-o", "stat="],
                              capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and not parts[3].startswith("Z"):
            yield int(parts[0]), int(parts[1]), int(parts[2])


def descendants(root: int, group: int | None = None) -> list[int]:
    """Live processes below ``root`` (children, their children, ...), and those in process group
    ``group`` if given; ``root`` itself left out. Read from ``/proc`` (``ps`` where there is none)."""
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for pid, ppid, pgid in _table():
        children.setdefault(ppid, []).append(pid)
        if group is not None and pgid == group:
            found.add(pid)
    seen = {root, *found}
    todo = [root, *found]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            if child not in seen:
                seen.add(child)
                todo.append(child)
    found.discard(root)
    return sorted(found)


def kill_tree(root: int, group: int | None = None, timeout: float = KILL_TIMEOUT) -> None:
    """``SIGKILL`` every process :func:`descendants` finds, again and again (a process may fork
    while it is being killed; its orphans reparent to a subreaper ``root``), reaping this process's
    own children when ``root`` is this process, until none is left or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    me = os.getpid()
    while True:
        pids = descendants(root, group)
        for pid in pids:
            if pid != me:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if root == me:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] != 0:
                    pass
        if not [p for p in pids if p != me] or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _watch(sock: socket.socket, worker: subprocess.Popen[bytes]) -> int | None:
    """Wait for the worker to exit (its status) or the harness to let go (``None``)."""
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(worker.pid)  # type: ignore[attr-defined,unused-ignore]
    try:
        while True:
            fds: list[int] = [sock.fileno()] + ([pidfd] if pidfd >= 0 else [])
            ready, _, _ = select.select(fds, [], [], None if pidfd >= 0 else 0.05)
            if sock.fileno() in ready:
                try:
                    data = sock.recv(64)
                except OSError:
                    data = b""
                if not data:
                    return None
            status = worker.poll()
            if status is not None:
                return status
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks after boot, from ``/proc``; ``None`` where unknown),
    to tell a process from a later one that got its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def watch(root: int, sock: socket.socket, every: float = 0.5) -> None:
    """Note every new process below ``root`` (not one there when the watch began; ``ok`` is sent on
    ``sock`` once those are known) each ``every`` seconds until ``sock`` reads end-of-file (``root``
    let go of it, exited or was killed), then kill each noted process still alive (the same start
    time: not a reuse of its pid) and every process below it now. For what does not stay
    below its starter: a local Ray cluster's daemons reparent to ``init`` when the harness dies."""
    me = os.getpid()
    noted: dict[int, str | None] = {}
    before = set(descendants(root))  # what was there already is not the body's to end
    sock.sendall(b"ok\n")
    while True:
        ready, _, _ = select.select([sock], [], [], every)
        if ready:
            try:
                data = sock.recv(64)
            except OSError:
                data = b""
            if not data:
                break
        for pid in descendants(root):
            if pid != me and pid not in noted and pid not in before:
                noted[pid] = start_time(pid)
    for _ in range(3):
        alive = [pid for pid, started in noted.items() if start_time(pid) == started and started is not None]
        if not alive:
            return
        for pid in alive:
            for victim in [pid, *descendants(pid)]:
                if victim != me:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(victim, signal.SIGKILL)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    """``FD -- COMMAND...``: keep ``COMMAND``; the exit status is the worker's. ``--watch PID FD``:
    :func:`watch` the processes below ``PID``."""
    if len(argv) == 3 and argv[0] == "--watch":
        with contextlib.suppress(KeyboardInterrupt):
            watch(int(argv[1]), socket.socket(fileno=int(argv[2])))
        return 0
    if len(argv) < 3 or argv[1] != "--":
        print("usage: _keeper.py FD -- COMMAND... | _keeper.py --watch PID FD", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    me = os.getpid()
    set_subreaper()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop)
    status: int | None = None
    worker: subprocess.Popen[bytes] | None = None
    try:
        try:
            def child() -> None:
                set_parent_death_signal(signal.SIGKILL, me)

            worker = subprocess.Popen(argv[2:], preexec_fn=child)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            sock.sendall(f"error {exc}\n".encode(errors="replace"))
            return 127
        sock.sendall(f"ok {worker.pid}\n".encode())
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        status = _watch(sock, worker)
    finally:
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(OSError):
                worker.kill()
        kill_tree(me, os.getpgrp())
    if status is None:
        return 0
    if status < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-status, signal.SIG_DFL)
        os.kill(me, -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

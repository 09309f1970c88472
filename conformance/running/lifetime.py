"""No process outlives a run: how the harness starts, watches and ends every process it makes.

Exit paths of the harness (``pagedprefix ...``) and what ends its processes on each:

- **normal end, an error, SIGINT** (``KeyboardInterrupt``), **SIGTERM, SIGHUP**:
  :func:`harness_setup` (called by the console entry point) turns SIGTERM and SIGHUP into
  :class:`Terminated`, a ``SystemExit`` with the conventional status ``128 + signum``, so that
  every ``finally`` block and ``atexit`` hook runs; each engine or indexer server is closed by its
  owner (:class:`~pagedprefix.conformance.running.subprocess_adapter.JsonLinesProcess`), and at exit
  :func:`kill_descendants` kills whatever is still below the harness. The harness is a child
  subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a grandchild that left its session
  (``setsid``) or double-forked is reparented to the harness and is found there.
- **SIGKILL of the harness** (no handler runs): a child the harness forks from its main thread
  (the supervised run, :mod:`pagedprefix.conformance.running.supervise`) has ``PR_SET_PDEATHSIG(SIGKILL)``
  and dies with it. Every JSON-lines server runs below a *keeper*
  (:mod:`pagedprefix.conformance.running._keeper`, started by :func:`start_kept`), a tiny process that is
  itself a subreaper, holds one end of a socket pair whose other end only the harness holds, and
  kills the server's whole tree (reparented daemons included) the moment that socket reads
  end-of-file: when the harness closes it, exits or is killed. Pool workers of ``sweep`` get
  :func:`worker_setup`: ``PR_SET_PDEATHSIG(SIGKILL)`` (they die with the harness) and their own
  process group. A local Ray cluster (``sweep --executor ray``) runs under
  :func:`watching_descendants`: a watcher notes the processes below the harness twice a second and
  kills them when the harness goes (Ray's daemons do not stay below it once it is gone).

The keeper also ends the tree when the server itself exits (a daemon a server spawned does not
outlive it), and exits with the server's status, so that the harness sees a dead server at once:
its stdout reads end-of-file as soon as the server's tree is gone, whatever a daemon inherited.

Other platforms (macOS, the BSDs): there is no subreaper and no parent-death signal. The keeper
and its socket work the same, so a server's process tree and process group are killed on every
exit path, SIGKILL of the harness included; but a grandchild that left the server's process group
*and* was orphaned (``setsid`` after a double fork) is reparented to ``launchd``/``init`` and is
out of reach, and a ``sweep`` pool worker outlives a SIGKILLed harness until its next read of the
task pipe fails. Windows is not supported (the JSON-lines channel needs ``select`` on pipes).
Nothing on any platform reaches a process started through another service (``systemd-run``,
``at``, a container runtime), or one that a descendant ptrace-detaches.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

from ..protocol.watchdog import harness_signal, note_harness_signal
from ._keeper import LINUX, descendants, kill_tree, set_parent_death_signal, set_subreaper

__all__ = [
    "LINUX",
    "KeptProcess",
    "Terminated",
    "descendants",
    "harness_setup",
    "kill_descendants",
    "kill_tree",
    "received",
    "start_kept",
    "watching_descendants",
    "worker_setup",
]

KEEPER = Path(__file__).with_name("_keeper.py")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals :func:`harness_setup` turns into an orderly exit (SIGINT already is one)."""


class Terminated(SystemExit):
    """The harness got SIGTERM or SIGHUP (``signum``); its exit status is ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"terminated by {signal.Signals(self.signum).name}"


_setup: list[bool] = []
_received: list[int] = []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for other in STOP_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(other, signal.SIG_IGN)
    _received.append(signum)
    note_harness_signal(signum)  # the harness's own stop, not a candidate's exit
    raise Terminated(signum)


def received() -> int | None:
    """The stop signal (SIGTERM, SIGHUP) this process got, by :func:`harness_setup`'s handler or
    forwarded by a supervising parent (:func:`pagedprefix.conformance.protocol.watchdog.harness_signal`);
    ``None``: none. A library that turns the handler's :class:`Terminated` into an exception of its
    own (Ray's ``wait`` raises ``SystemExit(1)``) cannot hide it: the entry point asks here."""
    if _received:
        return _received[0]
    signum = harness_signal()
    return signum if signum in STOP_SIGNALS else None


_forked_from: list[int] = []


def _before_fork() -> None:
    _forked_from[:] = [os.getpid()] if threading.current_thread() is threading.main_thread() else []


def _after_fork_in_child() -> None:
    if _forked_from:  # a fork of the harness's main thread (the supervised run): it dies with it
        set_parent_death_signal(signal.SIGKILL, _forked_from[0])


def kill_descendants(timeout: float = 5.0) -> None:
    """``SIGKILL`` every live process below this one (reaping this process's children), until none
    is left or ``timeout`` seconds pass."""
    kill_tree(os.getpid(), None, timeout)


def harness_setup() -> None:
    """Make this process the harness of a run (idempotent; the console entry point calls it):
    a child subreaper on Linux, SIGTERM and SIGHUP raise :class:`Terminated` (main thread only),
    :func:`kill_descendants` runs at interpreter exit (after every hook registered later, e.g. each
    server's own ``kill``), and a child forked by the main thread (``os.fork``: the supervised run
    of :mod:`pagedprefix.conformance.running.supervise`) gets ``PR_SET_PDEATHSIG(SIGKILL)``, so that a
    SIGKILL of the harness ends it too (and, through the keepers' sockets, every server it
    started)."""
    if _setup:
        return
    _setup.append(True)
    set_subreaper()
    for signum in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: left as it is
            signal.signal(signum, _on_signal)
    atexit.register(kill_descendants)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def worker_setup(parent: int) -> None:
    """Set-up for a worker process the harness (pid ``parent``) starts with ``multiprocessing``:
    its own process group (a terminal's ^C reaches the harness only, which ends the workers
    itself), and ``SIGKILL`` when the harness dies (Linux; checked against ``parent`` to close the
    race with a harness that is already gone)."""
    os.setpgrp()
    set_parent_death_signal(signal.SIGKILL, parent)


def _spawn_keeper(
    keeper_args: Callable[[str], list[str]], **popen: Any
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start the keeper script in a new session with ``keeper_args(fd)`` (``fd``: the keeper's end
    of a fresh socket pair, passed to it and closed here) and the other ``Popen`` arguments; the
    keeper's process and this side's socket."""
    mine, theirs = socket.socketpair()
    try:
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            [sys.executable, "-I", "-S", str(KEEPER), *keeper_args(str(theirs.fileno()))],
            start_new_session=True,
            pass_fds=(theirs.fileno(),),
            **popen,
        )
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    return proc, mine


@contextlib.contextmanager
def watching_descendants() -> Iterator[None]:
    """While the body runs, a watcher process (:func:`pagedprefix.conformance.running._keeper.watch`, in a
    new session) notes every new process below this one (not those there before) twice a second;
    when the body ends, or this process dies (SIGKILL included), it kills those still alive and
    everything below them. For
    processes that do not stay below their starter (a local Ray cluster's GCS and raylet reparent to
    ``init`` when the harness dies); one started less than half a second before a SIGKILL can be
    missed."""
    watcher, mine = _spawn_keeper(
        lambda fd: ["--watch", str(os.getpid()), fd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        with contextlib.suppress(OSError):  # no report: the body runs unwatched
            _read_report(mine, 60.0)
        yield
    finally:
        mine.close()
        try:
            watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()


class KeptProcess:
    """A command running below a keeper: ``proc`` is the keeper (its status is the command's),
    ``pid`` the command itself. :meth:`end` kills the command's whole tree."""

    def __init__(self, proc: subprocess.Popen[bytes], life: socket.socket, pid: int) -> None:
        self.proc = proc
        self.pid = pid
        self._life = life

    def end(self, timeout: float = 5.0) -> None:
        """Kill the command and every process below it (idempotent): let go of the keeper's socket,
        wait ``timeout`` seconds for the keeper to finish, then kill the keeper's process group."""
        with contextlib.suppress(OSError):
            self._life.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.proc.wait(timeout=timeout)


def start_kept(
    argv: list[str],
    *,
    stdin: Any = None,
    stdout: Any = None,
    stderr: IO[bytes] | int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> KeptProcess:
    """Start ``argv`` below a keeper (in a new session), with the given stdin, stdout, stderr
    (``subprocess.Popen`` forms) and environment. The keeper's report is awaited ``timeout``
    seconds. Raises ``OSError`` when the command cannot be started (the message is ``Popen``'s,
    e.g. ``[Errno 2] No such file or directory: 'x'``) or the keeper does not report."""
    proc, mine = _spawn_keeper(
        lambda fd: [fd, "--", *argv], stdin=stdin, stdout=stdout, stderr=stderr, env=env
    )
    kept = KeptProcess(proc, mine, 0)
    try:
        report = _read_report(mine, timeout)
    except BaseException:
        kept.end()
        raise
    word, _, rest = report.partition(" ")
    if word == "ok" and rest.isdigit():
        kept.pid = int(rest)
        return kept
    kept.end()
    raise OSError(rest if word == "error" else f"the process keeper reported {report!r:.200}")


def _read_report(sock: socket.socket, timeout: float) -> str:
    data = b""
    while b"\n" not in data:
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            raise OSError(f"the process keeper did not report within {timeout:g} s")
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the process keeper exited before it started the command")
        data += chunk
    return data.partition(b"\n")[0].decode(errors="replace")

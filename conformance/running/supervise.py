"""No verdict without a finished run: a command's run in a supervised child process.

An in-process candidate (pagedprefix's own engines, ``--in-process``, a ``replay --engine``
factory, an indexer) runs in the harness's own process, so it can end that process: ``os._exit(0)``,
a fatal signal, a crash in native code. Left alone, the harness then exits with whatever status
the candidate chose, ``0`` included: a PASS that judged nothing. :func:`supervised` closes that
door. The command's run is forked into a child; the child reports its exit status to the parent
over a pipe as its very last act, and the parent exits with that status only when it arrived. A
child that ends without one is a FAIL of the candidate: one line on stderr
(``pagedprefix replay: FAIL: the run ended before its verdict: its process exited with status 0
...``), exit status 1.

Inside the child, a ``SystemExit`` or another ``BaseException`` that reaches the top of the run is
the candidate's too (the commands end with ``typer.Exit``; pagedprefix's own code raises no
``SystemExit`` while a candidate runs): a FAIL of the candidate, one line naming what was raised
and where. The harness's own interrupts are not: Ctrl-C (SIGINT) reaches the child through the
terminal's process group and ends it as an interrupt (status 130); SIGINT, SIGTERM and SIGHUP sent
to the parent are forwarded to the child, whose handlers end the run in order
(:func:`pagedprefix.conformance.protocol.watchdog.note_harness_signal`; a second SIGINT within a second of
the first, as a terminal's Ctrl-C delivers to both, is not a second interrupt).

The parent also holds the two bounds a user states (docs/SECURITY.md "Time budget and signals"),
whatever the candidate does in the child (a C extension that holds the GIL, a stuck clean-up):

- **the time budget**: a command given ``budget`` seconds (``--time-budget``) ends within
  ``budget + BUDGET_SLACK`` seconds. The child stops itself at the budget
  (:func:`pagedprefix.conformance.protocol.watchdog.run_budget`) and reports what it judged; if it
  has not ended :data:`BUDGET_SLACK` seconds later, the parent kills it, says so in one line, and
  exits 3 (incomplete);
- **signals**: after SIGINT, SIGTERM or SIGHUP the command ends within :data:`SIGNAL_GRACE`
  seconds: the child gets the signal and that long to end in order, then it is killed; the exit
  status is ``128 + signum`` (130 for Ctrl-C). Every engine process ends with it (the keepers,
  :mod:`pagedprefix.conformance.running.lifetime`).

The fork is made only where it is safe and useful: on a platform with ``os.fork``, when standard
output and standard error are the process's own file descriptors 1 and 2 (so the child's output
reaches the same place; a caller that captured them in Python objects, e.g. ``typer.testing.CliRunner``,
gets the run in its own process, unsupervised), and when the process has no child yet (a worker
started before the fork would answer to the parent, not to the child that drives it: the commands
start their engines and indexers inside the run). ``PAGEDPREFIX_NO_SUPERVISE=1`` turns it off.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

import typer

from ..protocol.watchdog import (
    candidate_exit,
    harness_signal,
    harness_signalled,
    harness_signals,
    note_harness_signal,
    run_budget,
)

DISABLE_ENV = "PAGEDPREFIX_NO_SUPERVISE"
BUDGET_SLACK = 15.0
"""Seconds past its time budget after which a run that has not ended is killed (exit 3)."""
SIGNAL_GRACE = 5.0
"""Seconds a run has to end after a stop signal (SIGINT, SIGTERM, SIGHUP) before it is killed."""
POLL = 0.1
"""Seconds between the parent's checks of those two bounds."""
FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _real_fd(stream: object, fd: int) -> bool:
    fileno = getattr(stream, "fileno", None)
    if not callable(fileno):
        return False
    try:
        return bool(fileno() == fd)
    except (OSError, ValueError, AttributeError):
        return False


def has_children() -> bool:
    """Whether this process has live child processes (Linux: ``/proc``; elsewhere ``False``)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                if f.read().strip():
                    return True
        except OSError:
            continue
    return False


def can_supervise() -> bool:
    """Whether :func:`supervised` forks here (module docstring)."""
    return (
        not has_children()
        and hasattr(os, "fork")
        and threading.current_thread() is threading.main_thread()
        and os.environ.get(DISABLE_ENV, "") != "1"
        and _real_fd(sys.stdout, 1)
        and _real_fd(sys.stderr, 2)
    )


def supervised(body: Callable[[], int], command: str, budget: float | None = None) -> int:
    """Run ``body`` (the run of ``pagedprefix COMMAND``; it returns the exit status) in a child
    process and return the status it reported, or 1 (after one line on stderr) when the child
    ended without reporting one. ``budget``: the run's time budget in seconds: the child runs
    under it, and is killed :data:`BUDGET_SLACK` seconds after it (status 3). Runs ``body`` here,
    unsupervised (with the budget, without the hard bounds), where :func:`can_supervise` is false.
    Never raises for what the child does."""
    if not can_supervise():
        with run_budget(budget):
            return _guarded_body(body, command)
    hard_stop = None if budget is None else time.monotonic() + budget + BUDGET_SLACK
    _signalled_at.clear()
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, and never return into the caller
        os.close(read_end)
        code = 1
        try:
            with run_budget(budget):
                code = _guarded_body(body, command)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            with contextlib.suppress(OSError):
                os.write(write_end, f"{code}\n".encode())
            os._exit(code)
    os.close(write_end)
    with _forwarding(pid):
        reported, killed = _await(read_end, pid, hard_stop)
        status = _wait(pid)
    if killed == "budget":
        print(
            f"pagedprefix {command}: INCOMPLETE: the time budget of {budget:g} s ran out and the run "
            f"had not ended {BUDGET_SLACK:g} s later: it was killed, with every engine process",
            file=sys.stderr,
        )
        return 3
    try:
        return int(reported.strip())
    except ValueError:
        pass
    signum = harness_signal()
    if signum is not None:  # the harness was told to stop, and the child went with it
        name = signal.Signals(signum).name
        print(f"pagedprefix {command}: stopped by {name} before its verdict", file=sys.stderr)
        return 128 + signum
    print(
        f"pagedprefix {command}: FAIL: the run ended before its verdict: its process {_how(status)} "
        "(the candidate ended it: os._exit, a signal, or a crash in native code)",
        file=sys.stderr,
    )
    return 1


def supervised_command(run: Callable[[], object], command: str, budget: float | None = None) -> NoReturn:
    """Run a typer command's ``run`` (which ends normally, or with ``typer.Exit(code)``) under
    :func:`supervised` (with its time ``budget``), and end the command with the status it reported."""

    def body() -> int:
        try:
            run()
        except typer.Exit as done:
            return int(done.exit_code)
        return 0

    raise typer.Exit(supervised(body, command, budget))


def _guarded_body(body: Callable[[], int], command: str) -> int:
    """``body()``, with a ``BaseException`` escaping it turned into the candidate's FAIL (1) or,
    for the harness's own interrupt, its conventional status (130, or 128 + the signal)."""
    try:
        with harness_signals():
            return body()
    except BaseException as exc:
        if harness_signalled():
            if isinstance(exc, KeyboardInterrupt):
                print(f"pagedprefix {command}: interrupted", file=sys.stderr)
                return 130
            if isinstance(exc, SystemExit) and isinstance(exc.code, int):
                return exc.code
            return 1
        exited = candidate_exit("", exc)
        if exited is None:  # an Exception: a defect of pagedprefix; show it, fail
            traceback.print_exc()
            return 1
        print(f"pagedprefix {command}: FAIL: {' '.join(str(exited).split())}", file=sys.stderr)
        return 1


def _await(fd: int, pid: int, hard_stop: float | None) -> tuple[str, str]:
    """What the child reports on ``fd`` until it closes it, and why the parent killed the child
    (``"budget"``: past ``hard_stop``; ``"signal"``: :data:`SIGNAL_GRACE` after a stop signal;
    ``""``: it was not killed)."""
    chunks = []
    killed = ""
    killed_at = 0.0
    with contextlib.suppress(OSError):
        while True:
            if not killed:
                killed = _past_bound(hard_stop)
                if killed:
                    killed_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            elif time.monotonic() > killed_at + 2.0:  # a process that inherited the pipe keeps it open
                break
            ready, _, _ = select.select([fd], [], [], POLL)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("ascii", "replace"), killed


def _past_bound(hard_stop: float | None) -> str:
    now = time.monotonic()
    if _signalled_at and now > _signalled_at[0] + SIGNAL_GRACE:
        return "signal"
    if hard_stop is not None and now > hard_stop and not _signalled_at:
        return "budget"
    return ""


_signalled_at: list[float] = []
"""When the parent got its first stop signal (monotonic clock)."""


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            name = signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            name = f"signal {os.WTERMSIG(status)}"
        return f"was killed by {name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


@contextlib.contextmanager
def _forwarding(pid: int) -> Iterator[None]:
    """While the parent waits, SIGINT, SIGTERM and SIGHUP are forwarded to the child."""

    def forward(signum: int, frame: FrameType | None) -> None:
        note_harness_signal(signum)
        if not _signalled_at:
            _signalled_at.append(time.monotonic())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)

    previous = {}
    for signum in FORWARDED:
        previous[signum] = signal.signal(signum, forward)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

"""Never hang on an engine: per-call time limits, and what a call that does not return becomes.

Two ways an engine is called (``pagedprefix.conformance.running.suite.load_engine`` picks):

- **In a worker process** (the default for every engine that is not one of pagedprefix's own):
  the engine is served by ``python -m pagedprefix.conformance.running.jsonl_server`` in its own process
  group, and every reply must come within the call limit; otherwise the whole group is killed
  and the call raises :class:`EngineHung`. Nothing an engine does (an endless loop in C, a
  deadlock, ``os._exit``) can stop the suite.
- **In this process** (pagedprefix's own engines, or ``--in-process``): :func:`call_limit` arms a
  ``SIGALRM`` timer around each call on the main thread, which interrupts Python code (loops,
  sleeps, lock waits) with :class:`EngineHung`. Code that holds the GIL inside a C extension is
  not interrupted: use the worker for engines you do not trust.

**The run's time budget** (``--time-budget``) bounds the whole run, not only the stateful
examples: :func:`run_budget` sets a deadline (on the monotonic clock, so a forked worker shares
it), every guarded call and every wait on a worker is cut at it (:func:`time_left`), and the call
running when it passes raises :class:`BudgetSpent`. That is an :class:`EngineLost` (it ends the run
the same way, through the same handlers) that the runners record as *incomplete* (exit 3), never as
a FAIL of the engine: the engine did nothing wrong, the user's budget ran out.

Either way :class:`EngineHung` ends the run: the report gets a FAIL row (``engine-errors``:
"allocate did not return within 10 s") and the suite stops, because the engine's state is
unknown from then on.

**A candidate that exits** ends the run the same way, as :class:`EngineExited` (both are
:class:`EngineLost`): a worker process that exits, is killed by a signal or closes its output, and
an in-process call that raises a ``BaseException`` that is not an ``Exception`` (``SystemExit(0)``,
``KeyboardInterrupt``, ``GeneratorExit``, a bare ``BaseException``). Such a run is a FAIL (exit 1),
never a PASS: :func:`candidate_exit` makes the distinction at every candidate boundary. A real
interrupt of the harness (Ctrl-C, SIGTERM, SIGHUP) is not the candidate's doing: the harness's
signal handlers record it (:func:`note_harness_signal`, :func:`harness_signals`), and the exception
it raises passes through to stop the run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType

DEFAULT_CALL_TIMEOUT = 10.0
"""Seconds an adapter call (operation, observation, ``step``) may take."""
DEFAULT_START_TIMEOUT = 120.0
"""Seconds a worker may take to import the engine and build an adapter (``hello``, ``create``)."""


class EngineLost(Exception):
    """The engine can no longer be judged (it hung or exited): the run ends here, as a FAIL.
    ``detail``: what more is known (a traceback, the engine's stderr), or ``""``."""

    detail: str = ""


class EngineHung(EngineLost):
    """An adapter call did not return within its limit."""

    def __init__(self, call: str, seconds: float, detail: str = "") -> None:
        self.call = call
        self.seconds = seconds
        self.detail = detail
        super().__init__(f"{call} did not return within {seconds:g} s" + (f" ({detail})" if detail else ""))


class EngineExited(EngineLost):
    """The candidate ended the run during ``call``: its process exited (``how``: ``exit status 0``,
    ``killed by SIGKILL``) or the call raised a ``BaseException`` that is not an ``Exception``
    (``how``: ``raised SystemExit(0)``)."""

    def __init__(self, call: str, how: str, detail: str = "") -> None:
        self.call = call
        self.how = how
        self.detail = detail
        during = f" during {call}" if call else ""
        super().__init__(f"the engine ended the run{during}: {how}")


class BudgetSpent(EngineLost):
    """The run's time budget (:func:`run_budget`) ran out during ``call`` (``""``: between calls):
    the run ends here as *incomplete*, not as a FAIL of the engine."""

    def __init__(self, call: str = "", budget: float | None = None) -> None:
        self.call = call
        self.budget = budget
        during = f" during {call}" if call else ""
        of = f" of {budget:g} s" if budget is not None else ""
        super().__init__(f"the time budget{of} ran out{during}")


_deadline: list[tuple[float, float] | None] = [None]
"""The innermost :func:`run_budget`: ``(deadline on time.monotonic(), budget in seconds)``."""


@contextlib.contextmanager
def run_budget(seconds: float | None) -> Iterator[None]:
    """In the body, the run may take ``seconds`` more (``None``: no new limit). Nested budgets
    keep the earlier deadline: an inner run never outlasts the outer one."""
    old = _deadline[0]
    if seconds is not None:
        deadline = time.monotonic() + seconds
        if old is None or deadline < old[0]:
            _deadline[0] = (deadline, seconds)
    try:
        yield
    finally:
        _deadline[0] = old


def time_left() -> float | None:
    """Seconds left of the current :func:`run_budget` (at most 0 once it passed); ``None``: none."""
    current = _deadline[0]
    return None if current is None else current[0] - time.monotonic()


def budget_seconds() -> float | None:
    """The budget (seconds) of the current :func:`run_budget`, for messages; ``None``: none."""
    current = _deadline[0]
    return None if current is None else current[1]


def check_budget(call: str = "") -> None:
    """Raise :class:`BudgetSpent` if the current :func:`run_budget` has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise BudgetSpent(call, budget_seconds())


def within_budget(call: str, seconds: float | None) -> tuple[float | None, bool]:
    """How long a wait for ``call`` may last: ``seconds`` cut at the budget's deadline, and whether
    the budget is what cut it (a wait that ends then raises :class:`BudgetSpent`, not a hang).
    Raises :class:`BudgetSpent` when no time is left."""
    check_budget(call)
    left = time_left()
    if left is not None and (seconds is None or left < seconds):
        return left, True
    return seconds, False


_signalled: list[int] = []


def note_harness_signal(signum: int) -> None:
    """Record that the harness itself was signalled (its handlers call this before raising), so
    that the exception the signal raises is not taken for the candidate's."""
    _signalled.append(signum)


def harness_signalled() -> bool:
    """Whether the harness received an interrupt or termination signal in this process."""
    return bool(_signalled)


def harness_signal() -> int | None:
    """The last signal the harness recorded (:func:`note_harness_signal`), or ``None``."""
    return _signalled[-1] if _signalled else None


_last_interrupt: list[float] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _last_interrupt and now - _last_interrupt[-1] < 1.0:
        return  # the same Ctrl-C, delivered again (the terminal and a supervising parent)
    _last_interrupt.append(now)
    note_harness_signal(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def harness_signals() -> Iterator[None]:
    """In the body, Ctrl-C (SIGINT) is recorded as the harness's (:func:`note_harness_signal`)
    before it raises ``KeyboardInterrupt`` as usual. Only on the main thread, and only where the
    handler is Python's default one (a handler of the caller's is left alone)."""
    if not _armed_main() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _origin(exc: BaseException) -> str:
    """``file:line`` of the frame that raised ``exc`` (the innermost of its traceback)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def candidate_exit(call: str, exc: BaseException) -> EngineExited | None:
    """The :class:`EngineExited` that ``exc``, raised by a candidate's ``call``, stands for; ``None``
    when it is an ``Exception`` (judged as usual) or the harness's own interrupt (it must stop the
    run: :func:`harness_signalled`)."""
    if isinstance(exc, Exception) or harness_signalled():
        return None
    args = ", ".join(repr(a) for a in exc.args)
    where = _origin(exc)
    how = f"raised {type(exc).__name__}({args})" + (f" at {where}" if where else "")
    return EngineExited(call, how, describe_exception(exc))


_limit: list[float | None] = [None]


def in_process_limit() -> float | None:
    """The limit :func:`call_limit` applies to in-process calls now (``None``: none)."""
    return _limit[0]


@contextlib.contextmanager
def limit_in_process_calls(seconds: float | None) -> Iterator[None]:
    """Apply ``seconds`` to every in-process adapter call made in the body (see :func:`guarded`)."""
    old = _limit[0]
    _limit[0] = seconds
    try:
        yield
    finally:
        _limit[0] = old


def _armed_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _armed() -> bool:
    return _armed_main() and hasattr(signal, "setitimer")


@contextlib.contextmanager
def call_limit(call: str, seconds: float | None) -> Iterator[None]:
    """Raise :class:`EngineHung` in the calling (main) thread if the body runs over ``seconds``,
    and :class:`BudgetSpent` if it runs past the run's budget (:func:`run_budget`) first; the
    budget is checked on entry too (so it ends a run between calls on any thread).

    A no-op when there is neither limit, off the main thread, or where ``SIGALRM`` is missing.
    Nested limits are not supported (the outer one is suspended).
    """
    wait, by_budget = within_budget(call, seconds)
    if wait is None or not _armed():
        yield
        return
    spent = BudgetSpent(call, budget_seconds()) if by_budget else None
    limit = wait

    def fire(signum: int, frame: FrameType | None) -> None:
        raise spent if spent is not None else EngineHung(call, limit)

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(min(wait, 1e6), 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exception_summary(exc: BaseException) -> str:
    """``Type: message`` (an exception relayed from an engine process is already in that form)."""
    if isinstance(getattr(exc, "remote_traceback", None), str):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` and the traceback, for a report row."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    remote = getattr(exc, "remote_traceback", None)
    if isinstance(remote, str) and remote:
        text += "\n\nin the engine process:\n" + remote.rstrip()
    return text


def guarded(call: str, *, start: bool = False) -> contextlib.AbstractContextManager[None]:
    """:func:`call_limit` with the current in-process limit; ``start`` (a factory call, which may
    import the engine, as a worker's ``create`` does) gets at least :data:`DEFAULT_START_TIMEOUT`:
    an alarm in the middle of a first import would leave the engine's modules half-imported and
    every later call failing (a false FAIL on a loaded machine)."""
    seconds = _limit[0]
    if start and seconds is not None:
        seconds = max(seconds, DEFAULT_START_TIMEOUT)
    return call_limit(call, seconds)

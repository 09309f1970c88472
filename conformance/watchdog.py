"""Never hang on an engine: per-call time limits, and what a call that does not return becomes.

Two ways an engine is called (``pagedprefix.conformance.suite.load_engine`` picks):

- **In a worker process** (the default for every engine that is not one of pagedprefix's own):
  the engine is served by ``python -m pagedprefix.conformance.jsonl_server`` in its own process
  group, and every reply must come within the call limit; otherwise the whole group is killed
  and the call raises :class:`EngineHung`. Nothing an engine does (an endless loop in C, a
  deadlock, ``os._exit``) can stop the suite.
- **In this process** (pagedprefix's own engines, or ``--in-process``): :func:`call_limit` arms a
  ``SIGALRM`` timer around each call on the main thread, which interrupts Python code (loops,
  sleeps, lock waits) with :class:`EngineHung`. Code that holds the GIL inside a C extension is
  not interrupted: use the worker for engines you do not trust.

Either way :class:`EngineHung` ends the run: the report gets a FAIL row (``engine-errors``:
"allocate did not return within 10 s") and the suite stops, because the engine's state is
unknown from then on.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Iterator
from types import FrameType

DEFAULT_CALL_TIMEOUT = 10.0
"""Seconds an adapter call (operation, observation, ``step``) may take."""
DEFAULT_START_TIMEOUT = 120.0
"""Seconds a worker may take to import the engine and build an adapter (``hello``, ``create``)."""


class EngineHung(Exception):
    """An adapter call did not return within its limit."""

    def __init__(self, call: str, seconds: float, detail: str = "") -> None:
        self.call = call
        self.seconds = seconds
        self.detail = detail
        super().__init__(f"{call} did not return within {seconds:g} s" + (f" ({detail})" if detail else ""))


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


def _armed() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


@contextlib.contextmanager
def call_limit(call: str, seconds: float | None) -> Iterator[None]:
    """Raise :class:`EngineHung` in the calling (main) thread if the body runs over ``seconds``.

    A no-op when ``seconds`` is ``None``, off the main thread, or where ``SIGALRM`` is missing.
    Nested limits are not supported (the outer one is suspended).
    """
    if seconds is None or not _armed():
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        raise EngineHung(call, seconds)

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, 1e6))
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


def guarded(call: str) -> contextlib.AbstractContextManager[None]:
    """:func:`call_limit` with the current in-process limit."""
    return call_limit(call, _limit[0])

"""Judging a KV indexer against the reference: the same adversarial streams, answer by answer.

:func:`judge_scenario` plays one :class:`~pagedprefix.cluster.streams.Scenario` through the
candidate and through :class:`~pagedprefix.cluster.indexer.ReferenceIndexer` in lockstep, as the
harness of a fleet would: every delivered batch goes to both (``events``); a source an indexer
asks to resync (``events`` returned ``True``) gets, at the scenario's next ``Settle``, a full resync
from the replica's real ``cached_keys()`` now (:class:`~pagedprefix.cluster.streams.Truth`); every
``Query`` is put to both. The replicas' real indexes are tracked alongside.

An answer for a source is accepted when it equals the reference's, or the replica's real answer
(an indexer is never blamed for being right where the rules are blind, e.g. a loss not yet
visible); when the reference holds the source out of sync (``None``), the candidate must answer
``None`` too, or the real answer. Anything else is a :class:`Finding`: a wrong number (stale,
double-counted, cleared too late), a number for a source it should not answer for, ``None`` where
the reference answers, a missing source, an answer of the wrong type, or an exception or time-out
of the candidate. The first finding ends the scenario.

**The candidate boundary.** Everything the candidate runs (building it, ``events``, ``resync``,
``query``, reading its answers, ``close``) is called inside one boundary that turns *any*
``BaseException`` into a finding naming the call: ``SystemExit`` (``SystemExit(0)`` included),
``KeyboardInterrupt`` and ``GeneratorExit`` raised by the candidate are a FAIL of the candidate,
never the harness's own exit. Only the user's Ctrl-C stops the run: while :func:`judge` runs on the
main thread it installs a ``SIGINT`` handler that marks the interrupt as the user's before raising
``KeyboardInterrupt``; such an interrupt passes the boundary (the command exits 130). An
in-process candidate that calls ``os._exit`` or dies by a signal ends the process itself: the
``indexer-conform`` command runs its judging in a supervised child
(:mod:`pagedprefix.conformance.running.supervise`), so that too is a FAIL (exit 1, one line). A candidate
that installs its own ``SIGINT`` handler is beyond any boundary: run untrusted indexers in the
worker process (the default), where a dead process is a finding with its exit status.

**One limit per candidate.** A candidate that hung
(:class:`~pagedprefix.conformance.protocol.watchdog.EngineHung`: a call ran over its limit, so its
state is unknown) or whose process is gone
(:class:`~pagedprefix.conformance.running.subprocess_adapter.EngineProcessError`) is failed once;
the scenarios after it are *not run* (:attr:`Verdict.ran` false), so a hung candidate costs one
time limit, not one per scenario. A run that judged no scenario is never a pass (:func:`all_passed`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import TypeVar

from pagedprefix.conformance.protocol.watchdog import BudgetSpent, EngineHung, check_budget, time_left
from pagedprefix.conformance.running.lifetime import Terminated, received
from pagedprefix.conformance.running.subprocess_adapter import EngineProcessError
from pagedprefix.spec.events import REMOVAL_MODELS, EventBatch

from .indexer import IndexerConfig, KVIndexer, ReferenceIndexer
from .streams import Publish, Query, Redeliver, Restart, Scenario, Settle, Truth, in_removal_model

IndexerFactory = Callable[[IndexerConfig], KVIndexer]
T = TypeVar("T")

FATAL: tuple[type[BaseException], ...] = (EngineHung, EngineProcessError)
"""Exceptions after which the candidate is not called again (module docstring)."""


@dataclass(frozen=True)
class Finding:
    """Where a candidate first departs from the reference in one scenario.

    Attributes:
        scenario: its name.
        step: index of the step in the scenario (0-based).
        source: the source whose answer is wrong (``None`` for an exception).
        message: one line saying what was expected and what came.
    """

    scenario: str
    step: int
    source: str | None
    message: str
    fatal: bool = False

    def __str__(self) -> str:
        where = f" {self.source}" if self.source else ""
        return f"{self.scenario} step {self.step}{where}: {self.message}"


@dataclass
class Verdict:
    """The outcome of one scenario: its finding (``None``: passed), queries judged, resyncs asked.
    ``ran`` is false for a scenario not run because the candidate hung or died before it
    (``not_run`` says where); such a scenario has not passed."""

    scenario: Scenario
    finding: Finding | None = None
    queries: int = 0
    candidate_resyncs: int = 0
    reference_resyncs: int = 0
    ran: bool = True
    not_run: str = ""
    budget: bool = False
    """Not run because the run's time budget ran out (``--time-budget``: incomplete, exit 3)."""
    removal: str = "per_copy"
    """The removal model the candidate assumes (``removal_model``), which the streams were played in."""

    @property
    def passed(self) -> bool:
        return self.ran and self.finding is None

    @property
    def status(self) -> str:
        """``PASS``, ``FAIL`` or ``NOT RUN``."""
        return "NOT RUN" if not self.ran else "PASS" if self.finding is None else "FAIL"


def all_passed(verdicts: Iterable[Verdict]) -> bool:
    """Whether at least one scenario was judged and every scenario passed (so zero judged is a
    failure, never a pass)."""
    verdicts = list(verdicts)
    return bool(verdicts) and all(v.passed for v in verdicts)


@dataclass
class _Subscriber:
    """An indexer under the harness, with the sources it asked to resync."""

    indexer: KVIndexer
    pending: set[str] = field(default_factory=set)
    resyncs: int = 0

    def deliver(self, source: str, batch: EventBatch) -> None:
        if self.indexer.events(source, batch):
            self.pending.add(source)

    def settle(self, truths: Mapping[str, Truth]) -> None:
        for source in sorted(self.pending):
            truth = truths[source]
            self.indexer.resync(source, truth.seq, Counter(truth.index))
            self.resyncs += 1
        self.pending.clear()


class _Stop(Exception):
    def __init__(self, finding: Finding) -> None:
        self.finding = finding


_user_interrupted = [False]
_depth = [0]


@contextlib.contextmanager
def user_interrupts() -> Iterator[None]:
    """While the body runs on the main thread, a ``SIGINT`` delivered to this process is marked as
    the user's before ``KeyboardInterrupt`` is raised, so that the
    candidate boundary lets it through; a ``KeyboardInterrupt`` the candidate raises itself is not
    marked and becomes a finding. Off the main thread, or inside another such body: a no-op."""
    if threading.current_thread() is not threading.main_thread() or _depth[0]:
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        _user_interrupted[0] = True
        raise KeyboardInterrupt

    _user_interrupted[0] = False
    previous = signal.signal(signal.SIGINT, on_sigint)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        signal.signal(signal.SIGINT, previous)
        _user_interrupted[0] = False


def interrupted_by_user() -> bool:
    """Inside a :func:`user_interrupts` body: whether the user's ``SIGINT`` has arrived."""
    return _user_interrupted[0]


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _boundary(scenario: Scenario, n: int, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` (candidate code); any ``BaseException`` but the user's Ctrl-C and the run's spent
    time budget (:class:`BudgetSpent`, checked first) becomes a finding."""
    check_budget(what)
    try:
        result = fn()
    except (_Stop, BudgetSpent):
        raise
    except BaseException as exc:
        if _user_interrupted[0]:
            raise KeyboardInterrupt from None  # the user's, whatever the candidate made of it
        stop = received()
        if stop is not None:  # the harness's SIGTERM or SIGHUP: it ends the run, not a finding
            raise Terminated(stop) from None
        fatal = isinstance(exc, FATAL)
        raise _Stop(Finding(scenario.name, n, None, f"{what} raised {_short(exc)}", fatal)) from None
    if _user_interrupted[0]:
        raise KeyboardInterrupt  # the candidate swallowed the user's Ctrl-C: it still stops the run
    return result


def _describe(value: object) -> str:
    return "None" if value is None else repr(value)


def _check_answer(source: str, got: object, ref: int | None, real: int) -> str | None:
    """Why ``got`` is not an acceptable answer for ``source`` (module docstring), or ``None``."""
    if got is not None and (type(got) is not int or got < 0):
        return f"answered {got!r:.200}, not an int >= 0 or None"
    if got in (real, ref):
        return None
    if ref is None:
        return (f"answered {_describe(got)} while the reference holds the source out of sync "
                f"(expected None until resynced, or the replica's real {real})")
    if got is None:
        return f"answered None where the reference answers {ref} (the replica really holds {real})"
    return f"answered {got} tokens; the reference answers {ref} (the replica really holds {real})"


def _judge_query(scenario: Scenario, n: int, query: Query, candidate: _Subscriber,
                 reference: ReferenceIndexer, truths: Mapping[str, Truth]) -> None:
    groups = scenario.config.groups
    expected = reference.query(query.keys, query.num_tokens)
    answers = _boundary(scenario, n, "query", partial(candidate.indexer.query, query.keys, query.num_tokens))
    if not _boundary(scenario, n, "reading the query's answer", partial(isinstance, answers, Mapping)):
        what = f"query returned {type(answers).__name__}, not a mapping"
        raise _Stop(Finding(scenario.name, n, None, what))
    for source in scenario.config.sources:
        # A Mapping of the candidate's runs its code in ``in`` and ``[]``: inside the boundary.
        got = _boundary(scenario, n, "reading the query's answer",
                        partial(_answer_of, answers, source))
        if got is _MISSING:
            raise _Stop(Finding(scenario.name, n, source, "no answer for this source"))
        real = truths[source].answer(groups, query)
        why = _check_answer(source, got, expected[source], real)
        if why is not None:
            raise _Stop(Finding(scenario.name, n, source, why))


_MISSING = object()


def _answer_of(answers: Mapping[str, object], source: str) -> object:
    return answers.get(source, _MISSING)


def judge_scenario(factory: IndexerFactory, scenario: Scenario) -> Verdict:
    """Play ``scenario`` through a candidate built by ``factory`` and the reference (module
    docstring); the verdict holds the first :class:`Finding`, if any. The candidate's exceptions
    (a time-out included) are findings; the reference's own would be a bug here and propagate."""
    verdict = Verdict(scenario)
    try:
        built = _boundary(scenario, 0, "building the indexer", partial(factory, scenario.config))
        candidate = _Subscriber(built)
        removal = _boundary(scenario, 0, "reading removal_model", partial(removal_model_of, built))
    except _Stop as stop:
        verdict.finding = stop.finding
        return verdict
    verdict.removal = removal
    played = in_removal_model(scenario, removal)
    reference = _Subscriber(ReferenceIndexer(scenario.config, removal))
    truths = {s: Truth(removal=removal) for s in scenario.config.sources}
    try:
        for n, step in enumerate(played.steps):
            if isinstance(step, Publish):
                truths[step.source].publish(step.batch)
            elif isinstance(step, Restart):
                truths[step.source] = Truth(removal=removal)
            if isinstance(step, (Publish, Redeliver)) and (not isinstance(step, Publish) or step.delivered):
                reference.deliver(step.source, step.batch)
                _boundary(scenario, n, "events", partial(candidate.deliver, step.source, step.batch))
            elif isinstance(step, Settle):
                reference.settle(truths)
                _boundary(scenario, n, "resync", partial(candidate.settle, truths))
            elif isinstance(step, Query):
                verdict.queries += 1
                assert isinstance(reference.indexer, ReferenceIndexer)
                _judge_query(scenario, n, step, candidate, reference.indexer, truths)
    except _Stop as stop:
        verdict.finding = stop.finding
    finally:
        left = time_left()
        spent = left is not None and left <= 0  # the budget ran out: no clean-up call either
        if not spent and (verdict.finding is None or not verdict.finding.fatal):  # nor to a hung one
            try:
                _boundary(scenario, len(scenario.steps), "close", partial(_close, candidate.indexer))
            except _Stop as stop:
                verdict.finding = verdict.finding or stop.finding
    verdict.candidate_resyncs = candidate.resyncs
    verdict.reference_resyncs = reference.resyncs
    return verdict


def removal_model_of(indexer: object) -> str:
    """The removal model an indexer assumes (SEMANTICS.md section 9): its ``removal_model``
    attribute, ``"per_copy"`` when it has none. Raises ``ValueError`` for anything but one of
    :data:`~pagedprefix.spec.events.REMOVAL_MODELS`."""
    model = getattr(indexer, "removal_model", "per_copy")
    if not isinstance(model, str) or model not in REMOVAL_MODELS:
        raise ValueError(f"removal_model is {model!r:.80}, not one of {REMOVAL_MODELS}")
    return model


def _close(indexer: object) -> None:
    close = getattr(indexer, "close", None)
    if callable(close):
        close()


def judge(factory: IndexerFactory, scenarios: Iterable[Scenario]) -> list[Verdict]:
    """:func:`judge_scenario` for each scenario, in order, until the candidate hangs or dies (a
    fatal finding, module docstring) or the run's time budget runs out (the scenario in flight and
    those after it are not run, ``budget`` set). The user's Ctrl-C (:func:`user_interrupts`)
    raises ``KeyboardInterrupt``."""
    verdicts: list[Verdict] = []
    lost: Finding | None = None
    spent: BudgetSpent | None = None
    with user_interrupts():
        for s in scenarios:
            if lost is not None:
                verdicts.append(Verdict(s, ran=False, not_run=f"the indexer hung or died in {lost.scenario}"))
                continue
            if spent is not None:
                verdicts.append(Verdict(s, ran=False, not_run=f"not run: {spent}", budget=True))
                continue
            try:
                verdict = judge_scenario(factory, s)
            except BudgetSpent as exc:  # the run's --time-budget: this one and the rest are not run
                spent = exc
                verdicts.append(Verdict(s, ran=False, not_run=f"not run: {spent}", budget=True))
                continue
            verdicts.append(verdict)
            if verdict.finding is not None and verdict.finding.fatal:
                lost = verdict.finding
    return verdicts

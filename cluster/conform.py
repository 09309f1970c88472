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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from pagedprefix.spec.events import EventBatch

from .indexer import IndexerConfig, KVIndexer, ReferenceIndexer
from .streams import Publish, Query, Redeliver, Restart, Scenario, Settle, Truth

IndexerFactory = Callable[[IndexerConfig], KVIndexer]


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

    def __str__(self) -> str:
        where = f" {self.source}" if self.source else ""
        return f"{self.scenario} step {self.step}{where}: {self.message}"


@dataclass
class Verdict:
    """The outcome of one scenario: its finding (``None``: passed), queries judged, resyncs asked."""

    scenario: Scenario
    finding: Finding | None = None
    queries: int = 0
    candidate_resyncs: int = 0
    reference_resyncs: int = 0

    @property
    def passed(self) -> bool:
        return self.finding is None


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


def _describe(value: object) -> str:
    return "None" if value is None else repr(value)


def _check_answer(source: str, got: object, ref: int | None, real: int) -> str | None:
    """Why ``got`` is not an acceptable answer for ``source`` (module docstring), or ``None``."""
    if got is not None and (type(got) is not int or got < 0):
        return f"answered {got!r}, not an int >= 0 or None"
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
    try:
        answers = candidate.indexer.query(query.keys, query.num_tokens)
    except Exception as exc:
        raise _Stop(Finding(scenario.name, n, None, f"query raised {type(exc).__name__}: {exc}")) from None
    if not isinstance(answers, Mapping):
        what = f"query returned {type(answers).__name__}, not a mapping"
        raise _Stop(Finding(scenario.name, n, None, what))
    for source in scenario.config.sources:
        if source not in answers:
            raise _Stop(Finding(scenario.name, n, source, "no answer for this source"))
        real = truths[source].answer(groups, query)
        why = _check_answer(source, answers[source], expected[source], real)
        if why is not None:
            raise _Stop(Finding(scenario.name, n, source, why))


def _call(scenario: Scenario, n: int, what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except _Stop:
        raise
    except Exception as exc:
        raise _Stop(Finding(scenario.name, n, None, f"{what} raised {type(exc).__name__}: {exc}")) from None


def judge_scenario(factory: IndexerFactory, scenario: Scenario) -> Verdict:
    """Play ``scenario`` through a candidate built by ``factory`` and the reference (module
    docstring); the verdict holds the first :class:`Finding`, if any. The candidate's exceptions
    (a time-out included) are findings; the reference's own would be a bug here and propagate."""
    verdict = Verdict(scenario)
    reference = _Subscriber(ReferenceIndexer(scenario.config))
    truths = {s: Truth() for s in scenario.config.sources}
    try:
        candidate = _Subscriber(factory(scenario.config))
    except Exception as exc:
        what = f"building the indexer raised {type(exc).__name__}: {exc}"
        verdict.finding = Finding(scenario.name, 0, None, what)
        return verdict
    try:
        for n, step in enumerate(scenario.steps):
            if isinstance(step, Publish):
                truths[step.source].publish(step.batch)
            elif isinstance(step, Restart):
                truths[step.source] = Truth()
            if isinstance(step, (Publish, Redeliver)) and (not isinstance(step, Publish) or step.delivered):
                reference.deliver(step.source, step.batch)
                _call(scenario, n, "events", partial(candidate.deliver, step.source, step.batch))
            elif isinstance(step, Settle):
                reference.settle(truths)
                _call(scenario, n, "resync", partial(candidate.settle, truths))
            elif isinstance(step, Query):
                verdict.queries += 1
                assert isinstance(reference.indexer, ReferenceIndexer)
                _judge_query(scenario, n, step, candidate, reference.indexer, truths)
    except _Stop as stop:
        verdict.finding = stop.finding
    finally:
        close = getattr(candidate.indexer, "close", None)
        if callable(close):
            close()
    verdict.candidate_resyncs = candidate.resyncs
    verdict.reference_resyncs = reference.resyncs
    return verdict


def judge(factory: IndexerFactory, scenarios: Iterable[Scenario]) -> list[Verdict]:
    """:func:`judge_scenario` for each scenario, in order."""
    return [judge_scenario(factory, s) for s in scenarios]

"""Key channels: the inputs of an engine that affect its cache key or its KV-cache events.

A verdict covers only what the adapter reaches. So each adapter declares, as data, every input of
its engine that changes a block's key or what its events publish (a *channel*: vLLM's
``lora_request``, ``cache_salt``, ``mm_features``, ...; SGLang's ``extra_key``, ``cache_salt``,
``lora_id``, ...), whether it drives it, which of the spec's extra kinds travels through it, and,
for one it does not drive, why. ``pagedprefix matrix`` prints a "Channels" table per engine from
these declarations, and ``pagedprefix matrix --check`` fails when a channel declared as driven was
never reached by any example of the engine's runs (conformance/README.md, "Declaring channels").

Declaring: decorate the factory (or set a ``channels`` attribute on a factory class)::

    @declare_channels((
        Channel("cache_salt", "Request(cache_salt=...)", True, "cache_salt", "the spec's salt"),
        Channel("mm_features", "Request(mm_features=...)", False, None, "needs the mm processor"),
    ))
    def my_engine(config: CacheConfig) -> MyAdapter: ...

Reaching: while a suite run records (:func:`recording`), the driver notes every ``allocate`` and
``lookup`` it sends to the engine (:func:`note_request`): the marker ``"request"`` and each extra
kind the request's extras use (:func:`pagedprefix.conformance.protocol.codec.extra_kinds_of`). A driven
channel is reached when its :attr:`Channel.reach` marker was noted at least once. Undeclared
means "none declared": nothing is checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from . import ALL_EXTRA_KINDS, ExtraKind
from .codec import Json, extra_kinds_of

REQUEST = "request"
"""The reach marker of every request sent to the engine (a channel every request carries)."""
SEED_ENV = "seed_env"
"""The reach marker of the engine's own seed variable (``Capabilities.seed_env``): noted once per
fresh engine process that ``key-seeding`` starts with the variable set or removed."""
GROUPS = "groups"
"""The reach marker of an engine's hybrid KV-cache groups (``Capabilities.groups``): noted once per
engine instance built for a config with hybrid groups (:func:`note_marker`, from the judge's
``build_adapter``)."""


@dataclass(frozen=True)
class Channel:
    """One input of an engine that affects its cache key or its events.

    Attributes:
        name: the channel's short name, unique per engine (e.g. ``"extra_key"``).
        engine_input: where it enters the engine, in the engine's own terms (e.g.
            ``"Req(extra_key=...)"``).
        driven: whether the adapter sends values through it.
        spec_extra_kind: the spec's extra kind (``lora``, ``cache_salt``, ``mm``,
            ``prompt_embeds``) that travels through it, or ``None`` for a channel every request
            carries (the token ids, a config option the adapter sets).
        reason: one line: how it is driven, or why it is not (with the engine file or function).
        marker: the reach marker when it is neither an extra kind nor ``"request"`` (e.g.
            :data:`SEED_ENV`), else ``None``.
    """

    name: str
    engine_input: str
    driven: bool
    spec_extra_kind: ExtraKind | None
    reason: str
    marker: str | None = None

    @property
    def reach(self) -> str:
        """The marker that reaching this channel records: :attr:`marker`, else its extra kind,
        else ``"request"``."""
        return self.marker or self.spec_extra_kind or REQUEST

    @property
    def counts(self) -> str:
        """What a reach of this channel counts: ``"fresh engine processes"`` (:data:`SEED_ENV`),
        ``"hybrid engine instances"`` (:data:`GROUPS`) or ``"requests"``."""
        return _COUNTS.get(self.marker or "", "requests")


_COUNTS = {SEED_ENV: "fresh engine processes", GROUPS: "hybrid engine instances"}


def check_channels(channels: Sequence[Channel]) -> tuple[Channel, ...]:
    """``channels`` as a tuple, after checking it: each a :class:`Channel` with a non-empty name,
    engine input and reason, ``driven`` a bool, ``spec_extra_kind`` one of the spec's kinds or
    ``None``, names unique. Raises ``ValueError`` naming the first bad entry."""
    seen: set[str] = set()
    for c in channels:
        if not isinstance(c, Channel):
            raise ValueError(f"channels must be Channel objects, got {c!r:.80}")
        if not (c.name and c.engine_input and c.reason):
            raise ValueError(f"channel {c.name!r}: name, engine_input and reason must be non-empty")
        if not isinstance(c.driven, bool):
            raise ValueError(f"channel {c.name!r}: driven must be a bool, got {c.driven!r}")
        if c.spec_extra_kind is not None and c.spec_extra_kind not in ALL_EXTRA_KINDS:
            raise ValueError(
                f"channel {c.name!r}: spec_extra_kind must be one of {sorted(ALL_EXTRA_KINDS)} or None, "
                f"got {c.spec_extra_kind!r}"
            )
        if c.name in seen:
            raise ValueError(f"channel {c.name!r} is declared twice")
        seen.add(c.name)
    return tuple(channels)


F = TypeVar("F", bound=Callable[..., object])


def declare_channels(channels: Sequence[Channel]) -> Callable[[F], F]:
    """A decorator that attaches ``channels`` (checked by :func:`check_channels`, ``ValueError``
    otherwise) to a factory as its ``channels`` attribute; the factory is returned unchanged."""
    checked = check_channels(channels)

    def attach(factory: F) -> F:
        setattr(factory, "channels", checked)  # noqa: B010 (a function attribute mypy cannot type)
        return factory

    return attach


def channels_of(factory: object) -> tuple[Channel, ...]:
    """The channels a factory (function or class) declares; ``()`` when it declares none. Raises
    ``ValueError`` for a malformed declaration."""
    declared = getattr(factory, "channels", ())
    if not isinstance(declared, (tuple, list)):
        raise ValueError(f"channels must be a tuple of Channel, got {type(declared).__name__}")
    return check_channels(declared)


_RECORDERS: list[Counter[str]] = []


@contextmanager
def recording() -> Iterator[Counter[str]]:
    """Record, until the block ends, the reach markers of every request the driver sends (nested
    recorders all record). Yields the counter: marker -> requests."""
    counter: Counter[str] = Counter()
    _RECORDERS.append(counter)
    try:
        yield counter
    finally:
        _RECORDERS.remove(counter)


def note_request(extras: Json) -> None:
    """Note one ``allocate`` or ``lookup`` about to be sent to the engine, with its JSON extras."""
    if not _RECORDERS:
        return
    markers = [REQUEST, *sorted(extra_kinds_of(extras))]
    for counter in _RECORDERS:
        counter.update(markers)


def note_marker(marker: str) -> None:
    """Note that the channel with reach marker ``marker`` was reached once (e.g. :data:`SEED_ENV`)."""
    for counter in _RECORDERS:
        counter[marker] += 1


def unreached(channels: Sequence[Channel], reached: Mapping[str, int]) -> list[Channel]:
    """The driven channels among ``channels`` whose reach marker ``reached`` never counted."""
    return [c for c in channels if c.driven and reached.get(c.reach, 0) <= 0]


__all__ = [
    "GROUPS", "REQUEST", "SEED_ENV", "Channel", "channels_of", "check_channels", "declare_channels",
    "note_marker", "note_request", "recording", "unreached",
]

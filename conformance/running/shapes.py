"""The shape of a counterexample: which operation departs from the spec, how, and which extras differ.

Two published bugs can fail the same property (a LoRA keyed by name alone and a salt left out of
the key both serve a hit of other content: ``hit-content``), so an explanation chosen by property
name names one of them twice. A :class:`Shape` says what the counterexample *is* instead:

- ``op``: the operation where the engine departs (``allocate``, ``lookup``, ``append``, ``free``,
  ``fork``, ``reset``, ``new_step``; ``""`` when the failure is not at one operation, e.g. at
  creation);
- ``outcome``: how it departs, from the judge's own wording (:data:`OUTCOMES`);
- ``extras_differ``: the extra-key fields (``lora.name``, ``lora.id``, ``cache_salt``, ``mm``,
  ``prompt_embeds``) in which the departing request differs from an earlier request of the case
  with the same first block of tokens -- the requests whose blocks it could have hit. Empty when
  no such request differs from it;
- ``groups``: the case config's KV-cache groups as written on a command line, in config order,
  when it has hybrid groups (``("full(4)", "sliding(6,4)")``); empty for the one full group;
- ``raised``: for an engine that crashed, the type of what it raised (``AssertionError``).

Explanations (:mod:`pagedprefix.conformance.reporting.history_notes`) are matched on shapes.
Shapes are computed from the case itself (a vector, the schema of conformance/vectors) and the
failure's message, so a vector case and a minimal stateful counterexample of one bug get one shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pagedprefix.spec import is_hybrid

from ..protocol.codec import Json, group_from_json

OUTCOMES: dict[str, str] = {
    "refused-but-changed": r"raised \w+ but changed",
    "hit-other-content": r"holds KV of other content",
    "refused-spec-succeeds": r"engine OutOfBlocks.*spec succeeds",
    "hit-count": r"hit \d+ tokens; the spec hits \d+",
    "error-kind": r"the spec raises",
    "crashed": r"\) crashed: ",
    "event-alike": r"the keys differ, the events do not",
    "seed-promise": r"two fresh (?:processes|instances)",
    "retention-promise": r"; retention=\w+ promises \d+",
    "event-tokens": r"published BlockStored of \d+ keys with \d+ tokens",
    "tables": r"block_tables?: engine ",
    "event": r"\bevent",
}
"""Outcome name -> the pattern of the judge's message that names it (first match wins; else
``other``). ``hit-count`` is refined to ``hit-more`` / ``hit-less`` by the two numbers."""

EXTRA_FIELDS: tuple[str, ...] = ("lora.name", "lora.id", "cache_salt", "mm", "prompt_embeds")
"""The extra-key fields a shape compares, in this order."""

_STEP = re.compile(r"^step (\d+): ")
_HITS = re.compile(r"hit (\d+) tokens; the spec hits (\d+)")


@dataclass(frozen=True)
class Shape:
    """What a counterexample is (module docstring). ``to_json`` / :func:`shape_from_json` round-trip."""

    op: str
    outcome: str
    extras_differ: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    raised: str = ""

    def to_json(self) -> dict[str, Any]:
        """``op``, ``outcome``, ``extras_differ``, and ``groups`` / ``raised`` when not empty."""
        out: dict[str, Any] = {
            "op": self.op, "outcome": self.outcome, "extras_differ": list(self.extras_differ),
        }
        if self.groups:
            out["groups"] = list(self.groups)
        if self.raised:
            out["raised"] = self.raised
        return out

    def describe(self) -> str:
        """One line: ``allocate, hit-other-content, extras differ in lora.id`` (then ``, groups
        full(4) + sliding(6,4)`` and ``, raised AssertionError`` where they apply)."""
        differ = f", extras differ in {' + '.join(self.extras_differ)}" if self.extras_differ else ""
        groups = f", groups {' + '.join(self.groups)}" if self.groups else ""
        raised = f", raised {self.raised}" if self.raised else ""
        return f"{self.op or 'no operation'}, {self.outcome}{differ}{groups}{raised}"


def shape_from_json(obj: Json) -> Shape:
    """The :class:`Shape` of :meth:`Shape.to_json`'s output; ``ValueError`` for anything else."""
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("op", "outcome")):
        raise ValueError(f"not a shape: {obj!r:.80}")
    lists = {name: obj.get(name, []) for name in ("extras_differ", "groups")}
    for name, value in lists.items():
        if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
            raise ValueError(f"not a shape's {name}: {value!r:.80}")
    raised = obj.get("raised", "")
    if not isinstance(raised, str):
        raise ValueError(f"not a shape's raised: {raised!r:.80}")
    return Shape(
        obj["op"], obj["outcome"], tuple(lists["extras_differ"]), tuple(lists["groups"]), raised
    )


def outcome_of(message: str) -> str:
    """The outcome the judge's ``message`` names (:data:`OUTCOMES`), ``other`` when none."""
    for name, pattern in OUTCOMES.items():
        if re.search(pattern, message):
            if name == "hit-count":
                hits = _HITS.search(message)
                assert hits is not None
                return "hit-more" if int(hits.group(1)) > int(hits.group(2)) else "hit-less"
            return name
    return "other"


def _fields(extras: Json) -> dict[str, Json]:
    e = extras if isinstance(extras, dict) else {}
    lora = e.get("lora") if isinstance(e.get("lora"), dict) else {}
    assert isinstance(lora, dict)
    return {
        "lora.name": lora.get("name"),
        "lora.id": lora.get("id"),
        "cache_salt": e.get("cache_salt") or "",
        "mm": e.get("mm_items") or [],
        "prompt_embeds": e.get("prompt_embeds"),
    }


def _differ(a: Json, b: Json) -> set[str]:
    fa, fb = _fields(a), _fields(b)
    return {name for name in EXTRA_FIELDS if fa[name] != fb[name]}


def _block_size(case: dict[str, Json]) -> int:
    config = case.get("config")
    size = config.get("block_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and size > 0 else 1


_RAISED = re.compile(r"\) crashed: (\w+)")


def raised_of(message: str) -> str:
    """The type an engine raised, from a ``crashed`` message (``... crashed: AssertionError: ...``);
    ``""`` for any other message."""
    found = _RAISED.search(message)
    return found.group(1) if found is not None else ""


def config_groups_of(case: Json) -> tuple[str, ...]:
    """A case config's groups as written on a command line (``KVCacheGroup.describe``), in order,
    when it has hybrid groups; ``()`` otherwise (and for groups that do not parse)."""
    config = case.get("config") if isinstance(case, dict) else None
    groups = config.get("groups") if isinstance(config, dict) else None
    size = config.get("block_size") if isinstance(config, dict) else None
    if not isinstance(groups, list) or not isinstance(size, int):
        return ()
    try:
        parsed = tuple(group_from_json(g) for g in groups)
    except (TypeError, ValueError, AttributeError):
        return ()
    return tuple(g.describe() for g in parsed) if is_hybrid(parsed, size) else ()


def departing_step(case: Json, message: str) -> int | None:
    """The index of the step where the engine departs: the ``step N:`` of a vector case's message,
    else (a minimal stateful counterexample, which ends at its violation) the last step."""
    steps = case.get("steps") if isinstance(case, dict) else None
    if not isinstance(steps, list) or not steps:
        return None
    found = _STEP.match(message)
    if found is not None:
        index = int(found.group(1))
        return index if index < len(steps) else None
    return len(steps) - 1


def shape_of(case: Json, message: str) -> Shape:
    """The :class:`Shape` of the failure ``message`` on ``case`` (a vector case: ``config``,
    ``steps``; or a vector file holding it as its one case, as a saved counterexample is)."""
    if isinstance(case, dict) and isinstance(case.get("cases"), list) and len(case["cases"]) == 1:
        case = case["cases"][0]
    outcome = outcome_of(message)
    index = departing_step(case, message)
    groups, raised = config_groups_of(case), raised_of(message)
    if index is None or not isinstance(case, dict):
        return Shape("", outcome, (), groups, raised)
    steps = case["steps"]
    assert isinstance(steps, list)
    step = steps[index]
    if not isinstance(step, dict):
        return Shape("", outcome, (), groups, raised)
    op = str(step.get("op", ""))
    tokens = step.get("tokens")
    if not isinstance(tokens, list):
        return Shape(op, outcome, (), groups, raised)
    first = tokens[: _block_size(case)]
    differ: set[str] = set()
    for earlier in steps[:index]:
        earlier_tokens = earlier.get("tokens") if isinstance(earlier, dict) else None
        if isinstance(earlier_tokens, list) and earlier_tokens[: len(first)] == first:
            differ |= _differ(earlier.get("extras"), step.get("extras"))
    differs = tuple(name for name in EXTRA_FIELDS if name in differ)
    return Shape(op, outcome, differs, groups, raised)


__all__ = [
    "EXTRA_FIELDS", "OUTCOMES", "Shape", "config_groups_of", "departing_step", "outcome_of", "raised_of",
    "shape_from_json", "shape_of",
]

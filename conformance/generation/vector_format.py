"""Building vector cases from the spec, and their deterministic JSON text (schema in
:mod:`pagedprefix.conformance.running.vectors`). Used by the vector generator (``_scenarios``) and by the
stateful runner, which saves each counterexample as a ready-to-run vector."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, is_hybrid

from ..judging.driver import Step, step_requirements
from ..judging.model import SpecModel
from ..judging.properties import PROFILES
from ..protocol.codec import Json, config_to_json, extras_to_json

SCHEMA_VERSION = 1
"""The schema of a file whose cases all have the one full-attention group (unchanged since 1)."""
HYBRID_SCHEMA_VERSION = 2
"""The schema of a file with hybrid-group cases: version 1 plus the optional fields of
SEMANTICS.md section 8 (``config.groups``/``retention``/``group_free_order``, the ``new_step`` op,
``group_tables`` observations, hybrid results, ``error: "Deferred"``, ``orphans``). A file is
written at the lowest version that can express it, so single-group files stay at 1."""
SCHEMA_VERSIONS: tuple[int, ...] = (SCHEMA_VERSION, HYBRID_SCHEMA_VERSION)


def spec_version() -> str:
    """The version of the spec the vectors are generated from."""
    from pagedprefix.spec import key_vectors

    return str(getattr(key_vectors, "SPEC_VERSION", "0"))


# ----- building cases from the spec -------------------------------------------------------------


class CaseBuilder:
    """Records steps run on the spec, with the spec's expectation after each."""

    def __init__(
        self,
        case_id: str,
        *,
        config: CacheConfig,
        profile: str,
        section: str,
        description: str,
        keys: bool = False,
    ) -> None:
        assert profile in PROFILES
        self.case_id = case_id
        self.config = config
        self.profile = profile
        self.section = section
        self.description = description
        self.keys = keys
        self.model = SpecModel(config)
        self.initial = self.model.observe(keys)
        self.steps: list[dict[str, Json]] = []

    def step(self, step: Step) -> dict[str, Json]:
        """Run a raw JSON step; returns its expectation."""
        _, expect = self.model.do(step, self.keys)
        self.steps.append({**step, "expect": expect})
        return expect

    def allocate(self, request_id: Json, tokens: Json, extras: Extras = NO_EXTRAS) -> dict[str, Json]:
        step: Step = {"op": "allocate", "request_id": request_id, "tokens": tokens}
        if extras != NO_EXTRAS:
            step["extras"] = extras_to_json(extras)
        return self.step(step)

    def append(self, request_id: Json, tokens: Json) -> dict[str, Json]:
        return self.step({"op": "append", "request_id": request_id, "tokens": tokens})

    def fork(self, parent_id: Json, child_id: Json) -> dict[str, Json]:
        return self.step({"op": "fork", "parent_id": parent_id, "child_id": child_id})

    def free(self, request_id: Json) -> dict[str, Json]:
        return self.step({"op": "free", "request_id": request_id})

    def lookup(self, tokens: Json, extras: Extras = NO_EXTRAS) -> dict[str, Json]:
        step: Step = {"op": "lookup", "tokens": tokens}
        if extras != NO_EXTRAS:
            step["extras"] = extras_to_json(extras)
        return self.step(step)

    def reset(self) -> dict[str, Json]:
        return self.step({"op": "reset"})

    def new_step(self) -> dict[str, Json]:
        return self.step({"op": "new_step"})

    def build(self) -> dict[str, Json]:
        """The case as JSON."""
        return make_case(
            self.case_id,
            self.description,
            self.section,
            self.profile,
            self.config,
            initial=self.initial,
            steps=self.steps,
            keys=self.keys,
        )


def make_case(
    case_id: str,
    description: str,
    section: str,
    profile: str,
    config: CacheConfig,
    *,
    initial: Json = None,
    steps: Sequence[dict[str, Json]] = (),
    keys: bool = False,
    config_error: str | None = None,
) -> dict[str, Json]:
    """A case dict with its ``requires`` derived from its steps."""
    requires: set[str] = set()
    for entry in steps:
        requires |= step_requirements(entry)
        err = entry["expect"]["error"]
        if err is not None and err != "OutOfBlocks":
            requires.add("input_errors")
    if keys:
        requires.add("keys")
    if config_error is not None:
        requires.add("input_errors")
    elif config.groups is not None and is_hybrid(config.groups, config.block_size):
        requires.add("groups")
        requires |= {f"group:{g.kind}" for g in config.groups}
    case: dict[str, Json] = {
        "id": case_id,
        "description": description,
        "section": section,
        "profile": profile,
        "requires": sorted(requires),
        "config": config_to_json(config),
    }
    if config_error is not None:
        case["config_error"] = config_error
    else:
        case["initial"] = initial
        case["steps"] = list(steps)
    return case


def schema_version_of(cases: Sequence[dict[str, Json]]) -> int:
    """The lowest schema that can express ``cases`` (:data:`HYBRID_SCHEMA_VERSION` when one uses
    hybrid groups)."""
    hybrid = any("groups" in c.get("requires", []) for c in cases)
    return HYBRID_SCHEMA_VERSION if hybrid else SCHEMA_VERSION


def vector_file(group: str, description: str, cases: list[dict[str, Json]]) -> dict[str, Json]:
    return {
        "schema_version": schema_version_of(cases),
        "spec_version": spec_version(),
        "group": group,
        "description": description,
        "cases": cases,
    }


def _compact(value: Json) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(", ", ": "))


def _step_line(step: dict[str, Json]) -> str:
    """A step on one line: its arguments sorted, its ``expect`` last."""
    keys = sorted(step, key=lambda k: (k == "expect", k))
    return "{" + ", ".join(f"{json.dumps(k)}: {_compact(step[k])}" for k in keys) + "}"


def _block(obj: dict[str, Json], indent: str, expand: dict[str, bool]) -> str:
    """``obj`` with one key per line; keys named in ``expand`` hold lists written one item a line
    (``True``: items are dicts expanded again, ``False``: items on one line each)."""
    lines = []
    for key in sorted(obj):
        value = obj[key]
        head = f"{indent} {json.dumps(key)}: "
        if key in expand and isinstance(value, list) and value:
            inner = indent + "  "
            items = [
                _block(v, inner, {"steps": False})
                if expand[key] and isinstance(v, dict)
                else inner + (_step_line(v) if isinstance(v, dict) else _compact(v))
                for v in value
            ]
            lines.append(head + "[\n" + ",\n".join(items) + "\n" + indent + " ]")
        else:
            lines.append(head + _compact(value))
    return indent + "{\n" + ",\n".join(lines) + "\n" + indent + "}"


def dumps(doc: dict[str, Json]) -> str:
    """Deterministic JSON text of a vector file: sorted keys, one case field and one step a line."""
    return _block(doc, "", {"cases": True}) + "\n"

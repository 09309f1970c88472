"""The first disagreement between an engine and the spec in a lockstep replay, and its
reproduction file (format in :mod:`pagedprefix.replay.lockstep`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPRO_FORMAT = "pagedprefix.replay.repro"
REPRO_VERSION = 1


@dataclass(frozen=True)
class Divergence:
    """The first operation on which the engine and the spec disagree."""

    op_index: int
    reason: str
    expected: str
    actual: str
    ops: list[dict[str, Any]] = field(repr=False)
    config: dict[str, Any] = field(repr=False)

    @property
    def op(self) -> dict[str, Any]:
        return self.ops[self.op_index]

    def __str__(self) -> str:
        op = {k: v for k, v in self.op.items() if k != "hash_ids"}
        return (
            f"divergence at operation {self.op_index} {op}: {self.reason}\n"
            f"  spec:   {self.expected}\n  engine: {self.actual}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPRO_FORMAT,
            "version": REPRO_VERSION,
            "config": self.config,
            "divergence": {
                "op_index": self.op_index,
                "reason": self.reason,
                "expected": self.expected,
                "actual": self.actual,
            },
            "ops": self.ops,
        }

    def save(self, path: str | Path) -> Path:
        """Write the reproduction JSON; returns the path."""
        out = Path(path)
        out.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        return out

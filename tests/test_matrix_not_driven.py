"""The conformance matrix's ``not driven`` rows (conformance/reporting/matrix.py, notes.NOT_DRIVEN): a
component no adapter drives honestly is published with its reason, and nothing of it runs."""

from __future__ import annotations

import pytest
from pagedprefix.conformance.engines.notes import ABOUT, NOT_DRIVEN
from pagedprefix.conformance.reporting import matrix
from pagedprefix.conformance.reporting.matrix import MATRIX_ENGINES, MatrixEngine, render_markdown, run_cells


def _refuse_to_load(name: str) -> object:
    raise AssertionError(f"a not-driven row loaded {name!r}")


def test_a_not_driven_row_runs_nothing_and_prints_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "load_engine", _refuse_to_load)
    # pagedprefix is always installed, so the row is not "not installed"
    cells = run_cells(MatrixEngine("sglang-swa", "pagedprefix", not_driven=True), [])
    assert [(c.engine, c.profile, c.verdict) for c in cells] == [("sglang-swa", "-", "not driven")]
    text = render_markdown(cells)
    version = matrix.version_of("pagedprefix")
    assert f"| sglang-swa | {version} | - | not driven | - | - |" in text
    assert f"Not driven: {NOT_DRIVEN['sglang-swa']}" in text
    assert ABOUT["sglang-swa"] in text


def test_a_not_driven_row_without_a_reason_is_printed_unexplained() -> None:
    cells = run_cells(MatrixEngine("nameless-hybrid", "pagedprefix", not_driven=True), [])
    assert "Not driven: *unexplained*" in render_markdown(cells)


def test_a_not_driven_row_whose_engine_is_missing_is_not_installed() -> None:
    cells = run_cells(MatrixEngine("sglang-mamba", "no-such-distribution-pagedprefix", not_driven=True), [])
    assert [c.verdict for c in cells] == ["not installed"]


def test_every_shipped_not_driven_row_is_explained() -> None:
    rows = [e.name for e in MATRIX_ENGINES if e.not_driven]
    assert rows == ["sglang-swa", "sglang-mamba"]
    for name in rows:
        assert name in NOT_DRIVEN and name in ABOUT
        assert "judge the adapter" in NOT_DRIVEN[name]  # the reason says why a verdict would lie


def test_docs_matrix_carries_every_not_driven_reason_verbatim() -> None:
    """docs/MATRIX.md is checked byte for byte only in ``nox -s engines``; this catches a reason
    edited in notes.py without the matrix regenerated, in the default session."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "MATRIX.md").read_text(encoding="utf-8")
    for name, reason in NOT_DRIVEN.items():
        assert any(line.startswith(f"| {name} | ") and line.endswith(" | - | not driven | - | - |")
                   for line in text.splitlines()), name
        assert f"## {name}\n\n{ABOUT[name]}\n\nNot driven: {reason}\n" in text, name

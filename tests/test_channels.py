"""Key channels (issue 22): each adapter's declared inputs of its engine, which a run's requests
reached, the matrix's Channels table, and ``matrix --check`` failing on a driven channel that no
example reached."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import typer
from pagedprefix.conformance.cli import _matrix_run
from pagedprefix.conformance.protocol.channels import (
    GROUPS,
    REQUEST,
    Channel,
    channels_of,
    check_channels,
    declare_channels,
    note_request,
    recording,
    unreached,
)
from pagedprefix.conformance.reporting import matrix as matrix_module
from pagedprefix.conformance.reporting.matrix import (
    Cell,
    MatrixEngine,
    _cell,
    channel_gaps,
    declared_channels,
    render_markdown,
)
from pagedprefix.conformance.running.suite import SuiteOptions, load_engine, run_suite

ENGINE = textwrap.dedent(
    """
    from dataclasses import replace
    from pagedprefix.conformance.protocol.adapters import spec
    from pagedprefix.conformance.protocol.channels import Channel, declare_channels

    TOKENS = Channel("tokens", "allocate(tokens)", True, None, "every request's tokens")
    LORA = Channel("lora", "Extras.lora", True, "lora", "the spec's LoRA")

    def _no_mm(config):
        adapter = spec(config)
        adapter.capabilities = replace(adapter.capabilities, extras=frozenset({"lora", "cache_salt"}))
        return adapter

    @declare_channels((TOKENS, LORA, Channel("mm", "Extras.mm_items", True, "mm", "claimed, never sent")))
    def claims_mm(config):
        return _no_mm(config)

    @declare_channels((TOKENS, LORA, Channel("mm", "Extras.mm_items", False, "mm", "capability lacks mm")))
    def honest(config):
        return _no_mm(config)
    """
)

SMALL = SuiteOptions(profile="core", max_examples=12, builtin_vectors=False)


@pytest.fixture
def engine_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "channel_eng.py").write_text(ENGINE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for a worker process
    return tmp_path


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Channel("x", "Req(x=...)", True, "colour", "why"), "spec_extra_kind must be one of"),  # type: ignore[arg-type]
        (Channel("x", "Req(x=...)", True, None, ""), "must be non-empty"),
        (Channel("", "Req(x=...)", True, None, "why"), "must be non-empty"),
        (Channel("x", "Req(x=...)", 1, None, "why"), "driven must be a bool"),  # type: ignore[arg-type]
        ("x", "must be Channel objects"),
    ],
)
def test_malformed_declarations_are_refused(bad: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_channels([bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=message):
        declare_channels([bad])  # type: ignore[list-item]


def test_a_channel_declared_twice_is_refused() -> None:
    c = Channel("salt", "Req(salt=...)", True, "cache_salt", "sent")
    with pytest.raises(ValueError, match="'salt' is declared twice"):
        check_channels([c, c])


def test_declare_channels_attaches_and_undeclared_is_none() -> None:
    c = Channel("salt", "Req(salt=...)", True, "cache_salt", "sent")

    @declare_channels([c])
    def factory(config: object) -> object:
        return config

    assert channels_of(factory) == (c,) and factory(5) == 5
    assert channels_of(lambda config: config) == ()
    assert declared_channels("jsonl:./anything") == ()
    assert declared_channels("no_such_module_xyz:f") == ()


def test_note_request_counts_markers_only_while_recording() -> None:
    note_request({"lora": {"name": "a", "lora_id": 1}})  # nobody records: nothing to do
    with recording() as outer:
        note_request({"lora": {"name": "a", "lora_id": 1}, "cache_salt": ""})
        with recording() as inner:
            note_request({"cache_salt": "t"})
        note_request(None)
    assert outer == {REQUEST: 3, "lora": 1, "cache_salt": 1}  # "" is no salt
    assert inner == {REQUEST: 1, "cache_salt": 1}
    lora = Channel("lora", "LoRA", True, "lora", "sent")
    embeds = Channel("embeds", "embeds", True, "prompt_embeds", "sent")
    idle = Channel("mm", "mm", False, "mm", "not sent")
    assert unreached([lora, embeds, idle], outer) == [embeds]


@pytest.mark.parametrize("name", ["impl", "spec", "radix"])
def test_builtin_adapters_reach_every_driven_channel(name: str) -> None:
    report = run_suite(load_engine(name), SMALL, name, extra_groups=[])
    declared = declared_channels(name)
    assert {c.name for c in declared} == {"tokens", "lora", "cache_salt", "mm_items", "prompt_embeds"}
    assert report.reached[REQUEST] > 0
    assert unreached(declared, report.reached) == [], report.reached
    assert report.to_json()["reached"] == dict(sorted(report.reached.items()))


def test_reached_is_recorded_through_a_worker_process(engine_dir: Path) -> None:
    factory = load_engine("channel_eng:claims_mm")  # served from a worker: recorded on this side
    try:
        report = run_suite(factory, SMALL, "claims_mm", extra_groups=[])
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.reached.get("lora", 0) > 0 and report.reached[REQUEST] > 0
    assert "mm" not in report.reached  # the capability lacks mm: no mm request was ever sent
    gaps = channel_gaps([_cell("claims_mm", "(given)", "core", report)], {"claims_mm": channels_of(
        __import__("channel_eng").claims_mm)})
    assert gaps == [
        "matrix: claims_mm declares channel 'mm' (Extras.mm_items) driven, but none of its 1 runs sent it "
        "requests with the spec's mm extras"
    ]


def _cells_of(name: str) -> list[Cell]:
    """One small real run of ``name`` (in process), made once per test and reused by each
    regeneration, as ``matrix`` reuses its runs' reports."""
    if name not in _CELLS:
        report = run_suite(load_engine(name, isolate=False), SMALL, name, extra_groups=[])
        _CELLS[name] = [_cell(name, "(given)", "core", report)]
    return _CELLS[name]


_CELLS: dict[str, list[Cell]] = {}


@pytest.fixture
def matrix_md(engine_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a small matrix run writes. The runs are real; ``run_cells`` is swapped only to keep
    them small."""
    monkeypatch.setattr(matrix_module, "run_cells", lambda e, groups, seed: _cells_of(e.name))
    return engine_dir / "MATRIX.md"


def _matrix_exit(name: str, out: Path, check: bool) -> int:
    """The exit code of a matrix run of engine ``name`` writing (or checking) ``out``; it must exit."""
    with pytest.raises(typer.Exit) as exited:
        _matrix_run([MatrixEngine(name, "")], out, None, check, 0)
    return int(exited.value.exit_code)


def test_matrix_check_fails_on_a_driven_channel_no_example_reached(
    matrix_md: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "channel_eng:claims_mm"
    assert _matrix_exit(name, matrix_md, check=False) == 1  # written, and failed
    assert "| `mm` | `Extras.mm_items` | yes | `mm` | **no** | claimed, never sent |" in matrix_md.read_text()
    assert _matrix_exit(name, matrix_md, check=True) == 1  # identical text, still a FAIL
    err = capsys.readouterr().err
    assert f"matrix: {name} declares channel 'mm' (Extras.mm_items) driven, but none of its 1 runs" in err
    assert "driven channels were not reached" in err


def test_matrix_check_passes_an_honest_declaration(
    matrix_md: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "channel_eng:honest"
    _matrix_run([MatrixEngine(name, "")], matrix_md, None, False, 0)  # no Exit: nothing to report
    text = matrix_md.read_text()
    assert "| `lora` | `Extras.lora` | yes | `lora` | yes | the spec's LoRA |" in text
    assert "| `mm` | `Extras.mm_items` | no | `mm` | - | capability lacks mm |" in text
    assert _matrix_exit(name, matrix_md, check=True) == 0
    assert "declares channel" not in capsys.readouterr().err


def test_channels_table_of_an_engine_not_run_and_of_none_declared() -> None:
    lora = Channel("lora", "Extras.lora", True, "lora", "sent")
    cells = [
        Cell("a", "-", "-", "not installed", error="pip install a"),
        Cell("b", "1", "core", "PASS", reached={REQUEST: 3}),
    ]
    text = render_markdown(cells, 0, {"a": (lora,)})
    assert "| `lora` | `Extras.lora` | yes | `lora` | not run | sent |" in text
    assert 'Channels: none declared (conformance/README.md, "Declaring channels").' in text
    assert channel_gaps(cells, {"a": (lora,)}) == []  # nothing ran: nothing to judge
    assert channel_gaps(cells, {"b": (lora,)}) != []


GROUPS_CHANNEL = Channel(
    "kv_cache_groups", "CacheConfig.groups", True, None, "hybrid configs: one group per spec group",
    marker=GROUPS,
)


def _without_groups(config: object) -> object:
    """A broken engine: it declares its groups channel driven but no hybrid group (so none is sent)."""
    from dataclasses import replace

    from pagedprefix.conformance.protocol.adapters import spec

    adapter = spec(config)  # type: ignore[arg-type]
    adapter.capabilities = replace(adapter.capabilities, groups=frozenset())
    return adapter


def test_groups_channel_is_reached_per_hybrid_engine_instance() -> None:
    """The groups marker counts engine instances built for a hybrid config: the spec (which runs
    every group kind) reaches its groups channel; an engine that declares the channel driven but
    no group kind never does, and ``unreached`` names the channel."""
    from pagedprefix.conformance.protocol.adapters import spec

    assert GROUPS_CHANNEL.reach == GROUPS and GROUPS_CHANNEL.counts == "hybrid engine instances"
    report = run_suite(spec, SMALL, "spec", extra_groups=[])
    assert report.reached.get(GROUPS, 0) > 0
    assert unreached([GROUPS_CHANNEL], report.reached) == []
    broken = run_suite(_without_groups, SMALL, "without-groups", extra_groups=[])  # type: ignore[arg-type]
    assert broken.reached.get(GROUPS, 0) == 0 and broken.reached[REQUEST] > 0
    assert unreached([GROUPS_CHANNEL], broken.reached) == [GROUPS_CHANNEL]

"""Fuzzing ``pagedprefix conform``: arbitrary arguments and vector-file contents give a verdict
(exit 0, 1 or 3) or one line on stderr with exit 2 — never a traceback, never a hang.

Runs the real entry point (``pagedprefix.cli.main``) in this process, so Hypothesis can try many
command lines. ``PAGEDPREFIX_FUZZ_EXAMPLES`` raises the count for a longer run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagedprefix.cli import main
from pagedprefix.conformance.running.vectors import VECTOR_DIR

EXAMPLES = int(os.environ.get("PAGEDPREFIX_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
FAST = ["--no-trace", "--no-builtin-vectors", "--engine", "spec"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    return (code if isinstance(code, int) else 1), out.getvalue(), err.getvalue()


def check_outcome(code: int, out: str, err: str) -> None:
    """A verdict (0, 1, 3) or a one-line user error (2); a traceback only as the engine's own,
    inside an ``engine-errors`` FAIL row of the report."""
    assert "Traceback (most recent call last)" not in err
    assert code in (0, 1, 2, 3), (code, out[-500:], err[-500:])
    if "Traceback (most recent call last)" in out:
        assert code == 1 and "FAIL" in out and "engine-errors" in out, out[-2000:]
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and re.match(r"^pagedprefix( \S+)*: error: ", lines[0]), err
        assert out == ""


NUMBERS = st.sampled_from(
    ["-5", "0", "1", "2", "3", "x", "1e9", "nan", "inf", "-inf", "0.5", "2**3", "9" * 30, ""]
)
ENGINES = st.sampled_from(
    [
        "spec",
        "impl",
        "radix",
        "nosuch",
        "a:b",
        "jsonl:",
        "jsonl:false",
        "module:",
        ":f",
        "os:getcwd",
        "pagedprefix.spec:SpecCache",
        "pagedprefix.conformance.protocol.adapters:spec",
        "json:loads",
    ]
)
PROFILES = st.sampled_from(["core", "maximal", "exact", "strict", "", "lru", "single-namespace"])


@st.composite
def command_lines(draw: st.DrawFn, tmp: Path) -> list[str]:
    paths = st.sampled_from([str(tmp), str(tmp / "missing"), str(tmp / "file.txt"), "/", ""])
    options: dict[str, st.SearchStrategy[str] | None] = {
        "--engine": ENGINES,
        "--profile": PROFILES,
        "--seed": NUMBERS,
        "--max-examples": st.sampled_from(["-5", "0", "1", "2", "x", "1.5"]),
        "--steps": st.sampled_from(["0", "1", "5", "10001", "-1", "y"]),
        "--time-budget": NUMBERS,
        "--call-timeout": NUMBERS,
        "--start-timeout": NUMBERS,
        "--json": st.sampled_from([str(tmp / "r.json"), str(tmp / "missing" / "r.json"), str(tmp), ""]),
        "--vectors": paths,
        "--path": paths,
        "--database": st.sampled_from([str(tmp / "db"), str(tmp / "missing" / "db"), str(tmp / "file.txt")]),
        "--no-stateful": None,
        "--in-process": None,
        "--bogus": None,
        "-x": None,
    }
    argv = ["conform"]
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=5)):
        argv.append(name)
        value = options[name]
        if value is not None and draw(st.integers(0, 9)) > 0:
            argv.append(draw(value))
    if "--max-examples" not in argv:
        argv += ["--max-examples", "1"]
    return argv + ["--no-trace", "--no-builtin-vectors"]


def test_fuzzed_command_lines(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("not a directory\n")

    @FUZZ
    @given(st.data())
    def check(data: st.DataObject) -> None:
        argv = data.draw(command_lines(tmp_path))
        check_outcome(*run_cli(argv))

    check()


def valid_case() -> dict[str, Any]:
    doc = json.loads((VECTOR_DIR / "operations.json").read_text())
    case: dict[str, Any] = doc["cases"][0]
    return case


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_case(draw: st.DrawFn) -> Any:
    """A valid case with one field replaced by arbitrary JSON, or removed."""
    case = valid_case()
    steps = case["steps"]
    where = draw(st.sampled_from(["case", "config", "initial", "step", "expect", "result"]))
    target: Any = {
        "case": case,
        "config": case["config"],
        "initial": case["initial"],
        "step": steps[0],
        "expect": steps[0]["expect"],
        "result": steps[0]["expect"]["result"],
    }[where]
    key = draw(st.sampled_from(sorted(target)))
    if draw(st.booleans()):
        del target[key]
    else:
        target[key] = draw(JSON)
    return case


def write_vectors(directory: Path, content: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "fuzzed.json").write_text(content, encoding="utf-8")


def test_fuzzed_vector_files(tmp_path: Path) -> None:
    directory = tmp_path / "vectors"
    documents = (
        st.builds(lambda case: json.dumps({"schema_version": 1, "cases": [case]}), mutated_case())
        | st.builds(json.dumps, JSON)
        | st.text(max_size=40)
        | st.just('{"schema_version": 1, "cases": [')
    )

    @FUZZ
    @given(documents)
    def check(content: str) -> None:
        write_vectors(directory, content)
        check_outcome(*run_cli(["conform", *FAST, "--no-stateful", "--vectors", str(directory)]))

    check()


def test_an_untouched_case_passes_so_the_fuzzing_starts_from_a_valid_file(tmp_path: Path) -> None:
    write_vectors(tmp_path / "v", json.dumps({"schema_version": 1, "cases": [valid_case()]}))
    code, out, err = run_cli(["conform", *FAST, "--no-stateful", "--vectors", str(tmp_path / "v")])
    assert code == 0 and "1 passed" in out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["conform", "--max-examples", "-5"], "--max-examples must be >= 0, got -5"),
        (["conform", "--json", "/nonexistent/dir/r.json"], "directory /nonexistent/dir does not exist"),
        (["conform", "--time-budget", "nan"], "--time-budget must be a number of seconds in (0, 1e+06]"),
        (["conform", "--call-timeout", "1e300"], "--call-timeout must be a number of seconds"),
        (["conform", "--engine", "jsonl:"], "jsonl: needs a command"),
        (["conform", "--seed", "-1"], "--seed must be in [0, 2**63)"),
        (["conform", "--bogus"], "No such option: --bogus"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str) -> None:
    code, out, err = run_cli(argv)
    check_outcome(code, out, err)
    assert code == 2 and message in err

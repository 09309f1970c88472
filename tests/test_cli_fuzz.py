"""Fuzzing the ``replay``, ``compare-engines`` and ``generate`` commands (``pagedprefix conform`` is
fuzzed with the conformance runner).

The rule every command follows (``src/cli.py``): a user error — an unknown or malformed option, an
unreadable or malformed trace, a missing output directory, a missing optional dependency — ends in
exactly one line on stderr, ``pagedprefix COMMAND: error: ...``, and exit code 2, with no traceback;
every other run exits 0. (Exit code 1 is reserved for an engine that fails or diverges: a
``module:factory`` name can load something that is not an engine.) Optional dependencies and output
directories are checked before any work starts.

Hypothesis draws argument lists from a grammar of valid and invalid values for every option, and
trace files whose contents are valid, corrupt, truncated or hostile (gzip and plain), and runs them
in-process through typer's ``CliRunner``; a few real ``pagedprefix`` subprocesses check the same
rule end to end. ``HOSTILE_EXAMPLES`` sets the number of examples (see ``tests/hostile.py``).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from hostile import CALLS, SURROGATES, hostile_settings, report
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

GOOD = {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}
GOOD_LINES = [json.dumps({**GOOD, "timestamp": t, "hash_ids": [1, 2 + t % 2]}) for t in range(4)]


def app() -> typer.Typer:
    from pagedprefix import cli

    cli._register()
    return cli.app


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with one good trace, a read-only-free output dir and a directory named like a file."""
    root = tmp_path_factory.mktemp("cli-fuzz")
    (root / "good.jsonl").write_text("\n".join(GOOD_LINES) + "\n")
    (root / "out").mkdir()
    (root / "adir.json").mkdir()
    return root


# ----- file contents ------------------------------------------------------------------------------

LINE_VALUES = st.one_of(
    st.sampled_from(GOOD_LINES),
    st.sampled_from([
        "", "{", "[]", "null", '"x"', "[" * 5000, '{"timestamp": ' + "9" * 5000 + "}",
        json.dumps({**GOOD, "timestamp": -1}), json.dumps({**GOOD, "timestamp": 1e308 * 10}),
        '{"timestamp": NaN, "input_length": 1, "output_length": 0, "hash_ids": [1]}',
        json.dumps({**GOOD, "timestamp": 10**400}), json.dumps({**GOOD, "input_length": True}),
        json.dumps({**GOOD, "hash_ids": [2**64]}), json.dumps({**GOOD, "hash_ids": "[/red]"}),
        json.dumps({**GOOD, "output_length": "[bold]x[/bold]"}), json.dumps({**GOOD, "hash_ids": [2, 1]}),
        json.dumps({**GOOD, "input_length": 5000}), json.dumps({"timestamp": "[/x]"}),
    ]),
    st.text(max_size=40),
)


@st.composite
def trace_bytes(draw: st.DrawFn) -> bytes:
    text = "\n".join(draw(st.lists(LINE_VALUES, max_size=6))) + "\n"
    raw = text.encode("utf-8", "surrogatepass") if draw(st.booleans()) else text.encode("utf-8", "replace")
    kind = draw(st.sampled_from(["plain", "gzip", "corrupt-gzip", "truncated-gzip", "binary", "latin"]))
    if kind == "plain":
        return raw
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "latin":
        return b"\xff\xfe" + raw
    packed = gzip.compress(raw)
    if kind == "truncated-gzip":
        return packed[: draw(st.integers(2, max(2, len(packed) - 1)))]
    if kind == "corrupt-gzip":
        at = draw(st.integers(10, max(10, len(packed) - 1)))
        return packed[:at] + bytes([packed[at % len(packed)] ^ 0xFF]) + packed[at + 1:]
    return packed


# ----- arguments ----------------------------------------------------------------------------------

INTS = st.one_of(st.integers(-3, 40).map(str), st.sampled_from(
    ["0", "1e3", "abc", "", "99999999999999999999999", "1048577", " 4", "٣", "-0", "0x10"]))
FLOATS = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "0.5", "1e309", "1e-300", "x", ""])
PATHS = ["out/r.json", "missing/r.json", "adir.json", "out", "", "out/\x00x", "out/" + "x" * 300,
         "out/r[plot].json", "out/" + SURROGATES[0]]
# The built-in traces are left out (a drawn --limit may be huge); test_builtin_traces runs them.
TRACES = ["good.jsonl", "fuzz.bin", "missing.jsonl", "out", "", "x\x00y", "Conversation", SURROGATES[1]]


def option_values(command: str) -> dict[str, st.SearchStrategy[list[str]]]:
    def opt(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
        return values.map(lambda v: [name, v])

    paths = st.sampled_from(PATHS)
    common = {
        "--trace": opt("--trace", st.sampled_from(TRACES + ["good.jsonl,fuzz.bin", "conversation,"])),
        "--num-blocks": opt("--num-blocks", st.one_of(INTS, st.sampled_from(
            ["64", "64,unbounded", "8,16,32", "inf", ",", "2147483647", "2147483646", "unbounded"]))),
        "--block-size": opt("--block-size", st.one_of(INTS, st.sampled_from(["16", "512", "1048576"]))),
        "--max-running": opt("--max-running", INTS),
        "--decode-chunk": opt("--decode-chunk", INTS),
        "--max-output": opt("--max-output", INTS),
        "--hash-algo": opt("--hash-algo", st.sampled_from(["sha256", "xxh3_128", "weak8", "md5", ""])),
        "--csv": opt("--csv", paths),
        "--json": opt("--json", paths),
        "--plot": opt("--plot", paths),
        "--progress": st.sampled_from([["--progress"], ["--no-progress"]]),
        "--bogus": st.sampled_from([["--nope"], ["stray"], ["--limit"], ["-x"]]),
    }
    if command == "replay":
        return {**common,
                "--samples": opt("--samples", INTS),
                "--step-ms": opt("--step-ms", FLOATS),
                "--limit": opt("--limit", INTS),
                "--strict": st.sampled_from([["--strict"], ["--lenient"]]),
                "--engine": opt("--engine", st.sampled_from(
                    ["impl", "spec", "radix", "nope", "a:b", "os:sep", "pagedprefix.spec:SpecCache.create",
                     ":", "os:"])),
                "--check-spec": st.just(["--check-spec"]),
                "--repro": opt("--repro", paths),
                # The cluster mode (pagedprefix.cluster): its options fail in one line too.
                "--replicas": opt("--replicas", st.sampled_from(["1", "2", "0", "257", "x"])),
                "--router": opt("--router", st.sampled_from(
                    ["round_robin", "prefix_aware", "least_loaded", "x"])),
                "--router-lambda": opt("--router-lambda", st.sampled_from(["0", "1.5", "-1", "nan", "inf"])),
                "--drop-events": opt("--drop-events", st.sampled_from(["0", "0.5", "1", "2", "nan"])),
                "--restart-replica": opt("--restart-replica", st.sampled_from(
                    ["0@1", "1@0", "9@9", "x", "@"])),
                "--transport": opt("--transport", st.sampled_from(["inprocess", "zmq", "udp"])),
                "--free-order": opt("--free-order", st.sampled_from(
                    ["append_all", "unhashed_to_head", "lifo"])),
                "--indexer": opt("--indexer", st.sampled_from(["reference", "nope:x", "jsonl:"]))}
    return {**common,
            "--limit": opt("--limit", INTS),
            "--engines": opt("--engines", st.sampled_from(
                ["all", "hash", "radix", "hash/append_all", "x", ""])),
            "--memory": opt("--memory", st.sampled_from(["none", "walk", "tracemalloc", "other"]))}


# Each run is kept small: these come first, so a drawn option of the same name overrides them.
SMALL = ["--trace", "good.jsonl", "--num-blocks", "64", "--limit", "4", "--max-output", "6"]
BASE = {"replay": SMALL, "compare-engines": [*SMALL, "--memory", "none", "--engines", "radix"]}


@st.composite
def command_line(draw: st.DrawFn, command: str) -> list[str]:
    options = option_values(command)
    names = draw(st.lists(st.sampled_from(sorted(options)), max_size=5))
    args = [command, *BASE[command]]
    for name in names:
        args += draw(options[name])
    return args


@pytest.fixture(autouse=True)
def _in_workdir(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(workdir)
    yield


def check_outcome(args: list[str], result: Any) -> None:
    """The rule of the module docstring."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args!r} raised {result.exception!r}") from result.exception
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.stderr)
    if result.exit_code == 0:
        return
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (args, result.stderr)
    assert lines[0].startswith(f"pagedprefix {args[0]}: error: "), (args, lines[0])
    assert "Traceback" not in result.output


def run(args: list[str]) -> Any:
    return CliRunner().invoke(app(), args)


@pytest.mark.parametrize("command", ["replay", "compare-engines"])
@hostile_settings()
@given(data=st.data(), contents=trace_bytes())
def test_replay_commands_report_every_user_error_in_one_line(command: str, data: st.DataObject,
                                                             contents: bytes) -> None:
    Path("fuzz.bin").write_bytes(contents)
    args = data.draw(command_line(command))
    CALLS[f"cli.{command}"] += 1
    check_outcome(args, run(args))


class WorkStarted(Exception):
    """Raised where ``generate`` would start loading the model: everything before it was checked."""


GENERATE_OPTIONS: dict[str, st.SearchStrategy[list[str]]] = {
    "--system": st.sampled_from(["s", "", SURROGATES[0], "[red]x"]).map(lambda v: ["--system", v]),
    "--prompt": st.sampled_from(["q", "", SURROGATES[2]]).map(lambda v: ["--prompt", v]),
    "--n": INTS.map(lambda v: ["--n", v]),
    "--max-tokens": INTS.map(lambda v: ["--max-tokens", v]),
    "--block-size": INTS.map(lambda v: ["--block-size", v]),
    "--manager": st.sampled_from(["auto", "impl", "spec", "x"]).map(lambda v: ["--manager", v]),
    "--backend": st.sampled_from(["auto", "reference", "triton", "cuda"]).map(lambda v: ["--backend", v]),
    "--device": st.sampled_from(["cpu", "cuda", "cuda:7", "meta", "tpu", "", "cpu:0"]).map(
        lambda v: ["--device", v]),
    "--check": st.just(["--check"]),
    "--bogus": st.sampled_from([["--nope"], ["stray"]]),
}


@hostile_settings()
@given(data=st.data())
def test_generate_reports_every_user_error_before_loading_the_model(data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(GENERATE_OPTIONS)), max_size=5))
    args = ["generate"]
    if data.draw(st.booleans()):
        args += ["--system", "s", "--prompt", "q"]
    for name in names:
        args += data.draw(GENERATE_OPTIONS[name])
    CALLS["cli.generate"] += 1
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pagedprefix.model.weights.load_weights", _work_started)
        result = run(args)
    if isinstance(result.exception, WorkStarted):
        return  # every check passed: the model would be loaded now
    check_outcome(args, result)


def _work_started(*args: object, **kwargs: object) -> None:
    raise WorkStarted


def test_plot_without_matplotlib_fails_before_the_replay_with_the_whole_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report: ``--plot`` after ``pip install .`` ran the whole replay (229 s) and then printed a
    hint from which rich had dropped ``[plot]``."""
    for module in ("matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    monkeypatch.setattr("pagedprefix.replay.cli.load_trace", _work_started)
    for command in ("replay", "compare-engines"):
        monkeypatch.setattr(f"pagedprefix.replay.{'cli' if command == 'replay' else 'compare'}.load_trace",
                            _work_started)
        result = run([command, "--plot", "out/curve.png"])
        assert result.exit_code == 2 and result.exception is not None and not isinstance(
            result.exception, WorkStarted)
        assert result.stderr == (f"pagedprefix {command}: error: --plot needs matplotlib (the plot extra): "
                                 "pip install 'pagedprefix[plot]', or pip install matplotlib\n")


@pytest.mark.parametrize("option", ["--json", "--csv", "--plot", "--repro"])
def test_an_output_into_a_missing_directory_fails_before_the_replay(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pagedprefix.replay.cli.load_trace", _work_started)
    result = run(["replay", "--check-spec", option, "missing/out.file"])
    assert result.exit_code == 2
    assert result.stderr == (f"pagedprefix replay: error: {option} missing/out.file: "
                             "the directory missing does not exist\n")


def test_a_trace_with_corrupt_deflate_data_is_one_line() -> None:
    """The report: a trace with corrupt deflate data ended in a ``zlib.error`` traceback."""
    packed = bytearray(gzip.compress(("\n".join(GOOD_LINES * 50) + "\n").encode()))
    packed[20:30] = bytes(b ^ 0x5A for b in packed[20:30])
    Path("corrupt.jsonl.gz").write_bytes(bytes(packed))
    for command in ("replay", "compare-engines"):
        result = run([command, "--trace", "corrupt.jsonl.gz"])
        assert result.exit_code == 2, result.output
        expected = f"pagedprefix {command}: error: corrupt.jsonl.gz: cannot read trace: "
        assert result.stderr.startswith(expected)
        assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["replay", "compare-engines"])
def test_builtin_traces(command: str) -> None:
    traces = "synthetic" if command == "replay" else "conversation,synthetic"
    args = [command, *BASE[command], "--trace", traces]
    result = run(args)
    assert result.exit_code == 0, result.output
    assert "Conversation" not in result.output


def test_bad_lines_are_shown_as_text_not_markup() -> None:
    Path("markup.jsonl").write_text(json.dumps({**GOOD, "hash_ids": "[/red]"}) + "\n" + GOOD_LINES[0] + "\n")
    result = run(["replay", "--trace", "markup.jsonl", "--num-blocks", "64", "--max-output", "2"])
    assert result.exit_code == 0, result.output
    assert "hash_ids must be a list of ints, got str" in result.stderr
    assert "skipped 1 bad line(s) in markup.jsonl:" in result.stderr


# ----- real processes -----------------------------------------------------------------------------


def pagedprefix(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed console script (or ``python -c CODE`` that calls its entry point)."""
    if code is not None:
        argv = [sys.executable, "-c", code, *args]
    else:
        script = Path(sys.executable).with_name("pagedprefix")
        argv = [str(script), *args] if script.exists() else [sys.executable, "-m", "pagedprefix", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


SUBPROCESS_CASES = [
    (["replay", "--nope"], "pagedprefix replay: error: No such option: --nope"),
    (["replay", "--block-size", "0"], "pagedprefix replay: error: Invalid value for '--block-size'"),
    (["replay", "--json", "missing/x.json", "--limit", "3"],
     "pagedprefix replay: error: --json missing/x.json"),
    (["replay", "--step-ms", "inf", "--limit", "3"], "pagedprefix replay: error: step_ms must be"),
    (["replay", "--trace", "corrupt.jsonl.gz"],
     "pagedprefix replay: error: corrupt.jsonl.gz: cannot read trace"),
    (["compare-engines", "--csv", "missing/x.csv"],
     "pagedprefix compare-engines: error: --csv missing/x.csv"),
    pytest.param(["generate", "--system", "s", "--prompt", "q", "--device", "nope"],
                 "pagedprefix generate: error: --device 'nope' is not a torch device",
                 marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")),
]


@pytest.mark.parametrize(("args", "start"), SUBPROCESS_CASES)
def test_real_processes_print_one_line_and_exit_2(args: list[str], start: str, workdir: Path) -> None:
    packed = bytearray(gzip.compress(("\n".join(GOOD_LINES * 50) + "\n").encode()))
    packed[20:30] = bytes(b ^ 0x5A for b in packed[20:30])
    (workdir / "corrupt.jsonl.gz").write_bytes(bytes(packed))
    done = pagedprefix(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(start) and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_real_process_without_matplotlib_fails_at_once() -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['pagedprefix'] + sys.argv[1:]; "
            "from pagedprefix.cli import main; main()")  # as if matplotlib were not installed
    start = time.perf_counter()
    done = pagedprefix("replay", "--trace", "conversation", "--plot", "out/curve.png", code=code)
    assert time.perf_counter() - start < 60  # the whole conversation trace is never replayed
    assert done.returncode == 2
    assert done.stderr == ("pagedprefix replay: error: --plot needs matplotlib (the plot extra): "
                           "pip install 'pagedprefix[plot]', or pip install matplotlib\n")


def test_print_counts() -> None:
    """Last in the module: how many command lines the fuzz tests ran."""
    report("cli")

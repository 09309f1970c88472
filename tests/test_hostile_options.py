"""Every option of every command answers an absurd value with the one-line error (docs/SECURITY.md
"Limits"; ``src/cli.py``: one line ``pagedprefix COMMAND: error: ...`` on stderr, exit code 2,
never a traceback).

The walker finds the commands and their options itself (``typer.main.get_command`` of the app after
``pagedprefix.cli._register()``), so an option added later is walked without being listed here. It
feeds each option the absurd values of its type:

- ``int`` and ``float``: a 5000-digit number and its negative (``int()`` refuses more than 4300
  digits with a ValueError; ``float()`` makes them infinite). Always a user error;
- ``str``: structured text embedding 5000-digit numbers (``full(N)``, ``1,N``, ``sliding(N,16)``,
  ``R@N``, ``0.N``) and a NUL byte. A command may refuse them (one line, exit 2) or
  accept them (a normal exit, no traceback): a free-form name is legitimately valid;
- ``Path``: paths under ``/proc`` that cannot be created (in a missing directory, and in ``/proc``
  itself, where even ``root`` can make nothing), a 5001-character name (longer than any file
  system allows) and a name with a NUL byte. Always a user error, checked before any work.

Flags (no value) are not walked. Each run is a fork of this process (the CLI, already imported,
runs in the child as the console script would: its own stdout and stderr, its own process group)
with a short timeout; a run that does not end in time is killed and fails the test.

A command that would do real work for an accepted value runs with :data:`BASE` options that keep
the work small or stop it early (each says why), or its option has an :data:`UNWALKED` entry with
the reason. Neither may name an option the app does not have (:func:`test_the_walker_tables_are_current`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self").is_dir(),
                                reason="forks each run; the paths nothing can make are under /proc (Linux)")

HUGE = "1" + "0" * 5000
NUMBER_VALUES = {"huge": HUGE, "-huge": "-" + HUGE}
TEXT_VALUES = {
    "huge": HUGE,
    "list": f"1,{HUGE}",  # --num-blocks, the sweep's axes
    "full(huge)": f"full({HUGE})",  # --groups
    "sliding(huge,16)": f"sliding({HUGE},16)",
    "full+sliding(huge)": f"full(16)+sliding({HUGE},16)",
    "r@huge": f"1@{HUGE}",  # --restart-replica
    "0.huge": f"0.{HUGE}",  # --release
    "nul": "nul\0byte",
}
PATH_VALUES = {
    "proc": "/proc/pagedprefix-nope/x",  # its directory does not exist
    "proc-child": "/proc/pagedprefix-nope",  # its directory exists, but nothing can be made in it
    "too-long": HUGE,  # a name longer than any file system allows
    "nul": "nul\0path",
}
VALUES: dict[str, dict[str, str]] = {"int": NUMBER_VALUES, "float": NUMBER_VALUES, "str": TEXT_VALUES,
                                     "Path": PATH_VALUES}
MAY_ACCEPT = {"str"}
"""The types whose absurd values may be legitimately valid (a name, a prompt): their run may end
normally instead; the others must be refused."""

RUN_TIMEOUT = 60.0
"""Seconds one run may take (an error takes milliseconds; an accepted replay about a second)."""

ARGUMENTS: dict[str, list[str]] = {"history": ["vllm"]}
"""A valid value for each positional argument, in order (a walked argument's is replaced)."""

BASE: dict[str, list[str]] = {
    # An accepted value runs a conformance run: no stateful example, no vector, no trace (< 1 s).
    "conform": ["--engine", "spec", "--max-examples", "0", "--no-builtin-vectors", "--no-trace"],
    # Only --engine could be accepted, and it is UNWALKED; --out never touches docs/MATRIX.md.
    "matrix": ["--out", "MATRIX.md"],
    # Offline from an empty cache: no download, no release run; --out never touches docs/HISTORY.md.
    "history": ["--offline", "--cache-dir", "cache", "--out", "HISTORY.md"],
    # An accepted value replays 20 synthetic requests through 64 blocks (about a second).
    "replay": ["--trace", "synthetic", "--limit", "20", "--num-blocks", "64", "--no-progress"],
    "compare-engines": ["--trace", "synthetic", "--limit", "20", "--num-blocks", "64", "--engines", "spec",
                        "--no-progress"],
    # --prompt and --system are free text: a valid one would run the model. The device is checked
    # after every other option and before the model is loaded: an unsupported one stops there.
    "generate": ["--system", "s", "--prompt", "p", "--device", "meta"],
    # One cheap scenario instead of every built-in and generated one.
    "indexer-conform": ["--generated", "0", "--scenario", "lost-batch"],
    # An accepted value sweeps one cell of 20 synthetic requests on one worker.
    "sweep": ["--trace", "synthetic", "--workers", "1", "--no-progress"],
}
"""Options given before the walked one (which, given last, wins over a BASE value of its own)."""
TAIL: dict[str, list[str]] = {"sweep": ["--", "--limit", "20"]}  # not an axis: it would mask one
"""Arguments after the walked option (a sweep passes what follows ``--`` to every cell)."""
EXTRA: dict[tuple[str, str], list[str]] = {
    # --repro is only written (and so only checked) with --check-spec.
    ("replay", "--repro"): ["--check-spec"],
}
"""Options that make the walked option matter, given before it."""
UNWALKED: dict[tuple[str, str], str] = {
    ("matrix", "--engine"): "any name is accepted (resolved when its cell runs), and a matrix run "
                            "runs every shipped engine's conformance suite: minutes, not a check",
}
"""Options not walked, each with its reason."""


@dataclass(frozen=True)
class Case:
    command: str
    option: str
    kind: str
    label: str
    value: str
    positional: bool = False


def _type_name(param: Any) -> str:
    """``int``, ``float``, ``str`` or ``Path`` (a ``list[X]`` option: ``X``)."""
    kind = str(param.bare_type())
    return kind[len("list["):-1] if kind.startswith("list[") else kind


def _commands() -> dict[str, Any]:
    from pagedprefix.cli import _register, app

    _register()
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def _walked_params() -> Iterator[tuple[str, Any]]:
    """Every option that takes a value, and every positional argument, of every command."""
    for name, command in _commands().items():
        for param in command.params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                continue
            yield name, param


def _cases() -> list[Any]:
    cases = []
    for command, param in _walked_params():
        positional = param.param_type_name == "argument"
        option = param.name if positional else param.opts[0]
        if (command, option) in UNWALKED:
            continue
        kind = _type_name(param)
        values = VALUES.get(kind, {"unknown type": ""})
        for label, value in values.items():
            case = Case(command, option, kind, label, value, positional)
            cases.append(pytest.param(case, id=f"{command} {option} {label}"))
    return cases


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str
    timed_out: bool


def _run_forked(argv: list[str], cwd: Path, timeout: float = RUN_TIMEOUT) -> Outcome:
    """``pagedprefix ARGV`` in a forked child (its own process group, cwd, stdin from /dev/null,
    stdout and stderr to files), killed with its group after ``timeout`` seconds. An exception
    that escapes ``main`` is printed as the interpreter would (a traceback, exit code 1)."""
    out_path, err_path = cwd / "stdout.txt", cwd / "stderr.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 70
        try:
            os.setpgid(0, 0)
            os.chdir(cwd)
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                    (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                opened = os.open(path, flags, 0o644)
                os.dup2(opened, fd)
                os.close(opened)
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
            sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
            from pagedprefix.cli import main

            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    timed_out = not _ended_within(pid, timeout)
    if timed_out:
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # whatever the run left behind in its group
    return Outcome(os.waitstatus_to_exitcode(status), out_path.read_text(errors="replace"),
                   err_path.read_text(errors="replace"), timed_out)


def _ended_within(pid: int, timeout: float) -> bool:
    """Whether the child ``pid`` ends within ``timeout`` seconds (it is not reaped)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd: poll
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.005)
        return False
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _argv(case: Case) -> list[str]:
    positional = list(ARGUMENTS.get(case.command, []))
    if case.positional:
        index = [p.name for p in _commands()[case.command].params if p.param_type_name == "argument"]
        positional[index.index(case.option)] = case.value
        walked: list[str] = []
    else:
        walked = [case.option, case.value]
    return [case.command, *positional, *BASE.get(case.command, []),
            *EXTRA.get((case.command, case.option), []), *walked, *TAIL.get(case.command, [])]


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Do once, here, what every forked run would otherwise do again: import what the commands
    import lazily, and run each command to a usage error (click builds the commands)."""
    from pagedprefix.cli import main

    for name in ("torch", "pagedprefix.replay.compare", "pagedprefix.cluster.sweep",
                 "pagedprefix.conformance.reporting.matrix", "pagedprefix.conformance.reporting.history"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    quiet = (contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()))
    for command in _commands():
        with quiet[0], quiet[1], contextlib.suppress(SystemExit):
            main([command, *ARGUMENTS.get(command, []), "--pagedprefix-no-such-option"])


@pytest.mark.parametrize("case", _cases())
def test_every_option_answers_an_absurd_value_in_one_line(case: Case, tmp_path: Path) -> None:
    assert case.kind in VALUES, (f"{case.command} {case.option}: the walker has no absurd values for "
                                 f"type {case.kind!r}; add them to VALUES")
    (tmp_path / "cache").mkdir()
    done = _run_forked(_argv(case), tmp_path)
    where = f"pagedprefix {case.command} {case.option} <{case.label}>"
    assert not done.timed_out, (f"{where} ran past {RUN_TIMEOUT:g} s: an accepted value does real work; "
                                f"stop it early in BASE or give it an UNWALKED reason. "
                                f"stderr: {done.err[-300:]!r}")
    assert "Traceback" not in done.out + done.err, f"{where}: {done.err[-2000:]}"
    assert "integer string conversion" not in done.out + done.err, f"{where}: {done.err[-500:]}"
    lines = done.err.strip().splitlines()
    if done.code == 2:
        assert len(lines) == 1, f"{where}: exit 2 with {len(lines)} lines on stderr: {done.err[:1000]!r}"
        assert lines[0].startswith(f"pagedprefix {case.command}: error: "), f"{where}: {lines[0][:300]!r}"
    else:
        assert case.kind in MAY_ACCEPT, (f"{where}: exit {done.code}, not the one-line user error "
                                         f"(stderr {done.err[:500]!r})")
        assert done.code in (0, 1, 3), f"{where}: exit {done.code}; stderr {done.err[:500]!r}"


def test_the_walker_walks_every_command() -> None:
    walked = {(c.values[0].command, c.values[0].option) for c in _cases()}
    commands = {command for command, _ in walked}
    assert commands == set(_commands()), sorted(set(_commands()) - commands)
    assert len(walked) > 60, len(walked)
    assert ("replay", "--groups") in walked and ("conform", "--database") in walked
    assert ("history", "--cache-dir") in walked and ("history", "engine") in walked


def test_the_walker_tables_are_current() -> None:
    """Every command and option the tables name exists (a renamed one would silently stop
    mattering), every UNWALKED entry gives a reason, and every command gets its positional
    arguments and required options (without them every run would stop at "missing", whatever
    the walked value)."""
    names = {(command, param.opts[0] if param.param_type_name == "option" else param.name)
             for command, param in _walked_params()}
    commands = _commands()
    assert set(BASE) <= set(commands) and set(TAIL) <= set(commands) and set(ARGUMENTS) <= set(commands)
    assert set(EXTRA) <= names and set(UNWALKED) <= names, sorted((set(EXTRA) | set(UNWALKED)) - names)
    assert all(len(reason) > 20 for reason in UNWALKED.values())
    for name, command in commands.items():
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        assert len(ARGUMENTS.get(name, [])) == len(arguments), f"{name}: give ARGUMENTS its arguments"
        required = {p.opts[0] for p in command.params if p.param_type_name == "option" and p.required}
        assert required <= set(BASE.get(name, [])), f"{name}: give BASE its required options {required}"


def test_a_forked_run_reports_a_traceback_and_a_timeout(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness itself: an escaping exception shows as a traceback, a hang as a timeout."""
    import pagedprefix.cli as cli

    def boom(*args: object, **kwargs: object) -> None:
        raise ValueError("Exceeds the limit (4300 digits)")

    monkeypatch.setattr(cli, "app", boom)
    done = _run_forked(["replay"], tmp_path)
    assert done.code == 1 and "Traceback" in done.err and "Exceeds the limit" in done.err

    monkeypatch.setattr(cli, "app", lambda *a, **k: time.sleep(30))
    started = time.monotonic()
    done = _run_forked(["replay"], tmp_path, timeout=0.5)
    assert done.timed_out and time.monotonic() - started < 10


# -- the fixes the walker found, one by one ---------------------------------------------------------


def _one_line_error(argv: list[str], cwd: Path) -> str:
    """Run ``pagedprefix ARGV`` (forked, in ``cwd``, 30 s at most: a path wrongly accepted runs the
    real work); its one stderr line, asserting exit code 2 and one line."""
    done = _run_forked(argv, cwd, timeout=30)
    lines = done.err.strip().splitlines()
    assert not done.timed_out, f"not refused: still running after 30 s; stderr {done.err[-300:]!r}"
    assert done.code == 2, done.err[-500:]
    assert len(lines) == 1 and lines[0].startswith(f"pagedprefix {argv[0]}: error: "), done.err[:500]
    assert "Traceback" not in done.err + done.out
    return lines[0]


@pytest.mark.parametrize("text", [f"full({HUGE})", f"sliding({HUGE},16)", f"full(16)+sliding({HUGE},16)",
                                  f"chunked(16,{HUGE})", f"mamba({'0' * 5000}16)"])
def test_parse_groups_bounds_every_number_before_int(text: str) -> None:
    from pagedprefix.spec import InvalidConfig, parse_groups
    from pagedprefix.spec.groups import MAX_NUMBER_DIGITS

    with pytest.raises(InvalidConfig, match=rf"holds a number of 5,00[12] digits; at most {MAX_NUMBER_DIGITS}"
                       ) as info:
        parse_groups(text)
    assert len(str(info.value)) < 200, str(info.value)  # the text is quoted cut short


def test_parse_groups_keeps_numbers_within_the_bound_for_check_groups() -> None:
    from pagedprefix.spec import InvalidConfig, parse_groups
    from pagedprefix.spec.groups import MAX_GROUPS, MAX_NUMBER_DIGITS, check_groups

    big = "9" * MAX_NUMBER_DIGITS
    groups = parse_groups(f"full(16)+sliding({big},16)")
    assert groups[1].window == int(big)
    with pytest.raises(InvalidConfig, match="a sliding window must be in"):  # its range: check_groups
        check_groups(groups, 16)
    assert parse_groups("full(016)+sliding(0128,16)") == parse_groups("full(16)+sliding(128,16)")
    with pytest.raises(InvalidConfig, match=f"groups: at most {MAX_GROUPS} groups, got 100,000"):
        parse_groups("+".join(["full(16)"] * 100_000))
    with pytest.raises(InvalidConfig, match=r"groups: cannot read 'full\(x\)'"):
        parse_groups("full(16)+full(x)")


@pytest.mark.parametrize("groups", [f"full({HUGE})", f"sliding(1{'0' * 5000},16)",
                                    f"full(16)+sliding({HUGE},16)"])
def test_replay_groups_with_a_huge_number_is_one_line(groups: str,
                                                       tmp_path: Path) -> None:
    line = _one_line_error(["replay", "--trace", "synthetic", "--groups", groups], tmp_path)
    assert "holds a number of 5,00" in line and len(line) < 300, line


def test_an_argument_with_a_nul_byte_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(["conform", "--engine", "spec", "--engine", "x\0y"], tmp_path)
    assert line == (r"pagedprefix conform: error: argument 5 'x\x00y' holds a NUL byte "
                    "(no command line can carry one)")


def test_conform_database_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(["conform", "--engine", "spec", "--database", "/proc/pagedprefix-db"], tmp_path)
    expected = "pagedprefix conform: error: --database /proc/pagedprefix-db: cannot be created ("
    assert line.startswith(expected), line
    line = _one_line_error(["conform", "--engine", "spec", "--database", HUGE], tmp_path)
    assert "not a usable path (File name too long)" in line and len(line) < 300, line
    for option in ("--vectors", "--path"):
        line = _one_line_error(["conform", "--engine", "spec", option, HUGE], tmp_path)
        assert f"{option} '1000" in line and "not a usable path (File name too long)" in line, line


def test_conform_database_check_leaves_nothing_behind(tmp_path: Path) -> None:
    from pagedprefix.conformance.reporting.outputs import PROBE_PREFIX, check_output_dir

    check_output_dir(tmp_path / "db", "--database")
    assert not (tmp_path / "db").exists()  # made, probed, removed: the run makes it again
    (tmp_path / "kept").mkdir()
    check_output_dir(tmp_path / "kept", "--database")
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
    check_output_dir(tmp_path / "a" / "b" / "c", "--cache-dir", parents=True)
    assert list(tmp_path.iterdir()) == [tmp_path / "kept"]
    assert not any(p.name.startswith(PROBE_PREFIX) for p in tmp_path.rglob("*"))


def test_check_output_dir_refusals(tmp_path: Path) -> None:
    from pagedprefix.conformance.reporting.outputs import UserError, check_output_dir

    (tmp_path / "file").write_text("x")
    cases = [
        (Path("/proc/pagedprefix-db"), r"--database /proc/pagedprefix-db: cannot be created \("),
        (tmp_path / "file", "not a directory"),
        (tmp_path / "missing" / "db", f"the directory {tmp_path / 'missing'} does not exist"),
        (Path(HUGE), r"not a usable path \(File name too long\)"),
        (Path("nul\0db"), r"not a usable path \(embedded null byte\)"),
    ]
    for directory, message in cases:
        with pytest.raises(UserError, match=message):
            check_output_dir(directory, "--database")


def test_check_output_path_creates_a_probe(tmp_path: Path) -> None:
    """--json, --out, --csv, --plot: the file's directory takes a new file now, or it is refused."""
    from pagedprefix.conformance.reporting.outputs import UserError, check_output_path, output_problem

    for path, message in [
        (Path("/proc/pagedprefix-r.json"), r"--json /proc/pagedprefix-r.json: cannot be written \("),
        (tmp_path, "is a directory"),
        (Path("/proc/pagedprefix-nope/report.json"), "the directory /proc/pagedprefix-nope does not exist"),
        (Path(HUGE), r"not a usable path \(File name too long\)"),
    ]:
        with pytest.raises(UserError, match=message):
            check_output_path(path, "--json")
    existing = tmp_path / "old.json"
    existing.write_text("kept")
    outputs = {"--json": existing, "--csv": tmp_path / "new.csv", "--plot": Path(os.devnull)}
    assert output_problem(outputs) is None
    assert existing.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_check_output_path_refuses_a_read_only_directory(tmp_path: Path) -> None:
    from pagedprefix.conformance.reporting.outputs import UserError, check_output_dir, check_output_path

    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(UserError, match="not writable"):
        check_output_path(tmp_path / "ro" / "report.json", "--json")
    with pytest.raises(UserError, match="cannot be"):
        check_output_dir(tmp_path / "ro" / "db", "--database")


PROC = "/proc/pagedprefix-x"  # its directory exists, nothing can be made in it


@pytest.mark.parametrize(("argv", "message"), [
    (["replay", "--trace", "synthetic", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["replay", "--trace", "synthetic", "--csv", PROC], f"--csv {PROC}: cannot be written"),
    (["replay", "--trace", "synthetic", "--check-spec", "--repro", PROC], f"--repro {PROC}: cannot be"),
    (["compare-engines", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["sweep", "--csv", PROC], f"--csv {PROC}: cannot be written"),
    (["indexer-conform", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["indexer-conform", "--path", HUGE], "not a usable path (File name too long)"),
    (["conform", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["matrix", "--out", PROC], f"--out {PROC}: cannot be written"),
    (["matrix", "--out", "M.md", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["history", "vllm", "--out", PROC], f"--out {PROC}: cannot be written"),
    (["history", "vllm", "--out", "H.md", "--json", PROC], f"--json {PROC}: cannot be written"),
    (["history", "vllm", "--out", "H.md", "--cache-dir", PROC], f"--cache-dir {PROC}: cannot be created"),
    (["history", "vllm", "--out", "H.md", "--offline", "--cache-dir", PROC], f"--cache-dir {PROC}: not a"),
    (["history", "vllm", "--release", f"0.{HUGE}"], "--release '0.1000"),
    (["history", "vllm", "--release", f"0.6.5.post{HUGE}"], "--release '0.6.5.post1000"),
])
def test_every_output_option_is_checked_by_making_it(argv: list[str], message: str, tmp_path: Path) -> None:
    line = _one_line_error(argv, tmp_path)  # in tmp_path: history's other outputs default to docs/
    assert message in line and len(line) < 400, line


def test_restart_replica_takes_ascii_digits_only() -> None:
    from pagedprefix.cluster.options import parse_restart

    assert parse_restart("1@500") == (1, 500)
    for text in ("²@5", "1@①", f"1@{HUGE}", f"{HUGE}@1"):
        with pytest.raises(ValueError, match=r"expected REPLICA@REQUEST, e\.g\. 1@500") as info:
            parse_restart(text)
        assert len(str(info.value)) < 200

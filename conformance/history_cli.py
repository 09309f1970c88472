"""The ``pagedprefix history`` command (registered by :func:`pagedprefix.conformance.cli.register`)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from pagedprefix.spec.errors import safe_repr

from .reporting.history import (
    CI_RELEASES,
    HISTORY_EXAMPLES,
    HISTORY_PATH,
    RELEASE_TIMEOUT_S,
    ReleaseResult,
    annotate,
    check,
    render_markdown,
    run_history,
    to_json,
)
from .reporting.history_fetch import FINAL, FetchError, default_cache_dir, released_versions, version_key
from .reporting.outputs import UserError, check_output_dir, check_output_path, check_seconds, path_problem
from .running.supervise import BUDGET_SLACK, supervised_command

MAX_RELEASE_CHARS = 40
"""The longest ``--release`` accepted (``0.6.6.post1`` has 11 characters): its numbers are
converted to ints, which refuses more than 4300 digits with a traceback."""


def _fail(message: str) -> typer.Exit:
    print(f"pagedprefix history: error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(2)


def history(
    engine: Annotated[str, typer.Argument(help="the engine whose releases to judge (only vllm)")],
    release: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--release", help="judge this release (repeatable; default: every release from 0.6.5 on)"
        ),
    ] = None,
    ci: Annotated[bool, typer.Option("--ci", help=f"the fixed CI subset: {', '.join(CI_RELEASES)}")] = False,
    cache_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--cache-dir", help="where extracted wheels are kept (default ~/.cache/pagedprefix/vllm)"
        ),
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="use only releases already in the cache")
    ] = False,
    jobs: Annotated[int, typer.Option("--jobs", help="worker processes at once (one release each)")] = 2,
    examples: Annotated[
        int, typer.Option("--examples", help="stateful examples per release (docs/HISTORY.md: the default)")
    ] = HISTORY_EXAMPLES,
    out: Annotated[
        Path, typer.Option("--out", help="the Markdown history to write (or --check)")
    ] = HISTORY_PATH,
    json_path: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--json", help="also write the results as JSON (default: --out with .json)"),
    ] = None,
    check_: Annotated[
        bool, typer.Option("--check", help="exit 1 if the regenerated releases differ from --out")
    ] = False,
    release_budget: Annotated[
        float,
        typer.Option(
            "--release-budget", help="seconds one release may take (fetch, load, suite); then INCOMPLETE"
        ),
    ] = RELEASE_TIMEOUT_S,
    time_budget: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--time-budget", help="seconds the whole history may take (default: no limit); exit 3"),
    ] = None,
) -> None:
    """Run the default conformance suite on each vLLM V1 release (its own wheel, its own process)
    and write docs/HISTORY.md and docs/HISTORY.json (--check compares instead).

    Exit status: 0 done (identical, with --check), 1 a difference (--check), 2 a user error,
    3 incomplete: a release ran out of its --release-budget or the --time-budget ran out first
    (what was judged is written or compared; the rest is listed)."""
    try:
        for name, seconds in (("--release-budget", release_budget), ("--time-budget", time_budget)):
            if seconds is not None:
                check_seconds(name, seconds)
        if engine != "vllm":
            raise UserError(f"only vllm has a release history here, not {engine!r}")
        if not 1 <= jobs <= (os.cpu_count() or 1):
            raise UserError(f"--jobs must be in [1, {os.cpu_count() or 1}], got {jobs}")
        for v in release or []:
            if len(v) > MAX_RELEASE_CHARS or not FINAL.fullmatch(v):  # bounds its numbers' digits
                raise UserError(
                    f"--release {safe_repr(v)} is not a release number like 0.10.1 or 0.6.6.post1"
                )
            if version_key(v) < version_key("0.6.5"):
                raise UserError(f"--release {v}: vLLM's V1 cache starts at 0.6.5")
        if not 1 <= examples <= 100_000:
            raise UserError(f"--examples must be in [1, 100000], got {examples}")
        if release and ci:
            raise UserError("--release and --ci exclude each other")
        if check_ and not out.is_file():
            raise UserError(f"--check: {out} does not exist")
        if not check_:
            check_output_path(out, "--out")
        json_out = json_path if json_path is not None else (None if check_ else out.with_suffix(".json"))
        if json_out is not None:
            check_output_path(json_out, "--json")
        if cache_dir is not None and offline:  # only read: the releases already in it
            problem = path_problem(cache_dir, "--cache-dir")
            if problem is not None:
                raise UserError(problem)
            if not cache_dir.is_dir():
                raise UserError(f"--cache-dir {cache_dir}: not a directory (--offline reads releases in it)")
        elif cache_dir is not None:  # the downloads are extracted into it (made with its parents)
            check_output_dir(cache_dir, "--cache-dir", parents=True)
    except UserError as exc:
        raise _fail(str(exc)) from None
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    args = _HistoryArgs(release or [], ci, offline, jobs, examples, out, json_path, json_out, check_,
                        release_budget, time_budget)
    # Each release's worker is killed BUDGET_SLACK seconds past the deadline at the latest; the
    # history itself gets as long again to write what they judged.
    hard = None if time_budget is None else time_budget + BUDGET_SLACK
    supervised_command(lambda: _history_run(args, cache), "history", hard)


@dataclass(frozen=True)
class _HistoryArgs:
    """The command line of ``history``, checked."""

    release: list[str]
    ci: bool
    offline: bool
    jobs: int
    examples: int
    out: Path
    json_path: Path | None
    json_out: Path | None
    check: bool
    release_budget: float
    time_budget: float | None


def _history_run(a: _HistoryArgs, cache: Path) -> None:
    """Judge the releases and write or check the history (in the supervised child)."""
    release, ci, offline, out = a.release, a.ci, a.offline, a.out
    json_path, json_out = a.json_path, a.json_out
    if release:
        versions = sorted(dict.fromkeys(release), key=version_key)
    elif ci:
        versions = list(CI_RELEASES)
    elif offline:
        versions = sorted((p.name for p in cache.glob("*") if FINAL.fullmatch(p.name)), key=version_key)
    else:
        try:
            versions = released_versions()
        except FetchError as exc:
            raise _fail(f"{exc} (give --release, or --offline with a filled --cache-dir)") from None
    results = _run_with_progress(versions, cache, a)
    cut = [r for r in results if r.verdict == "INCOMPLETE"]
    for r in cut:
        print(f"history: {r.version} INCOMPLETE: {r.reason}", file=sys.stderr)
    if a.check:
        annotate(results, cache)
        if json_out is not None:
            json_out.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")
        judged = [r for r in results if r.verdict != "INCOMPLETE"]
        problems = check(judged, out.read_text(encoding="utf-8"))
        if problems:
            print(f"{out} differs from a regeneration of {len(judged)} releases:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            raise typer.Exit(1)
        print(f"{out}: {len(judged)} releases identical to a regeneration"
              + (f"; {len(cut)} not judged within the time budget" if cut else ""))
        raise typer.Exit(3 if cut else 0)
    if release or ci:
        # A partial run updates only its releases in an existing history (read from its JSON).
        results = _merge(out.with_suffix(".json") if json_path is None else json_path, results)
    annotate(results, cache)
    if json_out is not None:
        json_out.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")
    out.write_text(render_markdown(results), encoding="utf-8")
    print(f"wrote {out} ({len(results)} releases" + (f", {len(cut)} of them INCOMPLETE)" if cut else ")"))
    if cut:
        raise typer.Exit(3)


def _merge(json_old: Path, results: list[ReleaseResult]) -> list[ReleaseResult]:
    """``results`` over the releases of an earlier run's JSON (the same release: the new result)."""
    if not json_old.is_file():
        return results
    from dataclasses import fields

    names = {f.name for f in fields(ReleaseResult)}
    old = {
        d["version"]: ReleaseResult(**{k: v for k, v in d.items() if k in names})
        for d in json.loads(json_old.read_text(encoding="utf-8"))
    }
    old.update({r.version: r for r in results})
    return sorted(old.values(), key=lambda r: version_key(r.version))


def _run_with_progress(versions: list[str], cache: Path, a: _HistoryArgs) -> list[ReleaseResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("history vllm"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, transient=False, console=None) as bar:
        task = bar.add_task("", total=len(versions))

        def done(r: ReleaseResult) -> None:
            bar.update(task, advance=1, description=f"{r.version}: {r.verdict}")

        return run_history(
            versions, cache, jobs=a.jobs, offline=a.offline, examples=a.examples, progress=done,
            release_budget=a.release_budget, time_budget=a.time_budget,
        )

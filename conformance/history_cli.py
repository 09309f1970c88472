"""The ``pagedprefix history`` command (registered by :func:`pagedprefix.conformance.cli.register`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .reporting.history import (
    CI_RELEASES,
    HISTORY_EXAMPLES,
    HISTORY_PATH,
    ReleaseResult,
    annotate,
    check,
    render_markdown,
    run_history,
    to_json,
)
from .reporting.history_fetch import FINAL, FetchError, default_cache_dir, released_versions, version_key
from .reporting.outputs import UserError, check_output_path


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
) -> None:
    """Run the default conformance suite on each vLLM V1 release (its own wheel, its own process)
    and write docs/HISTORY.md and docs/HISTORY.json (--check compares instead)."""
    try:
        if engine != "vllm":
            raise UserError(f"only vllm has a release history here, not {engine!r}")
        if not 1 <= jobs <= (os.cpu_count() or 1):
            raise UserError(f"--jobs must be in [1, {os.cpu_count() or 1}], got {jobs}")
        for v in release or []:
            if not FINAL.fullmatch(v):
                raise UserError(f"--release {v!r} is not a release number like 0.10.1 or 0.6.6.post1")
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
        if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
            raise UserError(f"--cache-dir {cache_dir}: not a directory")
    except UserError as exc:
        raise _fail(str(exc)) from None
    cache = cache_dir if cache_dir is not None else default_cache_dir()
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
    results = _run_with_progress(versions, cache, jobs, offline, examples)
    if check_:
        annotate(results, cache)
        if json_out is not None:
            json_out.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")
        problems = check(results, out.read_text(encoding="utf-8"))
        if problems:
            print(f"{out} differs from a regeneration of {len(results)} releases:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            raise typer.Exit(1)
        print(f"{out}: {len(results)} releases identical to a regeneration")
        raise typer.Exit(0)
    if release or ci:
        # A partial run updates only its releases in an existing history (read from its JSON).
        results = _merge(out.with_suffix(".json") if json_path is None else json_path, results)
    annotate(results, cache)
    if json_out is not None:
        json_out.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")
    out.write_text(render_markdown(results), encoding="utf-8")
    print(f"wrote {out} ({len(results)} releases)")


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


def _run_with_progress(
    versions: list[str], cache: Path, jobs: int, offline: bool, examples: int
) -> list[ReleaseResult]:
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

        return run_history(versions, cache, jobs=jobs, offline=offline, examples=examples, progress=done)

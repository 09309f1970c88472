"""The pytest plugin, run in a child pytest (``-p pagedprefix.conformance.pytest_plugin``)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

TESTS = str(Path(__file__).parent)
PLUGIN = "pagedprefix.conformance.pytest_plugin"


def plugin_args() -> list[str]:
    """``-p PLUGIN`` unless the ``pytest11`` entry point already loads it (loading it twice fails)."""
    registered = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", PLUGIN]


def run_pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin_args(),
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfEsx",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )


def test_spec_passes_as_pytest_tests(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, "--pagedprefix-engine", "spec", "--pagedprefix-max-examples", "15")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_without_the_option_nothing_is_added(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, "--co")
    assert proc.returncode == 5  # no tests collected


def test_broken_engine_fails_the_right_tests_and_xfail_file_works(tmp_path: Path) -> None:
    xfail = tmp_path / "known.txt"
    xfail.write_text(
        "# known failures\ncow/child-writes-first/dup/b2\nstateful[cow-isolation]\nno/such/case\n"
    )
    proc = run_pytest(
        tmp_path,
        "--pagedprefix-engine",
        "broken_engines:skips_cow",
        "--pagedprefix-profile",
        "core",
        "--pagedprefix-max-examples",
        "300",
        "--pagedprefix-xfail",
        str(xfail),
        "-k",
        "fork-then-append-copies/dup/b2 or child-writes-first/dup/b2 or cow-isolation or hit-content",
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "FAILED ::vector[cow/fork-then-append-copies/dup/b2]" in out
    assert "[cow-isolation]" in out
    assert "2 xfailed" in out and "1 passed" in out
    assert "'no/such/case' matches no conformance test" in out


def test_capability_skips_are_reported_as_skips(tmp_path: Path) -> None:
    proc = run_pytest(
        tmp_path,
        "--pagedprefix-engine",
        "spec",
        "--pagedprefix-profile",
        "single-namespace",
        "--pagedprefix-max-examples",
        "5",
        "-k",
        "extras/lora-separates/b2 or policy-hits",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 skipped" in proc.stdout
    assert "skipped by capability: needs extra:lora (profile single-namespace)" in proc.stdout

"""The design's folders install as subpackages of ``pagedprefix``, never as bare top-level modules
(``spec``, ``impl``, ``kernels`` and ``conformance`` are taken on PyPI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("name", ["spec", "impl", "kernels", "conformance", "replay", "model"])
def test_subpackage_imports_and_bare_name_does_not(name: str, tmp_path: Path) -> None:
    ok = run_python(f"import pagedprefix.{name}", tmp_path)
    assert ok.returncode == 0, ok.stderr
    bare = run_python(f"import {name}", tmp_path)
    assert bare.returncode != 0
    assert "ModuleNotFoundError" in bare.stderr


def test_shipped_data_files_are_installed(tmp_path: Path) -> None:
    code = (
        "from importlib import resources as r\n"
        "assert r.files('pagedprefix.spec').joinpath('key_vectors.json').is_file()\n"
        "assert r.files('pagedprefix').joinpath('py.typed').is_file()\n"
        "v = r.files('pagedprefix.conformance').joinpath('vectors')\n"
        "assert len([p for p in v.iterdir() if p.name.endswith('.json')]) == 9\n"
        "assert v.joinpath('hybrid.json').is_file()\n"
        "d = r.files('pagedprefix.replay').joinpath('data')\n"
        "assert d.joinpath('mooncake_fast25_conversation_trace.jsonl.gz').is_file()\n"
    )
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr


def test_console_script_lists_the_commands(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pagedprefix", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    for command in ("conform", "replay", "generate"):
        assert command in result.stdout

"""The crosshair session must fail on a wrong function, or its green result would mean nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("crosshair")

WRONG = '''
def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Deliberately wrong: floor instead of ceil."""
    assert num_tokens >= 0
    assert block_size >= 1
    n = num_tokens // block_size
    assert n * block_size >= num_tokens
    return n
'''

RIGHT = WRONG.replace("n = num_tokens // block_size", "n = -(-num_tokens // block_size)")


def run_crosshair(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "candidate.py"
    module.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "crosshair", "check", "--analysis_kind=asserts",
         "--per_condition_timeout=8", str(module)],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_wrong_function_is_reported(tmp_path: Path) -> None:
    result = run_crosshair(tmp_path, WRONG)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "candidate.py:7: error" in result.stdout
    assert "blocks_needed(" in result.stdout


def test_right_function_passes(tmp_path: Path) -> None:
    result = run_crosshair(tmp_path, RIGHT)
    assert result.returncode == 0, result.stdout + result.stderr

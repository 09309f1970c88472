"""The module paths from before conformance/'s layers keep working for one version, each with a
``DeprecationWarning`` that names its new path (conformance/CHANGELOG.md "Module paths";
``conformance/_moved.py``)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings

import pytest
from pagedprefix.conformance._moved import MOVED

CHANGELOG_ROWS = {
    "adapters": "protocol", "channels": "protocol", "codec": "protocol", "watchdog": "protocol",
    "properties": "judging", "event_check": "judging", "driver": "judging", "judge": "judging",
    "judge_base": "judging", "judge_retention": "judging", "model": "judging",
    "generate": "generation", "minimize": "generation", "seeding": "generation",
    "vector_format": "generation",
    "stateful": "running", "suite": "running", "subprocess_adapter": "running", "lifetime": "running",
    "supervise": "running", "jsonl_server": "running",
    "matrix": "reporting", "history": "reporting", "history_fetch": "reporting", "history_notes": "reporting",
    "outputs": "reporting",
}
"""conformance/CHANGELOG.md's migration table, written out (``hybrid_judge`` was merged, not moved)."""


def test_the_table_is_the_changelog_s() -> None:
    assert {old.rsplit(".", 1)[1]: new.split(".")[2] for old, new in MOVED.items()} == CHANGELOG_ROWS


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    spec = new.__spec__
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]} "):
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__ is spec and module.__name__ == MOVED[old]  # the module's own identity


def test_an_engine_named_by_its_old_path_loads() -> None:
    from pagedprefix.conformance.protocol.adapters import radix
    from pagedprefix.conformance.running.suite import load_engine

    sys.modules.pop("pagedprefix.conformance.adapters", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert load_engine("pagedprefix.conformance.adapters:radix", isolate=False) is radix


def test_python_m_of_an_old_path_runs_the_new_module() -> None:
    hello = json.dumps({"id": 1, "method": "hello", "params": {}}) + "\n"
    done = subprocess.run([sys.executable, "-m", "pagedprefix.conformance.jsonl_server", "--engine", "spec"],
                          input=hello, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0]) == {
        "id": 1, "result": {"protocol": "pagedprefix-jsonl", "version": 3}}
    assert "DeprecationWarning: pagedprefix.conformance.jsonl_server moved to " \
           "pagedprefix.conformance.running.jsonl_server" in done.stderr


def test_a_path_that_never_existed_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pagedprefix.conformance.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pagedprefix.conformance.hybrid_judge")  # merged into judging.judge

"""The front doors match the tree: every cross-reference a reader follows resolves.

- every Sphinx role (``:mod:``, ``:func:``, ``:class:``, ``:data:``, ``:attr:``, ``:meth:``,
  ``:exc:``) in the package's source that names a pagedprefix object, absolutely
  (``pagedprefix.conformance.running.suite.run_suite``) or relative to its package (``.protocol``),
  imports and resolves;
- every backquoted ``pagedprefix.`` dotted name in the READMEs and ``docs/`` resolves (the
  CHANGELOG names old paths on purpose, and a few names are formats, not modules).

A module that moves without its references moving with it fails here (the stale list of modules
in ``conformance/__init__.py``'s docstring was one).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from pagedprefix.conformance._moved import MOVED

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "src": "pagedprefix", "spec": "pagedprefix.spec", "impl": "pagedprefix.impl",
    "kernels": "pagedprefix.kernels", "conformance": "pagedprefix.conformance",
    "replay": "pagedprefix.replay", "model": "pagedprefix.model", "cluster": "pagedprefix.cluster",
}
"""The folders and the packages they install as (``pyproject.toml``'s ``package-dir``)."""
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|exc|obj):`~?([A-Za-z_.][A-Za-z0-9_.]*)`")
DOC_NAME = re.compile(r"`(pagedprefix(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
NOT_OBJECTS = {
    "pagedprefix.__main__",  # ``python -m pagedprefix``: importing it runs the command line
    "pagedprefix.replay.repro",  # the name of a JSON format (replay/divergence.py REPRO_FORMAT)
}


def resolves(name: str) -> bool:
    """Whether ``name`` is an importable module, or an attribute path inside one (an old path kept
    for one version, ``conformance/_moved.py``, does not count: the tree must name the new one)."""
    if any(name == old or name.startswith(f"{old}.") for old in MOVED):
        return False
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def absolute(ref: str, path: Path) -> str | None:
    """The absolute name of a role's target in the source file ``path`` (``None``: not ours)."""
    if ref.startswith("pagedprefix."):
        return ref
    if not ref.startswith("."):
        return None
    relative = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[relative.parts[0]], *relative.parts[1:]]
    package = parts[:-1]  # a module's package; for ``__init__`` the package itself
    dots = len(ref) - len(ref.lstrip("."))
    base = ".".join(package).rsplit(".", dots - 1)[0] if dots > 1 else ".".join(package)
    return f"{base}.{ref.lstrip('.')}"


def source_references() -> list[tuple[str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for match in ROLE.finditer(path.read_text(encoding="utf-8")):
                name = absolute(match.group(1), path)
                if name is not None:
                    found.append((str(path.relative_to(ROOT)), name))
    return found


def doc_references() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted(ROOT.glob("*/README.md")), *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for match in DOC_NAME.finditer(page.read_text(encoding="utf-8")):
            if match.group(1) not in NOT_OBJECTS:
                found.append((str(page.relative_to(ROOT)), match.group(1)))
    return found


def test_every_role_in_the_source_resolves() -> None:
    refs = source_references()
    assert len(refs) > 200  # the walk reads the package's source
    assert [r for r in refs if not resolves(r[1])] == []


def test_every_dotted_name_in_the_docs_resolves() -> None:
    refs = doc_references()
    assert len(refs) > 40
    assert [r for r in refs if not resolves(r[1])] == []


@pytest.mark.parametrize(("ref", "where", "name"), [
    (".protocol", "conformance/__init__.py", "pagedprefix.conformance.protocol"),
    (".suite", "conformance/running/stateful.py", "pagedprefix.conformance.running.suite"),
    ("..protocol.watchdog", "conformance/running/suite.py", "pagedprefix.conformance.protocol.watchdog"),
    ("pagedprefix.spec.SpecCache", "spec/cache.py", "pagedprefix.spec.SpecCache"),
    ("SpecCache", "spec/cache.py", None),
])
def test_references_are_read_as_python_reads_imports(ref: str, where: str, name: str | None) -> None:
    assert absolute(ref, ROOT / where) == name


def test_a_stale_reference_is_caught() -> None:
    assert resolves("pagedprefix.conformance.running.suite.run_suite")
    assert not resolves("pagedprefix.conformance.suite")  # the path before the layers
    assert not resolves("pagedprefix.conformance.judging.hybrid_judge")  # merged into judge.py
    assert not resolves("pagedprefix.conformance.judging.properties.Names.held")  # a field, not an attribute

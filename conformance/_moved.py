"""The module paths ``pagedprefix.conformance`` had before its layers, kept working for one version.

Code written against an old path (``pagedprefix.conformance.adapters:radix`` on a command line,
``from pagedprefix.conformance.suite import register_check_group``, ``python -m
pagedprefix.conformance.jsonl_server``) keeps working: importing an old path gives the module at
its new path (the same object, so its names and state are the ones the suite uses) after a
``DeprecationWarning`` that names the new path; ``python -m`` of an old path runs the new one. The
table is conformance/CHANGELOG.md's "Module paths" migration table; the old paths go in a later
version. (``judging.hybrid_judge`` is not here: it was merged into ``judging.judge``, not moved.)

:func:`install` (called by ``pagedprefix.conformance``) adds the finder at the end of
``sys.meta_path``: it answers only for an old path, which no file on disk provides.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

PACKAGE = "pagedprefix.conformance"
_LAYERS = {
    "protocol": ("adapters", "channels", "codec", "watchdog"),
    "judging": ("properties", "event_check", "driver", "judge", "judge_base", "judge_retention", "model"),
    "generation": ("generate", "minimize", "seeding", "vector_format"),
    "running": ("stateful", "suite", "subprocess_adapter", "lifetime", "supervise", "jsonl_server"),
    "reporting": ("matrix", "history", "history_fetch", "history_notes", "outputs"),
}
MOVED: dict[str, str] = {
    f"{PACKAGE}.{name}": f"{PACKAGE}.{layer}.{name}" for layer, names in _LAYERS.items() for name in names
}
"""Old path -> new path."""


def _message(old: str) -> str:
    return (
        f"{old} moved to {MOVED[old]} (conformance/CHANGELOG.md, 'Module paths'); "
        "the old path will be removed in a later version"
    )


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=False)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(_message(spec.name), DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        self._specs[module.__name__] = module.__spec__  # the import system sets the old spec on it
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__name__)  # put the module's own spec back

    def is_package(self, fullname: str) -> bool:
        return False

    def get_source(self, fullname: str) -> str:
        """What ``python -m OLD`` runs: the new module as ``__main__``, after the warning."""
        return (
            "import runpy, warnings\n"
            f"warnings.warn({_message(fullname)!r}, DeprecationWarning, stacklevel=1)\n"
            f"runpy.run_module({MOVED[fullname]!r}, run_name='__main__', alter_sys=True)\n"
        )

    def get_code(self, fullname: str) -> CodeType:
        return compile(self.get_source(fullname), f"<{fullname}: moved to {MOVED[fullname]}>", "exec")


def install() -> None:
    """Add the finder of the old paths to ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())

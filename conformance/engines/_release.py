"""Load one vLLM release's cache modules from its extracted pure-Python tree (``pagedprefix history``).

The 0.33.0 adapter lists its stand-ins module by module (``vllm.STAND_INS``); across 50 releases the
heavy modules around the cache move, so this loader uses one general rule instead, documented here
and nowhere else:

- A module of the release (``vllm.*``) is first executed for real from the release's own file.
- When that raises (it imports CUDA kernels, ``transformers``, Pillow, a server, a compiled
  extension the tree lacks...), the module is replaced by a **lazy partial**: a module that yields
  only the definitions asked for. Each name another module imports from it (``from m import x``) or
  reads from it is executed, with the module's own definitions it uses, from the release's source
  file, exactly as written (``_harness._partial``). A name whose definition cannot be made there
  becomes a **placeholder** (``_harness.placeholder``): a class that raises
  :class:`~pagedprefix.conformance.engines._harness.StandInUsed` when instantiated, a function that
  raises when called. A package keeps its ``__path__``, so its submodules load from the tree.
- Third-party modules are never stood in for: they import for real or raise, and the release
  module importing them is the one stood in for.

So the cache's own modules always run as released, and any use of something stood in for raises:
a verdict can never rest on a stand-in. :func:`load_release` reports every module that was stood in
for and why (``Release.stood_in``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import EngineUnavailable
from ._harness import _error, _partial, placeholder


@dataclass
class Release:
    """What :func:`load_release` loaded: the release's version, its root, the target modules and
    the modules it stood in for (``{module: the exception its real import raised}``)."""

    version: str
    root: Path
    modules: dict[str, types.ModuleType]
    stood_in: dict[str, str] = field(default_factory=dict)


class _LazyPartial(types.ModuleType):
    """A release module that failed to import: each name read from it is made on first use from
    the release's source (module docstring), or is a placeholder."""

    __harness_lazy__ = True

    def __init__(self, name: str, spec: importlib.machinery.ModuleSpec | None, failed: str) -> None:
        super().__init__(name, f"pagedprefix lazy partial ({failed})")
        self.__spec__ = spec
        self.__package__ = (
            name if spec is not None and spec.submodule_search_locations else name.rpartition(".")[0]
        )
        if spec is not None:
            self.__file__ = spec.origin
            if spec.submodule_search_locations is not None:
                self.__path__ = list(spec.submodule_search_locations)
        self.__harness_made__: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "__harness_made__":
            raise AttributeError(name)
        spec = self.__spec__
        value: Any
        imported = self._imported(name)
        if imported is not None:
            source, attr = imported
            try:
                module = importlib.import_module(source)
                value = module if attr is None else getattr(module, attr)
                self.__harness_made__[name] = f"imported from {source}"
            except Exception as exc:
                value = placeholder(self.__name__, name)
                self.__harness_made__[name] = f"placeholder ({_error(exc)[:120]})"
        elif spec is not None and spec.origin and spec.origin.endswith(".py"):
            try:
                made = _partial_from(self.__name__, spec, name)
                value = made.__dict__[name]
                self.__harness_made__[name] = "real definition"
            except Exception as exc:  # not definable here: a placeholder
                value = placeholder(self.__name__, name)
                self.__harness_made__[name] = f"placeholder ({_error(exc)[:120]})"
        else:
            value = placeholder(self.__name__, name)
            self.__harness_made__[name] = "placeholder (no source)"
        setattr(self, name, value)
        return value

    def _imported(self, name: str) -> tuple[str, str | None] | None:
        """Where the module's own top-level import statements bind ``name`` from:
        ``(module, attribute)`` (``attribute`` None for ``import m as name``), or None."""
        spec = self.__spec__
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        table: dict[str, tuple[str, str | None]] | None = self.__dict__.get("__harness_imports__")
        if table is None:
            table = {}
            with open(spec.origin, encoding="utf-8") as f:
                tree = ast.parse(f.read(), spec.origin)
            for node in tree.body:
                if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                    base = node.module or ""
                    if node.level:
                        pkg = self.__package__ or ""
                        parts = pkg.split(".")
                        prefix = ".".join(parts[: len(parts) - node.level + 1])
                        base = f"{prefix}.{base}" if base else prefix
                    for alias in node.names:
                        if alias.name != "*":
                            table[alias.asname or alias.name] = (base, alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            table[alias.asname] = (alias.name, None)
            self.__dict__["__harness_imports__"] = table
        found = table.get(name)
        if found is None:
            return None
        base, attr = found
        if attr is not None and base.startswith("vllm"):
            try:
                submodule = importlib.util.find_spec(f"{base}.{attr}") is not None
            except (ImportError, AttributeError, ValueError):
                submodule = False
            if submodule:
                return (f"{base}.{attr}", None)  # ``from package import submodule``
        return found


def _partial_from(name: str, spec: importlib.machinery.ModuleSpec, wanted: str) -> types.ModuleType:
    """``_harness._partial`` for a module already in ``sys.modules`` as a lazy partial: the real
    definitions run in a fresh namespace; the lazy module is put back afterwards."""
    lazy = sys.modules.get(name)
    try:
        return _partial(name, [wanted])
    finally:
        if lazy is not None:
            sys.modules[name] = lazy


class _PlaceholderModule(types.ModuleType):
    """A third-party module that is not installed: every name is a placeholder."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "pagedprefix placeholder module (not installed)")
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader, finder: _ReleaseFinder) -> None:
        self.real, self.finder = real, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        try:
            self.real.exec_module(module)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not isinstance(exc, SystemExit):
                raise
            lazy = _LazyPartial(name, module.__spec__, _error(exc)[:200])
            self.finder.stood_in[name] = _error(exc)[:300]
            sys.modules[name] = lazy
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, lazy)
            # importlib returns sys.modules[name] after exec_module: the lazy partial.


class _ReleaseFinder(importlib.abc.MetaPathFinder):
    """Finds ``vllm.*`` in the release root only, and stands in for missing third-party modules."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stood_in: dict[str, str] = {}
        self.path = importlib.machinery.PathFinder

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top == "vllm":
            search = [str(self.root)] if fullname == "vllm" else path
            spec = self.path.find_spec(fullname, search)
            if spec is None or spec.loader is None:
                return None  # not in the pure-Python tree (a compiled extension): ModuleNotFoundError
            spec.loader = _Loader(spec.loader, self)
            return spec
        return None  # third-party modules import for real or fail; the failing vllm module is stood in for


class _MissingLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _PlaceholderModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def release_version(root: Path) -> str:
    """The version a release tree declares (``vllm/_version.py``'s ``__version__``/``version``,
    else ``vllm/version.py``), read as text (the file is not run)."""
    import re

    for rel in ("vllm/_version.py", "vllm/version.py"):
        p = root / rel
        if p.is_file():
            m = re.search(r"""\bversion\s*=\s*['"]([0-9][^'"]*)['"]""", p.read_text(encoding="utf-8"))
            if m:
                return m.group(1)
    raise EngineUnavailable(f"{root}: no vllm/_version.py or vllm/version.py with a version")


_ACTIVE: Release | None = None


def load_release(root: Path, targets: Iterable[str]) -> Release:
    """Import ``targets`` from the release tree at ``root`` (its ``vllm/`` folder), once per process.

    Raises :class:`EngineUnavailable` when a vLLM other than this tree is already imported, when
    a target does not import, or when a target module is itself stood in for.
    """
    global _ACTIVE
    root = root.resolve()
    if _ACTIVE is not None:
        if _ACTIVE.root != root:
            raise EngineUnavailable(
                f"this process already loaded vLLM from {_ACTIVE.root}: one release a process"
            )
        for t in targets:
            if t not in _ACTIVE.modules:
                _ACTIVE.modules[t] = importlib.import_module(t)
        return _ACTIVE
    if any(m == "vllm" or m.startswith("vllm.") for m in sys.modules):
        raise EngineUnavailable("another vLLM is already imported in this process: one release a process")
    if not (root / "vllm" / "__init__.py").is_file():
        raise EngineUnavailable(f"{root} has no vllm/__init__.py")
    finder = _ReleaseFinder(root)
    sys.meta_path.insert(0, finder)
    modules: dict[str, types.ModuleType] = {}
    for t in targets:
        try:
            module = importlib.import_module(t)
        except Exception as exc:
            raise EngineUnavailable(f"vllm {root.name}: {t} does not import ({_error(exc)})") from exc
        modules[t] = module
    release = Release(release_version(root), root, modules, finder.stood_in)
    _ACTIVE = release
    return release


def is_stood_in(module: types.ModuleType) -> bool:
    """True for a lazy partial or a placeholder module."""
    return isinstance(module, (_LazyPartial, _PlaceholderModule))

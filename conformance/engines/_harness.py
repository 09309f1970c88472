"""Load an engine's cache modules from its own installed package on a CPU-only machine.

An engine's prefix cache is pure Python, but the modules around it import CUDA kernels, tokenizers,
web servers and metrics. :func:`load` first imports the wanted modules for real; only when that fails
does it go through a list of :class:`StandIn` entries, and for each one it imports the real module
first and installs the stand-in only when that import fails (recording the exception). On a fully
installed engine (an engine team's own environment) the first step succeeds and nothing is replaced.

A stand-in is one of:

- ``package``: the real package directory with its ``__init__`` not run, so that the real submodules
  the cache needs import from the installed files while the package's heavy ``__init__`` stays out;
- ``partial``: the real module's own top-level definitions named in ``names``, executed from the
  installed source file (its header imports that succeed are run too; the ones that fail are left
  out) -- for a module whose cache-relevant definitions are pure Python but whose header imports
  something a CPU install lacks;
- ``placeholder``: inert names -- classes that raise when instantiated and functions that raise when
  called -- for names the cache modules import only for annotations, ``isinstance`` checks or code
  paths the adapter never drives; any use of one raises :class:`StandInUsed`, loudly. ``names``
  ``("*",)`` makes every name such a placeholder (used only for GPU kernel modules);
- ``custom``: a small hand-written object, documented where it is defined (request parameters the
  cache only reads a few attributes of).

No engine source is copied into this repository: ``partial`` reads the engine's installed file.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..protocol import EngineUnavailable

StandInKind = Literal["package", "partial", "placeholder", "custom"]


class StandInUsed(RuntimeError):
    """Driven code reached a placeholder: the harness does not cover this path (a bug to report)."""


@dataclass(frozen=True)
class StandIn:
    """One module the harness may stand in for (see the module docstring for the kinds).

    Attributes:
        module: the dotted module name.
        kind: ``package``, ``partial``, ``placeholder`` or ``custom``.
        why: what the cache needs from it, and why the real module does not import on a CPU machine.
        names: ``partial``: the real definitions to run; ``placeholder`` and ``package``: inert names.
        exports: ``package``: names its real ``__init__`` re-exports from a submodule, as
            ``(name, submodule)`` (``name`` ``"*"``: every other name); resolved on first access
            (the submodule may be a stand-in too).
        build: ``custom``: fills the module with the hand-written objects.
    """

    module: str
    kind: StandInKind
    why: str
    names: tuple[str, ...] = ()
    exports: tuple[tuple[str, str], ...] = ()
    build: Callable[[types.ModuleType], None] | None = None


@dataclass(frozen=True)
class Installed:
    """A stand-in that was installed, with the exception its real module raised."""

    stand_in: StandIn
    real_error: str


@dataclass
class Loaded:
    """What :func:`load` did: ``mode`` is ``"real"`` (nothing replaced) or ``"harness"``."""

    engine: str
    version: str
    mode: Literal["real", "harness"]
    installed: list[Installed] = field(default_factory=list)
    modules: dict[str, types.ModuleType] = field(default_factory=dict)

    def summary(self) -> str:
        """One line per stand-in installed (empty in ``real`` mode)."""
        return "\n".join(f"{i.stand_in.kind:11} {i.stand_in.module}: {i.real_error}" for i in self.installed)


def _placeholder_class(module: str, name: str) -> type:
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise StandInUsed(f"{module}.{name} is a harness placeholder; the driven code used it")

    return type(name, (), {"__init__": refuse, "__module__": module, "__doc__": "harness placeholder"})


def _placeholder_function(module: str, name: str) -> Callable[..., Any]:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise StandInUsed(f"{module}.{name} is a harness placeholder; the driven code called it")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__module__ = module
    return refuse


def placeholder(module: str, name: str) -> Any:
    """An inert name: a class (``CapWords``) that refuses instances, else a function that refuses calls."""
    if name[:1].isupper() and not name.isupper():
        return _placeholder_class(module, name)
    return _placeholder_function(module, name)


def _attach(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def _bare_package(name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise EngineUnavailable(f"harness: {name} is not an installed package")
    module = types.ModuleType(name, "harness: the real package with its __init__ not run")
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__ = spec.origin
    module.__package__ = name
    module.__spec__ = spec
    return module


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _partial(name: str, wanted: Iterable[str]) -> types.ModuleType:
    """The real module's named top-level definitions, executed from its installed source."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise EngineUnavailable(f"harness: {name} has no installed source file")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, spec.origin)
    module = types.ModuleType(name, "harness: some of the real module's definitions")
    module.__file__ = spec.origin
    module.__package__ = name.rpartition(".")[0]
    module.__spec__ = spec
    namespace = module.__dict__
    wanted = set(wanted)
    # Annotations stay unevaluated (PEP 563): they name classes the definitions never need to run.
    flags = __future__.annotations.compiler_flag
    definitions: list[tuple[set[str], ast.stmt]] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                flags |= getattr(__future__, alias.name).compiler_flag
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            node = ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)
        names = _bound_names(node)
        if names:
            definitions.append((names, node))
    # The wanted definitions and, transitively, the module's own definitions they use.
    chosen_ids: set[int] = set()
    need, used = set(wanted), set(wanted)
    while need:
        for names, node in definitions:
            if names & need and id(node) not in chosen_ids:
                chosen_ids.add(id(node))
                found_names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                used |= found_names
        need = {n for names, _ in definitions for n in names if n in used} - {
            n for names, node in definitions if id(node) in chosen_ids for n in names
        }
    chosen = [node for _, node in definitions if id(node) in chosen_ids]

    origin = spec.origin

    def run(node: ast.stmt) -> None:
        tree = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
        exec(compile(tree, origin, "exec", flags=flags, dont_inherit=True), namespace)

    skipped: list[str] = []
    module.__harness_skipped_imports__ = skipped  # type: ignore[attr-defined]
    for node in tree.body:  # the header imports the chosen definitions use, where they import
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ):
            bound = {(a.asname or a.name).partition(".")[0] for a in node.names}
            if bound & used:
                try:
                    run(node)
                except Exception as exc:  # the import a CPU install lacks: left out, name by name
                    if isinstance(node, ast.ImportFrom) and len(node.names) > 1:
                        for alias in node.names:
                            one = ast.copy_location(ast.ImportFrom(node.module, [alias], node.level), node)
                            try:
                                run(one)
                            except Exception as exc_one:
                                skipped.append(f"{node.module}.{alias.name} ({_error(exc_one)})")
                    else:
                        skipped.append(f"{ast.unparse(node)[:80]} ({_error(exc)})")
    found: set[str] = set()
    previous = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        for node in chosen:
            names = _bound_names(node)
            try:
                run(node)
            except Exception as exc:
                if names & wanted:
                    raise
                # A definition only a wanted one refers to, which cannot be made here (a Triton
                # kernel's decorator, say): left out; calling into it raises NameError.
                skipped.append(f"{', '.join(sorted(names))} ({_error(exc)})")
                continue
            found |= names
    except BaseException:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        raise
    missing = wanted - found
    if missing:
        raise EngineUnavailable(f"harness: {name} no longer defines {sorted(missing)} (engine version?)")
    return module


def _build(entry: StandIn) -> types.ModuleType:
    if entry.kind == "package":
        module = _bare_package(entry.module)
    elif entry.kind == "partial":
        module = _partial(entry.module, entry.names)
    else:
        module = types.ModuleType(entry.module, f"harness stand-in: {entry.why}")
        module.__package__ = entry.module.rpartition(".")[0]
    if entry.kind in ("package", "placeholder", "custom"):
        for name in entry.names:
            if name != "*":
                setattr(module, name, placeholder(entry.module, name))
    if entry.kind == "placeholder" and "*" in entry.names:

        def any_name(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            value = placeholder(entry.module, name)
            setattr(module, name, value)
            return value

        module.__getattr__ = any_name  # type: ignore[method-assign]
    if entry.exports:
        exports = dict(entry.exports)

        def __getattr__(name: str) -> Any:
            source = exports.get(name, exports.get("*"))
            if source is None or name.startswith("__"):
                raise AttributeError(f"module {entry.module!r} (harness package) has no attribute {name!r}")
            return getattr(importlib.import_module(source), name)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
    if entry.build is not None:
        entry.build(module)
    return module


def _import_all(names: Iterable[str]) -> dict[str, types.ModuleType]:
    return {name: importlib.import_module(name) for name in names}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def load(
    engine: str,
    distribution: str,
    targets: Iterable[str],
    stand_ins: Iterable[StandIn],
    before: Callable[[], None] | None = None,
) -> Loaded:
    """Import ``targets`` (the engine's cache modules): for real if possible, else with stand-ins.

    ``distribution`` is the installed package's name (for its version); ``before`` runs once before
    the harness step (e.g. to check the Python version). Raises :class:`EngineUnavailable` when the
    engine is not installed or its modules do not import even with the stand-ins.
    """
    import importlib.metadata

    targets = list(targets)
    top = targets[0].partition(".")[0]
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise EngineUnavailable(f"{engine}: the package {distribution!r} is not installed") from None
    if importlib.util.find_spec(top) is None:
        raise EngineUnavailable(f"{engine}: {distribution} {version} is installed, {top!r} is not importable")
    try:
        return Loaded(engine, version, "real", [], _import_all(targets))
    except Exception as exc:
        first_error = exc
    if before is not None:
        before()
    loaded = Loaded(engine, version, "harness")
    for entry in stand_ins:
        if entry.module in sys.modules:
            continue
        parent = entry.module.rpartition(".")[0]
        if parent and parent not in sys.modules:
            try:
                importlib.import_module(parent)
            except Exception as exc:
                raise EngineUnavailable(
                    f"harness: {entry.module}'s package {parent} does not import ({_error(exc)}) "
                    "and is not listed before it"
                ) from exc
        try:
            importlib.import_module(entry.module)
            continue  # the real module imports: keep it
        except Exception as exc:
            real_error = _error(exc)
        _attach(entry.module, _build(entry))
        loaded.installed.append(Installed(entry, real_error))
    try:
        loaded.modules = _import_all(targets)
    except Exception as exc:
        raise EngineUnavailable(
            f"{engine}: its cache modules do not import even with the harness ({_error(exc)}); "
            f"the real import failed first with {_error(first_error)}"
        ) from exc
    return loaded


def unavailable_reason(distribution: str, version: str, imports: Iterable[str]) -> str | None:
    """Why an adapter written against ``distribution==version`` cannot run here (not installed,
    another release, or a module its cache imports missing), without importing it; ``None`` when it
    can. For tests and benchmarks that skip without it."""
    import importlib.metadata

    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return (
            f"{distribution} is not installed (pip install --no-deps {distribution}=={version}; "
            "see conformance/engines/README.md)"
        )
    if installed != version:
        return f"the adapter is written against {distribution} {version}, {installed} is installed"
    missing = [m for m in imports if importlib.util.find_spec(m) is None]
    if missing:
        return f"{distribution} is installed but {', '.join(missing)} is not (conformance/engines/README.md)"
    return None


def describe(stand_ins: Iterable[StandIn]) -> str:
    """A Markdown table of stand-ins (for the README and ``--help`` texts)."""
    rows = ["| module | kind | names | why |", "|---|---|---|---|"]
    for s in stand_ins:
        names = ", ".join(f"`{n}`" for n in s.names) or "—"
        rows.append(f"| `{s.module}` | {s.kind} | {names} | {s.why} |")
    return "\n".join(rows)


def set_attrs(attrs: Mapping[str, object]) -> Callable[[types.ModuleType], None]:
    """A ``build`` that sets the given attributes."""

    def build(module: types.ModuleType) -> None:
        for key, value in attrs.items():
            setattr(module, key, value)

    return build

"""pytest plugin: the conformance suite as pytest tests.

Registered as the ``pytest11`` entry point ``pagedprefix`` (or load it with
``-p pagedprefix.conformance.pytest_plugin``). It does nothing unless ``--pagedprefix-engine`` is
given; then it adds one test per vector case (``vector[<case id>]``) and one per property of the
stateful runner (``stateful[<property>]``; the runner itself runs once, on the first of them)::

    pytest --pagedprefix-engine mypkg.adapter:factory --pagedprefix-profile lru \\
           --pagedprefix-xfail known-failures.txt

The xfail file lists test ids (``vector[cow/fork-of-fork/dup/b2]``, ``stateful[policy-hits]``;
the bare case id or property name works too), one per line, ``#`` starts a comment. Ids that
match no test give a warning, so the file cannot silently go stale. Skipped-by-capability cases
are reported as pytest skips with the reason.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import pytest

from .judging.properties import PROFILES, PROPERTIES
from .protocol import AdapterFactory, Capabilities
from .protocol.watchdog import DEFAULT_CALL_TIMEOUT, limit_in_process_calls
from .running.stateful import StatefulReport, run_conformance
from .running.suite import DEFAULT_EXAMPLES, load_engine, probe_capabilities
from .running.vectors import VECTOR_DIR, VectorFormatError, load_dir, run_case


class PagedprefixConformanceWarning(pytest.PytestWarning):
    """An xfail id that matches no conformance test."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedprefix", "pagedprefix conformance suite")
    group.addoption(
        "--pagedprefix-engine",
        default=None,
        metavar="MODULE:FACTORY",
        help="run the conformance suite against this engine (impl, spec, module:factory, jsonl:CMD)",
    )
    group.addoption(
        "--pagedprefix-profile",
        default="exact",
        choices=PROFILES,
        help="conformance profile (default: exact)",
    )
    group.addoption(
        "--pagedprefix-xfail",
        default=None,
        metavar="FILE",
        help="file of conformance test ids expected to fail",
    )
    group.addoption(
        "--pagedprefix-vectors",
        action="append",
        default=[],
        metavar="DIR",
        help="also run the vector files under DIR (repeatable)",
    )
    group.addoption(
        "--pagedprefix-max-examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        help=f"stateful examples (default: {DEFAULT_EXAMPLES})",
    )
    group.addoption("--pagedprefix-seed", type=int, default=0, help="the run's seed (default: 0)")
    group.addoption(
        "--pagedprefix-call-timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        help=f"seconds one engine call may take (default: {DEFAULT_CALL_TIMEOUT:g})",
    )
    group.addoption(
        "--pagedprefix-in-process",
        action="store_true",
        help="run a module:factory engine in this process (default: in a worker process)",
    )


class _Session:
    """Per-pytest-run state: the engine and the stateful report (computed once)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.engine: str = config.getoption("--pagedprefix-engine")
        self.profile: str = config.getoption("--pagedprefix-profile")
        self._factory: AdapterFactory | None = None
        self._caps: Capabilities | None = None
        self._stateful: StatefulReport | None = None

    @property
    def factory(self) -> AdapterFactory:
        if self._factory is None:
            in_process = self.config.getoption("--pagedprefix-in-process")
            self._factory = load_engine(
                self.engine, isolate=False if in_process else None, call_timeout=self.call_timeout
            )
        return self._factory

    @property
    def call_timeout(self) -> float:
        value: float = self.config.getoption("--pagedprefix-call-timeout")
        return value

    def limits(self) -> contextlib.AbstractContextManager[None]:
        """The per-call limit for an engine in this process (a worker enforces its own)."""
        isolated = getattr(self.factory, "isolated", False)
        return limit_in_process_calls(None if isolated else self.call_timeout)

    @property
    def caps(self) -> Capabilities:
        if self._caps is None:
            with self.limits():
                self._caps = probe_capabilities(self.factory)
        return self._caps

    def stateful(self) -> StatefulReport:
        if self._stateful is None:
            with self.limits():
                self._stateful = run_conformance(
                    self.factory,
                    profile=self.profile,
                    max_examples=self.config.getoption("--pagedprefix-max-examples"),
                    seed_value=self.config.getoption("--pagedprefix-seed"),
                    echo=None,
                )
        return self._stateful


class ConformanceFailure(Exception):
    """A conformance check failed (the message carries the counterexample)."""


class _ConformanceItem(pytest.Item):
    """An item whose conformance failure reads ``<failure_label>: <message>``."""

    def failure_label(self) -> str:
        raise NotImplementedError

    def report_name(self) -> str:
        raise NotImplementedError

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.failure_label()}: {excinfo.value}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return Path(str(self.path)), None, self.report_name()


class VectorItem(_ConformanceItem):
    """One vector case."""

    def __init__(self, *, case: dict[str, Any], group: str, state: _Session, **kw: Any) -> None:
        super().__init__(**kw)
        self.case = case
        self.group = group
        self.state = state

    def runtest(self) -> None:
        state = self.state
        with state.limits():
            result = run_case(state.factory, self.case, state.profile, self.group, state.caps)
        if result.status == "skip":
            pytest.skip(f"skipped by capability: {result.message}")
        if result.status == "fail":
            detail = f"\n\n{result.detail}" if result.detail else ""
            raise ConformanceFailure(f"[{result.prop}] {result.message}{detail}")

    def failure_label(self) -> str:
        return f"vector {self.case['id']} ({self.case.get('section', '')})"

    def report_name(self) -> str:
        return f"vector {self.case['id']}"


class PropertyItem(_ConformanceItem):
    """One property of the stateful runner."""

    def __init__(self, *, prop: str, state: _Session, **kw: Any) -> None:
        super().__init__(**kw)
        self.prop = prop
        self.state = state

    def runtest(self) -> None:
        report = self.state.stateful()
        if report.errors:
            raise ConformanceFailure("; ".join(report.errors))
        result = next((p for p in report.properties if p.name == self.prop), None)
        if result is None:
            pytest.skip(f"not part of profile {self.state.profile}")
        if result.status == "skip":
            pytest.skip(result.detail)
        if result.status == "fail":
            assert result.failure is not None
            raise ConformanceFailure(result.failure.render())

    def failure_label(self) -> str:
        return f"property {self.prop}"

    def report_name(self) -> str:
        return f"stateful property {self.prop}"


def read_xfail_ids(path: Path) -> list[str]:
    """Ids from an xfail file (blank lines and ``#`` comments ignored)."""
    ids: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            ids.append(text)
    return ids


def _items(session: pytest.Session, state: _Session) -> list[pytest.Item]:
    items: list[pytest.Item] = []
    dirs = [VECTOR_DIR] + [Path(d) for d in session.config.getoption("--pagedprefix-vectors")]
    for d in dirs:
        try:
            files = load_dir(d)
        except VectorFormatError as exc:
            raise pytest.UsageError(str(exc)) from exc
        for vf in files:
            for case in vf.cases:
                items.append(
                    VectorItem.from_parent(
                        session, name=f"vector[{case['id']}]", case=case, group=vf.group, state=state
                    )
                )
    for prop in PROPERTIES:
        items.append(
            PropertyItem.from_parent(session, name=f"stateful[{prop.name}]", prop=prop.name, state=state)
        )
    return items


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not config.getoption("--pagedprefix-engine"):
        return
    new = _items(session, _Session(config))
    xfail_path = config.getoption("--pagedprefix-xfail")
    if xfail_path:
        wanted = read_xfail_ids(Path(xfail_path))
        by_id: dict[str, pytest.Item] = {}
        for item in new:
            by_id[item.name] = item
            inner = item.name[item.name.index("[") + 1 : -1]
            by_id.setdefault(inner, item)
        for xid in wanted:
            match = by_id.get(xid)
            if match is None:
                warnings.warn(
                    PagedprefixConformanceWarning(
                        f"--pagedprefix-xfail: {xid!r} matches no conformance test"
                    ),
                    stacklevel=1,
                )
                continue
            match.add_marker(pytest.mark.xfail(reason=f"listed in {xfail_path}", raises=ConformanceFailure))
    items.extend(new)

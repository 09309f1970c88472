"""Fetch vLLM releases for ``pagedprefix history``: one wheel per release from PyPI, only its
pure-Python ``vllm/`` files kept in a cache directory, the wheel's sha256 recorded.

Layout: ``<cache>/<version>/vllm/...`` (the ``.py`` files of the wheel's ``vllm`` package, no
compiled extensions) and ``<cache>/<version>/wheel.json`` (``{"file", "sha256", "bytes"}``). A
release whose ``wheel.json`` exists is read from the cache without the network. The wheel itself
is deleted after extraction (a release's tree is a few MB; its wheel a few hundred).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PIP_TIMEOUT_S = 900
"""Longest a ``pip download`` or ``pip index`` may take (a wheel is up to ~450 MB)."""


class FetchError(RuntimeError):
    """A release could not be downloaded or extracted (no wheel on PyPI, network, timeout)."""


@dataclass(frozen=True)
class Fetched:
    """A release in the cache: its extracted tree (put ``root`` on ``sys.path``) and its wheel."""

    version: str
    root: Path
    wheel: str
    sha256: str
    bytes: int


def default_cache_dir() -> Path:
    """``$PAGEDPREFIX_CACHE/vllm`` or ``~/.cache/pagedprefix/vllm``."""
    base = os.environ.get("PAGEDPREFIX_CACHE")
    return Path(base) / "vllm" if base else Path.home() / ".cache" / "pagedprefix" / "vllm"


def version_key(version: str) -> tuple[tuple[int, str], ...]:
    """A sort key for vLLM's release numbers (``0.6.6.post1`` after ``0.6.6``, ``0.10.1.1`` after
    ``0.10.1``); only final releases and ``.postN`` are listed by :func:`released_versions`."""
    parts: list[tuple[int, str]] = []
    for piece in re.split(r"[.]", version):
        m = re.fullmatch(r"(\d+)|post(\d+)", piece)
        if m is None:
            raise ValueError(f"not a final vLLM release number: {version!r}")
        parts.append((int(m.group(1)), "") if m.group(1) is not None else (-1, f"post{int(m.group(2)):04d}"))
    return tuple(parts)


FINAL = re.compile(r"\d+(\.\d+)+(\.post\d+)?")


def released_versions(first: str = "0.6.5", *, timeout_s: float = 120) -> list[str]:
    """Every final vLLM release on the package index from ``first`` on, oldest first
    (``pip index versions vllm``). Raises :class:`FetchError` when the index cannot be read."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip index versions vllm took over {timeout_s:.0f} s") from None
    line = next((x for x in out.stdout.splitlines() if x.startswith("Available versions:")), None)
    if line is None:
        raise FetchError(f"pip index versions vllm listed nothing: {out.stderr.strip()[-300:]}")
    found = [v.strip() for v in line.partition(":")[2].split(",")]
    low = version_key(first)
    return sorted((v for v in found if FINAL.fullmatch(v) and version_key(v) >= low), key=version_key)


def cached(cache_dir: Path, version: str) -> Fetched | None:
    """The release from the cache, or ``None`` when it is not there (or incomplete)."""
    meta = cache_dir / version / "wheel.json"
    if not meta.is_file() or not (cache_dir / version / "vllm" / "__init__.py").is_file():
        return None
    info = json.loads(meta.read_text(encoding="utf-8"))
    return Fetched(version, cache_dir / version, info["file"], info["sha256"], int(info["bytes"]))


def fetch(cache_dir: Path, version: str, *, timeout_s: float = PIP_TIMEOUT_S) -> Fetched:
    """The release from the cache, downloading it first when missing (``pip download --no-deps
    --only-binary=:all: vllm==<version>``). Raises :class:`FetchError`; leaves no partial tree."""
    hit = cached(cache_dir, version)
    if hit is not None:
        return hit
    if not FINAL.fullmatch(version):
        raise FetchError(f"not a final vLLM release number: {version!r}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".dl-{version}-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"vllm=={version}",
        ]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise FetchError(f"pip download vllm=={version} took over {timeout_s:.0f} s") from None
        wheels = sorted(Path(tmp).glob("vllm-*.whl"))
        if out.returncode != 0 or not wheels:
            tail = " ".join(out.stderr.strip().splitlines()[-2:])[-300:]
            raise FetchError(f"pip download vllm=={version} found no wheel: {tail}")
        wheel = wheels[0]
        digest = hashlib.sha256()
        with open(wheel, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        size = wheel.stat().st_size
        tree = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("vllm/") and name.endswith(".py") and ".." not in name:
                    z.extract(name, tree)
        wheel.unlink()
        meta = {"file": wheel.name, "sha256": digest.hexdigest(), "bytes": size}
        (tree / "wheel.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        target = cache_dir / version
        if target.exists():
            shutil.rmtree(target)
        tree.rename(target)
    hit = cached(cache_dir, version)
    if hit is None:
        raise FetchError(f"vllm=={version}: the wheel has no vllm/__init__.py")
    return hit


if __name__ == "__main__":  # python -m pagedprefix.conformance.reporting.history_fetch [VERSION ...]
    cache = default_cache_dir()
    for v in sys.argv[1:] or released_versions():
        try:
            f = fetch(cache, v)
            print(v, f.sha256, f.bytes, flush=True)
        except FetchError as exc:
            print(v, "ERROR", exc, flush=True)

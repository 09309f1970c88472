"""Documented limits of a cache configuration, and the memory check made before a pool is built
(SEMANTICS.md section 4: ``InvalidConfig`` for sizes above the documented limits; no ``MemoryError``,
``OverflowError`` or ``AssertionError`` ever escapes).

- ``block_size`` in ``[1, MAX_BLOCK_SIZE]`` (2**20 tokens). vLLM's largest (unified hybrid page
  sizes) is 8,320; the key encoding itself would allow ``2**32 - 1`` (every length is a ``u32``),
  but one block's preimage is then 16 GiB, so the limit keeps it at 4 MiB.
- ``num_blocks`` in ``[1, MAX_NUM_BLOCKS]`` (``2**31 - 2``): physical block ids fit the ``int32``
  block tables and kernels use. Below that, a pool must also fit in memory: each engine estimates
  the bytes its empty pool takes (``bytes per block × num_blocks``, measured for that engine and
  exposed beside it, e.g. ``pagedprefix.spec.cache.SPEC_BYTES_PER_BLOCK``) and refuses with
  :class:`InvalidConfig`, naming both numbers, what exceeds the memory available now. Cached keys
  and request state grow later with use and are not part of the estimate.

Available memory (:func:`available_memory`) is the smallest of ``MemAvailable`` in
``/proc/meminfo``, the room left under a cgroup (v2 ``memory.max - memory.current``, v1
``memory.limit_in_bytes - memory.usage_in_bytes``), the room left under the process's address-space
limit (``RLIMIT_AS`` soft limit minus ``VmSize`` of ``/proc/self/status``: ``ulimit -v``, which
``MemAvailable`` knows nothing of) and ``os.sysconf`` available physical pages; sources that do not
exist are skipped, and when none exists nothing is refused.

The estimate can still be beaten (another thread allocating, fragmentation, overcommit): the engines
build their pools inside :func:`allocating`, which turns a ``MemoryError`` raised by the allocation
itself into :class:`InvalidConfig` too, so no ``MemoryError`` escapes a ``create``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

from .errors import InvalidConfig

MAX_BLOCK_SIZE = 2**20
MAX_NUM_BLOCKS = 2**31 - 2

_CGROUP_FILES: tuple[tuple[str, str], ...] = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) reads as None


def _proc_kib_field(path: str, field: str) -> int | None:
    """Bytes of the ``field: N kB`` line of a ``/proc`` file (the file says kB, meaning KiB);
    ``None`` when the file or the field cannot be read."""
    try:
        lines = Path(path).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name == field and parts and parts[0].isdigit():
            return int(parts[0]) * 1024
    return None


def _meminfo_available() -> int | None:
    return _proc_kib_field("/proc/meminfo", "MemAvailable")


def _sysconf_available() -> int | None:
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _address_space_used() -> int | None:
    """Bytes of address space this process maps now (``VmSize``), ``None`` when unknown."""
    return _proc_kib_field("/proc/self/status", "VmSize")


def _rlimit_available() -> int | None:
    """Room left under the soft ``RLIMIT_AS`` (the whole limit when the usage is unknown)."""
    if resource is None:
        return None
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _address_space_used()
    return max(soft - used, 0) if used is not None else soft


def available_memory() -> int | None:
    """Bytes this process can still allocate, as far as the system says; ``None`` when unknown."""
    found = [_meminfo_available(), _sysconf_available(), _rlimit_available()]
    for limit_path, usage_path in _CGROUP_FILES:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2**62:  # v1 says "no limit" as ~2**63
            found.append(max(limit - usage, 0))
    known = [x for x in found if x is not None]
    return min(known) if known else None


def check_memory(num_blocks: int, bytes_per_block: int, what: str) -> None:
    """Raise :class:`InvalidConfig` when ``num_blocks * bytes_per_block`` exceeds
    :func:`available_memory` (never when that is unknown). ``what`` names the engine."""
    needed = num_blocks * bytes_per_block
    available = available_memory()
    if available is not None and needed > available:
        raise InvalidConfig(
            f"{what} with num_blocks={num_blocks} needs about {needed:,} bytes "
            f"({bytes_per_block} per block) but only {available:,} bytes of memory are available"
        )


@contextmanager
def allocating(what: str, nbytes: int | None = None) -> Iterator[None]:
    """Run the allocation of ``what`` (about ``nbytes`` bytes when known); a ``MemoryError`` it
    raises becomes :class:`InvalidConfig` naming ``what``. Nothing else is caught."""
    try:
        yield
    except MemoryError:
        size = "" if nbytes is None else f" ({nbytes:,} bytes)"
        raise InvalidConfig(f"could not allocate {what}{size}: out of memory") from None

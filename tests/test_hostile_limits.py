"""Input size and memory limits are part of validation (docs/SECURITY.md "Limits").

- trace files: a line longer than ``MAX_LINE_BYTES`` and a file that decompresses past
  ``MAX_TRACE_BYTES`` are a :class:`TraceLimitError` naming the file and line, in strict and lenient
  mode, without holding the whole line or the whole expansion in memory;
- available memory honours ``RLIMIT_AS`` beside ``MemAvailable`` and cgroups: a pool or KV cache
  that does not fit under a lowered address-space limit is ``InvalidConfig`` (one line, exit 2 on the
  CLI), never a ``MemoryError``;
- every numeric option of every command answers an absurd digit count with the one-line error
  (tests/test_hostile_options.py walks them all, with every other option).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from pagedprefix.replay import trace as trace_module
from pagedprefix.replay.trace import MAX_LINE_BYTES, TraceError, TraceLimitError, load_trace
from pagedprefix.spec import limits

needs_proc = pytest.mark.skipif(not Path("/proc/self/status").is_file(),
                                reason="reads the address space in use from /proc/self/status (Linux)")

GOOD = json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [7]})


# -- trace lines ------------------------------------------------------------------------------------


def test_documented_limits() -> None:
    assert trace_module.MAX_LINE_BYTES == 2**20
    assert trace_module.MAX_TRACE_BYTES == 2**30
    assert "1 MiB" in (trace_module.__doc__ or "") and "1 GiB" in (trace_module.__doc__ or "")


@pytest.mark.parametrize("strict", [False, True])
def test_a_huge_line_is_refused_with_its_number_and_bounded_memory(tmp_path: Path, strict: bool) -> None:
    path = tmp_path / "huge.jsonl"
    huge = 24 * MAX_LINE_BYTES  # 24 MiB on one line (the report's 300 MB line took ~3x its size)
    with open(path, "wb") as out:
        out.write(GOOD.encode() + b"\n")
        out.write(b'{"timestamp": 0, "pad": "' + b"x" * huge + b'"}\n')
        out.write(GOOD.encode() + b"\n")
    tracemalloc.start()
    try:
        with pytest.raises(TraceLimitError) as info:
            load_trace(path, strict=strict)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert str(path) in message and "line 2 " in message and f"{MAX_LINE_BYTES:,} bytes" in message
    assert info.value.bad is not None and info.value.bad.line == 2
    assert peak < 4 * MAX_LINE_BYTES, peak  # about one line's worth, not the 24 MiB line
    assert isinstance(info.value, TraceError)  # callers that catch TraceError keep working


def test_the_line_limit_is_exact(tmp_path: Path) -> None:
    limit = len(GOOD) + 8
    for length, refused in [(limit, False), (limit + 1, True)]:
        for ending in (b"\n", b"\r\n", b""):
            path = tmp_path / f"line{length}.jsonl"
            path.write_bytes(b" " * (length - len(GOOD)) + GOOD.encode() + ending)
            if refused:
                with pytest.raises(TraceLimitError, match=f"line 1 is longer than {limit} bytes"):
                    load_trace(path, max_line_bytes=limit)
            else:
                assert len(load_trace(path, max_line_bytes=limit)) == 1


def test_a_long_line_split_by_carriage_returns_is_still_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b"x" * 64 + b"\r\r" + b"y" * 64 + b"\n")
    with pytest.raises(TraceLimitError, match="line 1 "):
        load_trace(path, max_line_bytes=64)


def test_the_limits_must_be_positive_ints(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(GOOD + "\n")
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(TraceError, match="must be an int >= 1"):
            load_trace(path, max_line_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(TraceError, match="must be an int >= 1"):
            load_trace(path, max_bytes=bad)  # type: ignore[arg-type]


# -- decompressed size ------------------------------------------------------------------------------


def _bomb(path: Path, mib: int) -> int:
    """A gzip file of ``mib`` MiB of blank lines (ignored, so only the size limit stops them)."""
    line = b" " * 1023 + b"\n"
    with gzip.open(path, "wb", compresslevel=9) as out:
        for _ in range(mib * 1024):
            out.write(line)
    return mib * 1024


@pytest.mark.parametrize("strict", [False, True])
def test_a_gzip_bomb_stops_at_the_decompressed_limit(tmp_path: Path, strict: bool) -> None:
    path = tmp_path / "bomb.jsonl.gz"
    lines = _bomb(path, 16)
    assert path.stat().st_size < 64 * 1024  # small on disk, 16 MiB when expanded
    with pytest.raises(TraceLimitError) as info:
        load_trace(path, strict=strict, max_bytes=2**20)
    message = str(info.value)
    assert "more than 1,048,576 bytes (after decompression) by line 1025" in message, message
    assert lines > 1025  # it stopped long before the end


def test_the_default_decompressed_limit_is_the_module_constant(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.jsonl.gz"
    _bomb(path, 2)
    assert len(load_trace(path)) == 0  # 2 MiB of blank lines is within 1 GiB
    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 2**20)
    with pytest.raises(TraceLimitError, match="MAX_TRACE_BYTES"):
        load_trace(path)


def test_a_file_of_exactly_the_limit_loads(tmp_path: Path) -> None:
    path = tmp_path / "exact.jsonl"
    data = (GOOD + "\n").encode()
    path.write_bytes(data)
    assert len(load_trace(path, max_bytes=len(data))) == 1
    with pytest.raises(TraceLimitError):
        load_trace(path, max_bytes=len(data) - 1)


def test_the_replay_cli_reports_a_huge_line_in_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from pagedprefix.cli import main

    path = tmp_path / "huge.jsonl"
    path.write_bytes(b"[" + b"1," * MAX_LINE_BYTES + b"1]\n")
    with pytest.raises(SystemExit) as info:
        main(["replay", "--trace", str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and "line 1 is longer than 1,048,576 bytes" in err, err


# -- memory: RLIMIT_AS --------------------------------------------------------------------------------


def test_available_memory_honours_rlimit_as(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "_meminfo_available", lambda: 64 * 2**30)
    monkeypatch.setattr(limits, "_sysconf_available", lambda: None)
    monkeypatch.setattr(limits, "_CGROUP_FILES", ())
    monkeypatch.setattr(limits, "_address_space_used", lambda: 3 * 2**30)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (4 * 2**30, resource.RLIM_INFINITY))
    assert limits.available_memory() == 2**30  # the address-space room, not MemAvailable
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert limits.available_memory() == 64 * 2**30  # no limit: MemAvailable decides
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2**30, resource.RLIM_INFINITY))
    assert limits.available_memory() == 0  # already over the limit: nothing fits


@needs_proc
def test_address_space_used_reads_this_process() -> None:
    used = limits._address_space_used()
    assert used is not None and used > 10 * 2**20  # an interpreter with torch maps far more than 10 MiB


_UNDER_RLIMIT = textwrap.dedent(
    """
    import resource, sys
    room = int(sys.argv[1])
    import pagedprefix.spec, pagedprefix.spec.limits as limits
    {imports}
    used = limits._address_space_used()
    resource.setrlimit(resource.RLIMIT_AS, (used + room, resource.RLIM_INFINITY))
    {body}
    """
)


def _available_in(message: str) -> int:
    """The "N bytes ... available" number of an InvalidConfig message."""
    match = re.search(r"only ([0-9,]+) bytes", message)
    assert match is not None, message
    return int(match.group(1).replace(",", ""))


def _run_limited(body: str, imports: str = "", room: int = 256 * 2**20) -> subprocess.CompletedProcess[str]:
    """``body`` in a fresh interpreter whose address space may grow by only ``room`` bytes more."""
    script = _UNDER_RLIMIT.format(imports=imports, body=body)
    return subprocess.run([sys.executable, "-c", script, str(room)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@needs_proc
@pytest.mark.parametrize("engine", ["spec", "impl"])
def test_a_pool_beyond_rlimit_as_is_invalid_config(engine: str) -> None:
    # about 1 GiB of pool (MemAvailable of any CI machine allows it), 256 MiB of address space left
    create, num_blocks = {
        "spec": ("from pagedprefix.spec import SpecCache as E", 2**23),
        "impl": ("from pagedprefix.impl import BlockManager as E", 2**25),
    }[engine]
    body = textwrap.dedent(
        """
        from pagedprefix.spec import CacheConfig, InvalidConfig
        try:
            E.create(CacheConfig(block_size=16, num_blocks=NUM_BLOCKS))
        except InvalidConfig as exc:
            print("InvalidConfig:", exc)
        else:
            print("built")
        """
    )
    done = _run_limited(body.replace("NUM_BLOCKS", str(num_blocks)), imports=create)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("InvalidConfig:") and "bytes of memory are available" in done.stdout
    assert _available_in(done.stdout) <= 256 * 2**20  # the address-space room decided, not MemAvailable
    assert "MemoryError" not in done.stdout + done.stderr


@needs_proc
def test_a_kv_cache_beyond_rlimit_as_is_invalid_config() -> None:
    body = textwrap.dedent(
        """
        from pagedprefix.spec import InvalidConfig
        try:
            KVCache(2, 4096, 16, 4, 64)  # 128 MiB of float32, more than the 64 MiB left
        except InvalidConfig as exc:
            print("InvalidConfig:", exc)
        else:
            print("built")
        """
    )
    done = _run_limited(body, imports="import torch\nfrom pagedprefix.impl import KVCache", room=64 * 2**20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("InvalidConfig:") and "bytes are available" in done.stdout, done.stdout
    assert _available_in(done.stdout) <= 64 * 2**20


def test_an_allocation_that_still_fails_is_invalid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate can be wrong (other threads, fragmentation): a MemoryError from the allocation
    itself is turned into InvalidConfig at the API boundary too."""
    import torch
    from pagedprefix.impl import KVCache
    from pagedprefix.spec import InvalidConfig

    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(torch, "zeros", refuse)
    with pytest.raises(InvalidConfig, match="could not allocate"):
        KVCache(1, 4, 2, 1, 4)

    def no_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise MemoryError

    monkeypatch.setattr(torch, "zeros", no_memory)
    with pytest.raises(InvalidConfig, match="could not allocate"):
        KVCache(1, 4, 2, 1, 4)

    from pagedprefix.impl import BlockTables

    monkeypatch.setattr(torch, "full", refuse)
    with pytest.raises(InvalidConfig, match=r"could not allocate a block table of 2 x 3 int32 \(24 bytes\)"):
        BlockTables(2, 3, 16)

    def other(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("some other failure")

    monkeypatch.setattr(torch, "full", other)
    with pytest.raises(RuntimeError, match="some other failure"):  # only allocation failures are mapped
        BlockTables(2, 3, 16)


@needs_proc
def test_the_replay_cli_under_rlimit_as_is_one_line_exit_2() -> None:
    body = textwrap.dedent(
        """
        from pagedprefix.cli import main
        main(["replay", "--trace", "synthetic", "--limit", "5", "--engine", "spec",
              "--num-blocks", str(2**23)])
        """
    )
    done = _run_limited(body, imports="import pagedprefix.cli, pagedprefix.replay.cli")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("pagedprefix replay: error:"), done.stderr
    assert "memory" in lines[0] and "Traceback" not in done.stderr
    assert _available_in(lines[0]) <= 256 * 2**20


# -- numeric options with absurd digit counts: tests/test_hostile_options.py walks every option of
# every command (found by introspection, so a new option is walked without being listed here).


@pytest.mark.parametrize("engine", ["spec", "impl", "radix"])
def test_a_memory_error_while_building_a_pool_is_invalid_config(engine: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedprefix.impl.block_manager as block_manager
    import pagedprefix.impl.radix as radix
    import pagedprefix.spec.cache as spec_cache
    from pagedprefix.impl import BlockManager
    from pagedprefix.impl.radix import RadixCache
    from pagedprefix.spec import CacheConfig, InvalidConfig, SpecCache

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    target, create = {
        "spec": ((spec_cache, "Block"), SpecCache.create),
        "impl": ((block_manager.BlockManager, "__init__"), BlockManager.create),
        "radix": ((radix.RadixCache, "__init__"), RadixCache.create),
    }[engine]
    monkeypatch.setattr(*target, no_memory)
    with pytest.raises(InvalidConfig, match=r"could not allocate .*pool \(\d[\d,]* bytes\): out of memory"):
        create(CacheConfig(block_size=16, num_blocks=64))


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes((GOOD + "\n").encode() + b'{"x": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=r"cannot read trace: line 2 is not UTF-8 \(invalid continuation "
                       r"byte at byte 11 of the line\)"):
        load_trace(path)

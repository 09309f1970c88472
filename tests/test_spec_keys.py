"""Key vectors: the shipped JSON matches an independent encoder written from the documented format."""

from __future__ import annotations

import hashlib
import json
import struct
from importlib import resources
from typing import Any

import xxhash
from pagedprefix.spec import CacheConfig, SpecCache
from pagedprefix.spec.key_vectors import CASES, case_from_json, render


def load() -> dict[str, Any]:
    text = resources.files("pagedprefix.spec").joinpath("key_vectors.json").read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


def H(algo: str, data: bytes, seed: int | None) -> bytes:
    """The documented ``H_seed``: XXH3 takes the cache's seed as its own seed (0 without one);
    sha256 and weak8 have the seed only in the root preimage."""
    if algo == "sha256":
        return hashlib.sha256(data).digest()
    if algo == "xxh3_128":
        return xxhash.xxh3_128(data, seed=seed or 0).digest()
    assert algo == "weak8"
    return hashlib.sha256(data).digest()[:1]


def lp(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def fields_of(case: dict[str, Any], i: int) -> list[tuple[int, bytes]]:
    """Extra fields of block i, straight from the written rules in SEMANTICS.md section 2."""
    size = case["block_size"]
    start, end = i * size, (i + 1) * size
    extras = case["extras"]
    out: list[tuple[int, bytes]] = []
    if extras["lora"]:
        out.append((1, struct.pack("<Q", extras["lora"]["id"]) + extras["lora"]["name"].encode()))
    for m in sorted(extras["mm_items"], key=lambda m: m["start"]):
        if m["start"] < end and start < m["start"] + m["length"]:
            out.append((2, struct.pack("<qI", m["start"] - start, m["length"]) + m["identifier"].encode()))
    if i == 0 and extras["cache_salt"]:
        out.append((3, extras["cache_salt"].encode()))
    if extras["prompt_embeds"]:
        pe = extras["prompt_embeds"]
        parts = [struct.pack("<II", p - start, len(bytes.fromhex(d))) + bytes.fromhex(d)
                 for p, d in zip(pe["positions"], pe["data"]) if start <= p < end]
        if parts:
            out.append((4, hashlib.sha256(b"".join(parts)).digest()))
    return out


def independent_keys(case: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    algo, size = case["hash_algo"], case["block_size"]
    seed = b"\x00" if case["seed"] is None else b"\x01" + struct.pack("<Q", case["seed"])
    namespace = lp(case["namespace"].encode())
    root = H(algo, b"PPRT" + lp(algo.encode()) + struct.pack("<I", size) + namespace + seed, case["seed"])
    parent, keys = root, []
    tokens = case["tokens"]
    for i in range(len(tokens) // size):
        block = tokens[i * size : (i + 1) * size]
        fields = fields_of(case, i)
        data = b"PPBK" + lp(parent) + struct.pack(f"<I{len(block)}I", len(block), *block)
        data += struct.pack("<I", len(fields)) + b"".join(bytes([t]) + lp(p) for t, p in fields)
        parent = H(algo, data, case["seed"])
        keys.append(parent)
    return root, keys


def test_vectors_match_independent_encoder() -> None:
    doc = load()
    assert doc["schema_version"] == 1
    for case in doc["cases"]:
        root, keys = independent_keys(case)
        assert case["root"] == root.hex(), case["name"]
        assert case["keys"] == [k.hex() for k in keys], case["name"]


def test_vectors_match_spec_cache() -> None:
    """A SpecCache configured like each case derives the same keys."""
    for case in load()["cases"]:
        inputs = case_from_json(case)
        cache = SpecCache.create(CacheConfig(
            block_size=inputs.block_size, num_blocks=4, hash_algo=inputs.hash_algo,
            hash_seed=inputs.seed, namespace=inputs.namespace))
        assert cache.root.hex() == case["root"]
        assert [k.hex() for k in cache.block_keys(inputs.tokens, inputs.extras)] == case["keys"]


def test_vectors_cover_every_kind() -> None:
    cases = load()["cases"]
    assert len(cases) >= 20
    assert {c["hash_algo"] for c in cases} == {"sha256", "xxh3_128", "weak8"}
    assert any(c["extras"]["lora"] for c in cases)
    assert any(c["extras"]["cache_salt"] for c in cases)
    assert any(c["extras"]["mm_items"] for c in cases)
    assert any(c["extras"]["prompt_embeds"] for c in cases)
    assert all(c["seed"] is not None for c in cases if c["hash_algo"] == "xxh3_128")
    assert any(c["keys"] == [] for c in cases)


def test_shipped_file_is_current() -> None:
    text = resources.files("pagedprefix.spec").joinpath("key_vectors.json").read_text("utf-8")
    assert text == render()
    assert len(CASES) == len(json.loads(text)["cases"])


def test_first_vector_literal() -> None:
    """Pin one key literally, so an accidental change of the encoding cannot pass silently."""
    first = load()["cases"][0]
    assert first["keys"][0] == "e3009de8daf87e3453c388e4d975cd9056b7302aacb78435362333370e8ceff9"

"""Key vectors: inputs and the hex keys the spec derives for them (``key_vectors.json``).

Other engines reproduce these to prove their key derivation is byte-exact (spec/keys.py documents
the encoding). Regenerate with ``python -m pagedprefix.spec.key_vectors --write``; ``--check``
(run by ``nox -s vectors``) fails when the committed file differs from a regeneration.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .extras import (
    NO_EXTRAS,
    Extras,
    LoRA,
    MultiModalItem,
    PromptEmbeds,
    block_extra_fields,
    extras_from_json,
    extras_to_json,
)
from .keys import chain_keys, encode_block, encode_root, hash_function

SCHEMA_VERSION = 1
SPEC_VERSION = "2.0"  # 2.0: xxh3_128 digests take the seed as XXH3's own seed (spec/keys.py)
PATH = Path(__file__).with_name("key_vectors.json")


@dataclass(frozen=True)
class KeyCase:
    """One key vector: the cache's key settings, a prompt and its extras."""

    name: str
    tokens: tuple[int, ...]
    block_size: int = 4
    hash_algo: str = "sha256"
    namespace: str = ""
    seed: int | None = None
    extras: Extras = NO_EXTRAS


T12 = tuple(range(1, 13))
IMG = MultiModalItem("sha256:img-0001", 2, 5)

CASES: tuple[KeyCase, ...] = (
    KeyCase("plain, block_size 4", T12),
    KeyCase("plain, block_size 1", (5, 6, 7), block_size=1),
    KeyCase("plain, block_size 16, 40 tokens (2 full blocks, partial tail has no key)",
            tuple(range(40)), block_size=16),
    KeyCase("partial only: 3 tokens at block_size 4 give no key", (1, 2, 3)),
    KeyCase("largest token id", (2**32 - 1, 0, 2**31, 7)),
    KeyCase("namespace", T12, namespace="SmolLM2-135M@q4_1/fp32/rope1e5"),
    KeyCase("pinned seed with sha256", T12, seed=42),
    KeyCase("lora", T12, extras=Extras(lora=LoRA("sql-adapter", 3))),
    KeyCase("lora id 0 named x", T12, extras=Extras(lora=LoRA("x", 0))),
    KeyCase("salt x (never equal to lora x)", T12, extras=Extras(cache_salt="x")),
    KeyCase("salt, unicode", T12, extras=Extras(cache_salt="tenant-é-42")),
    KeyCase("empty salt equals no salt", T12, extras=Extras(cache_salt="")),
    KeyCase("mm item spanning blocks 0-1 (negative offset in block 1)", T12,
            extras=Extras(mm_items=(IMG,))),
    KeyCase("mm item starting exactly at block 1", T12,
            extras=Extras(mm_items=(MultiModalItem("img-b", 4, 4),))),
    KeyCase("two mm items given out of order", T12, extras=Extras(
        mm_items=(MultiModalItem("b", 8, 2), MultiModalItem("a", 1, 2)))),
    KeyCase("prompt embeds in block 1", T12, extras=Extras(
        prompt_embeds=PromptEmbeds((4, 5), (bytes(range(8)), bytes(range(8, 16)))))),
    KeyCase("lora + salt + mm + embeds", T12, extras=Extras(
        lora=LoRA("chat", 9), cache_salt="s", mm_items=(IMG,),
        prompt_embeds=PromptEmbeds((9,), (b"\xff" * 4,)))),
    KeyCase("xxh3_128, seed 0", T12, hash_algo="xxh3_128", seed=0),
    KeyCase("xxh3_128, seed 2**64-1", T12, hash_algo="xxh3_128", seed=2**64 - 1),
    KeyCase("xxh3_128 with lora and salt", T12, hash_algo="xxh3_128", seed=1234,
            extras=Extras(lora=LoRA("sql-adapter", 3), cache_salt="x")),
    KeyCase("xxh3_128, block_size 16, mm", tuple(range(48)), block_size=16, hash_algo="xxh3_128",
            seed=7, extras=Extras(mm_items=(MultiModalItem("img", 10, 20),))),
    KeyCase("xxh3_128 with namespace", T12, hash_algo="xxh3_128", seed=99, namespace="m@v2"),
    KeyCase("xxh3_128, block_size 64: preimages over 240 bytes take XXH3's long path (seeded secret)",
            tuple(range(100, 228)), block_size=64, hash_algo="xxh3_128", seed=2024),
    KeyCase("weak8 (test-only)", T12, hash_algo="weak8"),
    KeyCase("block_size 2, all extras", tuple(range(6)), block_size=2, extras=Extras(
        lora=LoRA("l", 1), cache_salt="t", mm_items=(MultiModalItem("i", 1, 2),))),
)


def case_to_json(case: KeyCase) -> dict[str, object]:
    """The case with its expected root, keys and the preimage of block 0 (for debugging)."""
    hash_fn = hash_function(case.hash_algo, case.seed)
    root_preimage = encode_root(case.hash_algo, case.block_size, case.namespace, case.seed)
    root = hash_fn(root_preimage)
    keys = chain_keys(hash_fn, root, case.tokens, case.extras, case.block_size)
    fields0 = block_extra_fields(case.extras, 0, case.block_size)
    block0 = encode_block(root, case.tokens[: case.block_size], fields0) if keys else b""
    return {
        "name": case.name,
        "hash_algo": case.hash_algo,
        "block_size": case.block_size,
        "namespace": case.namespace,
        "seed": case.seed,
        "tokens": list(case.tokens),
        "extras": extras_to_json(case.extras),
        "root_preimage": root_preimage.hex(),
        "root": root.hex(),
        "block0_preimage": block0.hex(),
        "keys": [k.hex() for k in keys],
    }


def case_from_json(obj: dict[str, object]) -> KeyCase:
    """The inputs of a vector (expected outputs are ignored)."""
    extras = obj["extras"]
    tokens = obj["tokens"]
    seed = obj["seed"]
    assert isinstance(extras, dict) and isinstance(tokens, list)
    assert seed is None or isinstance(seed, int)
    return KeyCase(
        name=str(obj["name"]),
        tokens=tuple(tokens),
        block_size=int(str(obj["block_size"])),
        hash_algo=str(obj["hash_algo"]),
        namespace=str(obj["namespace"]),
        seed=seed,
        extras=extras_from_json(extras),
    )


def render() -> str:
    """The whole vector file as text (deterministic)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "spec_version": SPEC_VERSION,
        "description": "Block keys of pagedprefix: inputs -> hex root and keys. Encoding: spec/keys.py.",
        "cases": [case_to_json(c) for c in CASES],
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate key_vectors.json")
    mode.add_argument("--check", action="store_true", help="fail if regeneration differs")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        PATH.write_text(text, encoding="utf-8")
        print(f"wrote {len(CASES)} key vectors to {PATH.name}")
        return 0
    if PATH.read_text(encoding="utf-8") != text:
        print("key_vectors.json differs from a regeneration: run with --write and review", file=sys.stderr)
        return 1
    print(f"key_vectors.json: {len(CASES)} cases, regeneration identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The SmolLM2 tokenizer, rebuilt from the GGUF metadata with the ``tokenizers`` package.

The GGUF file carries a GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``): the vocabulary,
the merge list and each token's type. Its pre-tokenizer id ``"smollm"`` means: split every digit on
its own, then apply the GPT-2 split regex (the same as the Hugging Face tokenizer of SmolLM2).
Control tokens (type 3: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, …) are special tokens,
so that writing them in the text yields their single ids.

Prompts use the model's chat template (ChatML)::

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n

The system part is encoded on its own; because special tokens always cut the text, its ids are
exactly the leading ids of the whole prompt, so every request with the same system prompt starts
with the same token ids and can share their KV blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .weights import ModelUnavailable, cache_file, find_gguf, write_atomically

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "CONTROL_TOKEN_TYPE",
    "PRE_TOKENIZERS",
    "ChatTokenizer",
    "build_tokenizer",
    "load_tokenizer",
    "read_tokenizer",
]

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


PRE_TOKENIZERS: tuple[str, ...] = ("smollm", "gpt2")


def build_tokenizer(
    tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], pre: str = "smollm"
) -> tokenizers.Tokenizer:
    """A byte-level BPE tokenizer from a GGUF vocabulary (``tokens[i]`` is id ``i``), token types,
    merges (``"left right"`` strings, highest priority first) and pre-tokenizer id (``"smollm"``:
    digits split one by one, then the GPT-2 regex; ``"gpt2"``: the GPT-2 regex alone)."""
    if pre not in PRE_TOKENIZERS:
        raise ModelUnavailable(f"unsupported pre-tokenizer {pre!r}; supported: {PRE_TOKENIZERS}")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: index for index, token in enumerate(tokens)}
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ModelUnavailable(f"malformed BPE merge {merge!r} in the GGUF metadata")
        pairs.append((left, right))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    special = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == CONTROL_TOKEN_TYPE
    ]
    tokenizer.add_special_tokens(special)
    return tokenizer


@dataclass
class ChatTokenizer:
    """Encode and decode text, and build chat prompts, for SmolLM2.

    Attributes:
        tokenizer: the ``tokenizers`` object.
        eos_id: the end-of-turn token (``<|im_end|>``); generation stops after it.
        stop_ids: every id that ends generation (``eos_id`` and ``<|endoftext|>``).
    """

    tokenizer: tokenizers.Tokenizer
    eos_id: int
    stop_ids: frozenset[int]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text become their ids)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def system_prefix(self, system: str) -> list[int]:
        """The ids every request with this system prompt starts with (its system turn)."""
        return self.encode(f"<|im_start|>system\n{system}<|im_end|>\n")

    def chat_prompt(self, system: str, prompt: str) -> list[int]:
        """The ids of a one-turn chat: the system turn, the user turn, and the assistant's header."""
        user = self.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        return self.system_prefix(system) + user


def _token_id(tokens: Sequence[str], text: str) -> int | None:
    try:
        return list(tokens).index(text)
    except ValueError:
        return None


def load_tokenizer(path: Path | None = None, *, use_cache: bool = True) -> ChatTokenizer:
    """The chat tokenizer stored in the GGUF file (default: the installed SmolLM2 model).

    Parsing the GGUF metadata takes seconds, so the built tokenizer is cached as JSON beside the
    weights (see :func:`.weights.cache_file`)."""
    from tokenizers import Tokenizer

    gguf_path = path if path is not None else find_gguf()
    cached = cache_file(gguf_path, "tokenizer", ".json")
    if use_cache and cached.is_file():
        try:
            data = json.loads(cached.read_text(encoding="utf-8"))
            return ChatTokenizer(
                tokenizer=Tokenizer.from_str(data["tokenizer"]),
                eos_id=int(data["eos_id"]),
                stop_ids=frozenset(int(i) for i in data["stop_ids"]),
            )
        except Exception:  # unreadable JSON, or tokenizers rejecting it (it raises a bare Exception)
            pass  # unreadable or stale: rebuild it
    chat = read_tokenizer(gguf_path)
    if use_cache:
        text = json.dumps(
            {
                "tokenizer": chat.tokenizer.to_str(),
                "eos_id": chat.eos_id,
                "stop_ids": sorted(chat.stop_ids),
            }
        )
        write_atomically(cached, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return chat


def read_tokenizer(gguf_path: Path) -> ChatTokenizer:
    """Build the chat tokenizer from the GGUF metadata (no cache)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))

    def field(key: str) -> object:
        found = reader.fields.get(key)
        if found is None:
            raise ModelUnavailable(f"{gguf_path} lacks the tokenizer field {key!r}")
        value: object = found.contents()
        return value

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelUnavailable(f"unsupported tokenizer {kind!r}: only byte-level BPE ('gpt2') is built")
    tokens = field("tokenizer.ggml.tokens")
    token_types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    eos = field("tokenizer.ggml.eos_token_id")
    if not (isinstance(tokens, list) and isinstance(token_types, list) and isinstance(merges, list)):
        raise ModelUnavailable(f"{gguf_path} has a malformed tokenizer vocabulary")
    if not isinstance(eos, int):
        raise ModelUnavailable(f"{gguf_path} has a malformed eos token id {eos!r}")
    pre = reader.fields.get("tokenizer.ggml.pre")
    tokenizer = build_tokenizer(
        [str(t) for t in tokens],
        [int(t) for t in token_types],
        [str(m) for m in merges],
        pre="gpt2" if pre is None else str(pre.contents()),
    )
    stop = {eos}
    end_of_text = _token_id(tokens, "<|endoftext|>")
    if end_of_text is not None:
        stop.add(end_of_text)
    return ChatTokenizer(tokenizer=tokenizer, eos_id=eos, stop_ids=frozenset(stop))

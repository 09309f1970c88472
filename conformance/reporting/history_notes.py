"""Explanations of the verdicts in ``docs/HISTORY.md`` (``pagedprefix history vllm``).

Each :class:`Note` says why a property fails on the releases it covers: the file and line in *that*
release's own code (found in the release's extracted tree by a pattern, so the line is the
release's, not a guess) and the public issue or pull request where one exists. A failing property
with no note is printed as ``*unexplained*`` (never hidden).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .history_fetch import version_key


@dataclass(frozen=True)
class Note:
    """An explanation of ``props`` failing on releases ``first`` .. ``last`` (inclusive).

    ``text`` may hold ``{where}``: replaced by ``file`` line N, the first line of ``file`` in the
    release's tree that matches the regular expression ``pattern``.
    """

    props: tuple[str, ...]
    first: str
    last: str
    text: str
    file: str = ""
    pattern: str = ""
    references: tuple[str, ...] = ()


def where(root: Path | None, file: str, pattern: str) -> str:
    """```file` line N`` of the first line matching ``pattern`` in the release at ``root``."""
    if not file:
        return ""
    path = root / file if root is not None else None
    if path is None or not path.is_file():
        return f"`{file}`"
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.search(pattern, line):
            return f"`{file}` line {n}"
    return f"`{file}` (pattern {pattern!r} not found: the note needs a look)"


_LORA_BY_NAME = (
    "A published bug of the release: it keys a LoRA block by the adapter's name alone "
    "(`_gen_lora_extra_hash_keys`, {where}: `[request.lora_request.lora_name]`), so two different "
    'adapters loaded under one name (the spec\'s `LoRA("a", 1)` and `LoRA("a", 2)`: two '
    "`lora_path`s, two `lora_int_id`s) share KV blocks, and a request of one adapter hits blocks "
    "computed with the other's weights. Introduced by vllm-project/vllm#27211 (0.11.1: the name "
    "instead of `lora_int_id`, for hashes stable across instances); reported as "
    'vllm-project/vllm#30931 ("Prefix Cache Corruption with LoRA with the same name but different '
    'id", on 0.11.1) and, for a same-name reload, vllm-project/vllm#42125. 0.31.0 keys '
    '`("lora", name, path)` ("so that re-pointing a LoRA name at a different adapter does not '
    'reuse KV computed with the previous one") and passes; the pull request that made that change '
    "was not found in the public record searched."
)

_TOUCH_BEFORE_CHECK = (
    "A published bug of the release: `allocate_slots` touches the computed (hit) blocks -- ref_cnt "
    "+1, out of the free queue -- before it checks that the new blocks fit ({where}), and returns "
    "`None` without undoing it, so a refused admission leaks a reference on every hit block (they "
    "can never be evicted again). Reported as vllm-project/vllm#11562, fixed by "
    'vllm-project/vllm#11565 ("Move the _touch(computed_blocks) call in the allocate_slots method to '
    'after the check for allocating new blocks").'
)

NOTES: tuple[Note, ...] = (
    Note(
        ("hit-content", "policy-hits", "vectors: extras", "maximal-hits", "policy-sharing"),
        "0.11.1",
        "0.30.0",
        _LORA_BY_NAME,
        "vllm/v1/core/kv_cache_utils.py",
        r"lora_request\.lora_name",
        (
            "https://github.com/vllm-project/vllm/issues/30931",
            "https://github.com/vllm-project/vllm/pull/27211",
        ),
    ),
    Note(
        ("atomic-failure", "vectors: errors", "vectors: policies", "vectors: eviction"),
        "0.6.5",
        "0.6.6.post1",
        _TOUCH_BEFORE_CHECK,
        "vllm/v1/core/kv_cache_manager.py",
        r"self\._touch\(computed_blocks\)",
        (
            "https://github.com/vllm-project/vllm/issues/11562",
            "https://github.com/vllm-project/vllm/pull/11565",
        ),
    ),
)


def explain(version: str, prop: str, root: Path | None = None) -> tuple[str, list[str]]:
    """The note for ``prop`` failing on ``version`` (lines from the tree at ``root``) and its
    references, or ``*unexplained*``."""
    key = version_key(version)
    for n in NOTES:
        if prop in n.props and version_key(n.first) <= key <= version_key(n.last):
            return n.text.replace("{where}", where(root, n.file, n.pattern)), list(n.references)
    return "*unexplained*", []

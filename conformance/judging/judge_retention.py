"""Retention adequacy (HYBRID.md section 4.3): the hit a claimed retention policy promises a
request, from the sequences the engine has seen settled, with no block ever reused.

:class:`RetentionAdequacy` is the part of :class:`~pagedprefix.conformance.judging.judge.Judge` that,
for hybrid groups, remembers what was settled (:meth:`RetentionAdequacy._remember`) and computes the promise
(:meth:`RetentionAdequacy._owed`): under ``dense`` every boundary a sequence settled past
its own hit, under ``replay`` its replay boundary and the junction it recorded at admission.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedprefix.spec import Extras, RequestId
from pagedprefix.spec.groups import Groups, KVCacheGroup, first_lookup_class, need_set, replay_boundary

from ..protocol import Capabilities
from ..protocol.codec import Json, extras_from_json
from .driver import Outcome, Step
from .judge_base import JudgeBase, Req


@dataclass(frozen=True)
class Seen:
    """A token sequence the engine has seen settled: for retention adequacy."""

    tokens: tuple[int, ...]
    extras: Extras
    rid: RequestId
    step: int
    admission: bool
    junction: int = 0
    hit: int = 0
    inherited: int = 0


def _common(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class RetentionAdequacy(JudgeBase):
    """What the claimed retention promises (see the module docstring), and its check: the
    judge's part below :class:`~pagedprefix.conformance.judging.judge.Judge`, whose groups,
    alignment, capabilities and step counter it reads."""

    groups: Groups
    A: int
    caps: Capabilities
    step_index: int
    seen: list[Seen]
    attention_seen: list[Seen]

    def _remember(self, req: Req, rid: RequestId, admission: bool, hit: int = 0) -> None:
        junction = 0
        if admission:
            own = self._junction_bound(req.tokens, req.extras)
            junction = own if own > hit else 0
        seen = Seen(
            tuple(req.tokens), req.extras, rid, self.step_index, admission, junction, req.hit, req.inherited
        )
        self.seen.append(seen)
        self.attention_seen.append(seen)

    def _usable(self, seen: Seen) -> bool:
        has_mamba = any(g.kind == "mamba" for g in self.groups)
        return not (has_mamba and seen.step == self.step_index)

    def _full_bound(self, tokens: list[int], extras: Extras) -> int:
        """What the full-attention groups hold of ``tokens`` (no eviction): the longest common
        prefix with a settled sequence, within its cacheable length, rounded down to ``A``."""
        best = 0
        for s in self.attention_seen:
            if s.extras == extras:
                q = min(_common(s.tokens, tokens), len(s.tokens), len(tokens) - 1)
                best = max(best, q // self.A * self.A)
        return best

    def _junction_bound(self, tokens: list[int], extras: Extras) -> int:
        """The junction an admission of ``tokens`` records when no block was ever reused: the own
        hit of the group vLLM looks up first (SEMANTICS.md section 8, ``first_lookup_class``) from
        what the engine has seen. Exact for a full, sliding or chunked first group; 0 (promise
        nothing beyond the replay boundary) for a Mamba one, whose states depend on publication.
        A junction the judge cannot compute exactly must be 0, never a guess: the engine retains
        the tail at its junction only, so a wrong non-zero one would promise a hit it never kept."""
        first = self.groups[first_lookup_class(self.groups)[0]]
        if first.kind == "full":
            return self._full_bound(tokens, extras)
        if first.kind == "mamba":
            return 0
        entries = range(len(tokens) // first.block_size)
        keyed = [self._keyed_by_seen(first, j, tokens, extras) for j in entries]
        for length in range(replay_boundary(len(tokens), self.A), 0, -self.A):
            if all(keyed[j] for j in need_set(first, length)):
                return length
        return 0

    def _keyed_by_seen(self, first: KVCacheGroup, j: int, tokens: list[int], extras: Extras) -> bool:
        """Whether entry ``j`` of the sliding or chunked group ``first`` is keyed for
        ``tokens`` with no block ever reused: some sequence seen with ``extras`` shares the entry's
        prefix and keyed it — chunked, every full entry up to its cacheable length from the chunk
        of its own hit on (entries before that chunk it never held); sliding under ``replay``, the
        need sets of its replay boundary and its junction at admission (those of its hit were
        keyed already)."""
        end = (j + 1) * first.block_size
        for s in self.attention_seen:
            if s.extras != extras or _common(s.tokens, tokens) < end:
                continue
            if first.kind == "chunked":
                chunk_start = s.hit // first.chunk * first.chunk
                if end <= len(s.tokens) // self.A * self.A and j * first.block_size >= chunk_start:
                    return True
            elif s.admission:
                boundaries = [replay_boundary(len(s.tokens), self.A)] + ([s.junction] if s.junction else [])
                if any(j in need_set(first, b) for b in boundaries):
                    return True
        return False

    def _owed(self, step: Step) -> int:
        """The hit the claimed retention promises ``step`` from what the engine has seen."""
        if not self.maximal or self.caps.retention not in ("replay", "dense"):
            return 0
        tokens = list(step["tokens"])
        extras = extras_from_json(step.get("extras"))
        n = len(tokens)
        dense = self.caps.retention == "dense" or not any(g.kind in ("sliding", "mamba") for g in self.groups)
        has_mamba = any(g.kind == "mamba" for g in self.groups)
        best = 0
        for s in self.seen:
            if s.extras != extras or not self._usable(s):
                continue
            q = _common(s.tokens, tokens)
            if dense:  # every boundary the sequence settled past its own hit is keyed
                b = min(q, len(s.tokens), n - 1) // self.A * self.A
                # ... by this request: a fork child keys only past what it inherited (a Mamba state
                # there is its parent's key, gone when the parent is freed before ``new_step``)
                if b >= s.hit and not (has_mamba and s.inherited and b <= s.inherited):
                    best = max(best, b)
                continue
            if s.admission:
                r = replay_boundary(len(s.tokens), self.A)
                if q >= r and n - 1 >= r:
                    best = max(best, r)
                if s.junction and q >= s.junction and n - 1 >= s.junction:
                    best = max(best, s.junction)
        return best

    def _check_promised(
        self, step: Step, outcome: Outcome, exp: dict[str, Json], what: str, owed: int
    ) -> None:
        """``retention-adequacy``: the hit the claimed retention promises (:meth:`_owed`)."""
        if outcome.ok and step["op"] in ("allocate", "lookup") and not self._pressure(exp) and owed:
            got = int((outcome.result or {})["num_computed_tokens"])
            if got < owed:
                self.fail(
                    "retention-adequacy",
                    f"{what} hit {got} tokens; retention={self.caps.retention} "
                    f"promises {owed} (no block ever had to be reused)",
                )

"""The comparison rules for hybrid KV-cache groups (SEMANTICS.md section 8, HYBRID.md section 4).

:class:`HybridJudge` is the judge (:class:`~pagedprefix.conformance.judging.judge_base.JudgeBase`, the
skeleton it shares with the one-group :class:`~pagedprefix.conformance.judging.judge.Judge`) for a config
with hybrid groups: it sees, after every step, the engine's outcome and observation (per-group tables) and the
spec's expectation, and names the first property that does not hold.

Like the single-group judge it needs nothing but tables and hit lengths. It remembers what was
written into every block: for an attention group, per slot, an identity of the token there and
its whole history (earlier tokens and extras); for a Mamba group, the identity of the prefix
whose recurrent state the block holds. What an operation writes follows from its result (the
protocol's contract, ``conformance/README.md``):

- an admission with hit ``L`` writes positions ``L .. n-1`` into the attention entries from
  ``L / B`` on, the running state (after ``n`` tokens) into the last Mamba entry, the state after
  ``(j + 1) * B`` into any other Mamba entry ``j >= L / B`` it holds, and the state after ``t``
  into each reported checkpoint ``(group, t, block)``;
- a decode writes its new positions, copies each ``(src, dst)`` first, advances a Mamba running
  state that moves to a new entry to the end of its old entry (vLLM's ``align`` mode), and writes
  its checkpoints;
- ``fork`` copies each Mamba running state into the reported ``dst``.

Checked on every step: H1 ``group-soundness`` (a hit's need set holds this prefix's content, and
so does every held entry), H2 ``one-boundary``, H3 ``window-liveness`` (need sets held and never
overwritten; a decode releases only entries outside the previous length's need set), H4
``state-publication`` (no hit on a state written since the last ``new_step`` or by a request
aborted before it; a running state never shared), H5 ``group-atomicity`` (an admission never pops
its own hit), H6 ``group-accounting`` (free + held = N, a block in one group only, ref counts),
H7 ``group-failure`` (a failed operation changes nothing, except a refused decode's release),
``cow-isolation``, ``error-kinds``, ``progress``; at ``maximal`` the lookup maximality of the
config's retention policy and ``retention-adequacy`` of the claimed one (HYBRID.md section 4.3);
at ``lru``/``exact`` every observation up to one renaming of block ids, or exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pagedprefix.spec import CacheConfig, Extras, RequestId, hit_alignment
from pagedprefix.spec.groups import need_set, num_entries
from pagedprefix.spec.hybrid import config_groups

from ..protocol import Capabilities
from ..protocol.codec import Json, extras_from_json
from .driver import Observation, Outcome, Step, describe_step
from .event_check import EventChecker
from .judge import Judge
from .judge_retention import RetentionAdequacy

H1, H2, H3, H4, H5, H6, H7 = (  # HYBRID.md section 4.1
    "group-soundness", "one-boundary", "window-liveness", "state-publication",
    "group-atomicity", "group-accounting", "group-failure",
)
Tables = list[list[int | None]]
Holders = dict[int, list[tuple[RequestId, int, int]]]
"""Block -> the live ``(request, group, entry)`` holding it."""
HYBRID_STATE_FIELDS = ("num_free_blocks", "group_tables", "ref_cnt", "free_blocks")


@dataclass
class HReq:
    """A live request as the hybrid judge knows it."""

    tokens: list[int]
    extras: Extras
    tables: Tables
    idents: list[int] = field(default_factory=list)
    hit: int = 0
    """The admission's hit: entries it skipped were never computed by this request."""
    inherited: int = 0
    """Tokens a fork child got from its parent: their states were keyed by the parent, not by the
    child (dropped with the parent's pending keys when it is freed before ``new_step``)."""


@dataclass
class BlockData:
    """What the judge knows was written into a block: its group, and per slot the identity of
    the token there (attention) or the identity of the prefix whose state it holds (Mamba)."""

    group: int
    slots: dict[int, int] = field(default_factory=dict)
    state: int | None = None


class HybridJudge(RetentionAdequacy[HReq]):
    """Checks one run with hybrid groups at one profile level (see the module docstring).

    Args:
        config: the cache config (with hybrid ``groups``).
        level: the effective profile.
        disabled: properties whose violation raises ``Lost`` (the stateful runner).
        caps: the engine's capabilities (its retention and same-step claims).
    """

    STATE_FIELDS = HYBRID_STATE_FIELDS
    TABLES, TABLE_NAME = "group_tables", "block_tables"
    ALLOWED_ERRORS: ClassVar[dict[str, tuple[str, ...]]] = {
        "allocate": ("OutOfBlocks", "Deferred"),
        "append": ("OutOfBlocks",),
        "fork": ("OutOfBlocks",),
    }
    ACCOUNTING, HELD, ATOMIC = H6, H3, H7
    IN_QUEUE = "block {b} is held by request {rid!r} but sits in the free queue"
    NOT_UNREFERENCED = "free queue {queue} is not the set of unreferenced blocks"

    def __init__(self, config: CacheConfig, level: str, disabled: frozenset[str], caps: Capabilities) -> None:
        super().__init__(config, level, disabled)
        self.caps = caps
        self.groups = config_groups(config)
        if caps.events:  # the per-group event stream (SEMANTICS.md section 9, spec/events.py)
            sizes = [(g.kind, g.block_size) for g in self.groups]
            self.events = EventChecker(config.block_size, self.fail, sizes)
        self.A = hit_alignment(self.groups)
        self.data: dict[int, BlockData] = {}
        self.written_in_step: set[int] = set()
        self.writer: dict[int, RequestId] = {}  # block -> who wrote its state in this step
        self.aborted: set[int] = set()
        self.step_index = 0
        self.seen = []
        self.attention_seen = []
        """Every sequence remembered since the last reset, aborted Mamba producers included: their
        attention keys stay in the index (only pending Mamba keys are dropped), so the junction
        (an attention group's own hit) is computed from these."""
        self.maximal_hits = (
            self.maximal
            and caps.retention == config.retention
            and caps.same_step_state == "defer"
            and caps.publish == "allocation"
        )

    # ----- identities and holders ---------------------------------------------------------------

    def _new_req(self, tokens: list[int], extras: Extras, tables: Tables) -> HReq:
        req = HReq(tokens, extras, tables)
        self._extend_idents(req, tokens)
        return req

    def _expected_state(self, req: HReq, g: int, j: int) -> int:
        """The state a request reads in Mamba entry ``j``: after ``(j + 1) * B`` tokens, or after
        all its tokens for its last entry."""
        n = len(req.tokens)
        end = n if j == len(req.tables[g]) - 1 else (j + 1) * self.groups[g].block_size
        return req.idents[min(end, n) - 1]

    def _entries(self, req: HReq) -> Iterator[tuple[int, int, int]]:
        return ((g, j, b) for g, table in enumerate(req.tables) for j, b in enumerate(table) if b is not None)

    def _holders(self) -> Holders:
        holders: Holders = {}
        for rid, req in self.live.items():
            for g, table in enumerate(req.tables):
                for j, b in enumerate(table):
                    if b is not None:
                        holders.setdefault(b, []).append((rid, g, j))
        return holders

    @staticmethod
    def _others(holders: Holders, b: int, writer: RequestId) -> Iterator[tuple[RequestId, int, int]]:
        """The entries of requests other than ``writer`` that hold block ``b``."""
        return (h for h in holders.get(b, []) if h[0] != writer)

    def _reader_prop(self, rid: RequestId, g: int, j: int) -> str:
        """The property a write into another request's entry breaks: H3 inside its need set."""
        req = self.live[rid]
        return H3 if j in need_set(self.groups[g], len(req.tokens)) else H6

    # ----- writes -------------------------------------------------------------------------------

    def _write_slot(
        self,
        holders: Holders,
        writer: RequestId,
        b: int,
        g: int,
        slot: int,
        ident: int,
        shared_prop: str | None,
        why: str,
    ) -> None:
        B = self.groups[g].block_size
        for rid, hg, j in self._others(holders, b, writer):
            other = self.live[rid]
            pos = j * B + slot
            if hg == g and pos < len(other.tokens) and other.idents[pos] != ident:
                prop = shared_prop or self._reader_prop(rid, hg, j)
                self.fail(
                    prop,
                    f"request {writer!r} writes slot {slot} of block {b} (group {g}, {why}), which request "
                    f"{rid!r} reads as its position {pos}: "
                    + self.differs(ident, other.idents[pos], pos - slot, "the write", f"request {rid!r}"),
                )
        data = self.data.get(b)
        if data is None or data.group != g or data.state is not None:
            data = self.data[b] = BlockData(g)
        data.slots[slot] = ident

    def _write_state(
        self,
        holders: Holders,
        writer: RequestId,
        b: int,
        g: int,
        ident: int,
        why: str,
    ) -> None:
        for rid, hg, j in self._others(holders, b, writer):
            if hg != g or self._expected_state(self.live[rid], hg, j) != ident:
                self.fail(
                    H4 if hg == g else H6,
                    f"request {writer!r} writes a recurrent state into block {b} ({why}), which request "
                    f"{rid!r} holds as its group-{hg} entry {j}: a state is resumed in place from a "
                    "shared block",
                )
        self.data[b] = BlockData(g, state=ident)
        self.aborted.discard(b)
        self.written_in_step.add(b)
        self.writer[b] = writer

    def _write_group_positions(
        self,
        holders: Holders,
        rid: RequestId,
        req: HReq,
        start: int,
        kept: set[tuple[int, int]],
    ) -> None:
        """Write positions ``start .. n-1`` into the request's attention entries; ``kept``: the
        ``(group, entry)`` it wrote into a block it already shared (copy-on-write isolation)."""
        n = len(req.tokens)
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                continue
            B = group.block_size
            for p in range(start, n):
                b = req.tables[g][p // B]
                if b is None:
                    continue
                shared = (g, p // B) in kept
                self._write_slot(
                    holders,
                    rid,
                    b,
                    g,
                    p % B,
                    req.idents[p],
                    "cow-isolation" if shared else None,
                    "its shared last block" if shared else "a block it was given for new tokens",
                )

    # ----- reading what a hit serves ------------------------------------------------------------

    def _check_entry(self, req: HReq, g: int, j: int, b: int, prop: str, what: str) -> None:
        """Entry ``j`` of group ``g`` holds the request's own content (up to its tokens)."""
        group = self.groups[g]
        data = self.data.get(b)
        if group.kind == "mamba":
            want = self._expected_state(req, g, j)
            if data is not None and data.group == g and data.state == want:
                if b in self.written_in_step and prop == H1:
                    self.fail(
                        H4,
                        f"{what}: group {g} entry {j} (block {b}) holds a state written in this "
                        "step, before new_step(): it may not be computed yet",
                    )
                return
            if b in self.aborted:
                self.fail(
                    H4,
                    f"{what}: group {g} entry {j} (block {b}) holds a state whose writer was "
                    "freed before new_step() (never written)",
                )
            if data is None or data.state is None:
                state = "was never written"
            else:
                state = f"holds another state: {self.differs(data.state, want)}"
            self.fail(prop, f"{what}: group {g} entry {j} (block {b}) {state}")
        B = group.block_size
        for s in range(B):
            p = j * B + s
            if p >= len(req.tokens):
                break
            got = None if data is None or data.group != g else data.slots.get(s)
            if got != req.idents[p]:
                state = "was never written" if got is None else "holds KV of other content"
                why = "" if got is None else f": {self.differs(got, req.idents[p], j * B, f'block {b}')}"
                self.fail(prop, f"{what}: group {g} entry {j}, position {p} in block {b} {state}{why}")

    # ----- the run ----------------------------------------------------------------------------

    def _check_events(self, step: Step, outcome: Outcome, obs: Observation, what: str) -> None:
        """The per-group event stream against ``cached_keys()`` (:class:`EventChecker`). Where a
        hybrid operation keys entries depends on the retention (a window tail, a checkpoint, the
        junction), so no position is prescribed: a stored block must spell a prefix of, or be an
        aligned block of, a request the engine was given."""
        assert self.events is not None
        op = step["op"]
        if outcome.ok and op in ("allocate", "append"):
            req = self.live.get(step["request_id"])
            if req is not None:
                self.events.give(req.tokens)
        super()._check_events(step, outcome, obs, what)

    # ----- failures -----------------------------------------------------------------------------

    def _released_on_refusal(self, step: Step, outcome: Outcome, obs: Observation) -> bool:
        """A refused decode may release its entries outside the need set at its previous length
        (SEMANTICS.md section 8: the one exception to atomic failure). Returns whether it did
        exactly that (and takes the release into the model); fails H7 on any other change."""
        if step["op"] != "append" or outcome.error != "OutOfBlocks":
            return False
        rid = step["request_id"]
        req = self.live.get(rid)
        if req is None:
            return False
        tables = {r: t for r, t in obs["group_tables"]}
        got = tables.get(rid)
        if got is None or got == req.tables:
            return False
        n = len(req.tokens)
        for g, (old, new) in enumerate(zip(req.tables, got)):
            for j, (a, b) in enumerate(zip(old, new)):
                if a != b and not (b is None and j not in need_set(self.groups[g], n)):
                    self.fail(
                        H7,
                        f"{describe_step(step)} raised OutOfBlocks but changed group {g} entry {j} "
                        f"of request {rid!r}: {a} -> {b}",
                    )
            if len(old) != len(new):
                self.fail(H7, f"{describe_step(step)} raised OutOfBlocks but resized a table of {rid!r}")
        for r, t in tables.items():
            if r != rid and r in self.live and t != self.live[r].tables:
                self.fail(H7, f"{describe_step(step)} raised OutOfBlocks but changed request {r!r}'s tables")
        req.tables = [list(t) for t in got]
        return True

    def _check_deferral(self, step: Step, what: str) -> None:
        """``Deferred`` is owed only by an engine that defers, for a hit on a state of this step."""
        if self.caps.same_step_state != "defer":
            self.fail("error-kinds", f"{what} raised Deferred; the engine declares same_step_state=miss")
        probe = self._new_req(list(step["tokens"]), extras_from_json(step.get("extras")), [])
        boundaries = {probe.idents[b - 1] for b in range(self.A, len(probe.tokens), self.A)}
        if not any(self.data[b].state in boundaries for b in self.written_in_step if b in self.data):
            self.fail(
                "progress",
                f"{what} raised Deferred, but no recurrent state of its prefix was written in this step",
            )

    def _check_progress(self, step: Step, before: Observation, what: str) -> None:
        """``OutOfBlocks`` although the free blocks cover the most any engine could need: every
        entry of every group, every Mamba state materialised, and a copy per group."""
        free = int(before["num_free_blocks"])
        if step["op"] == "allocate":
            n = len(step["tokens"])
            need = sum(num_entries(g, n) for g in self.groups)
        elif step["op"] == "append":
            req = self.live[step["request_id"]]
            old, new = len(req.tokens), len(req.tokens) + len(step["tokens"])
            need = sum(num_entries(g, new) - num_entries(g, old) + 1 for g in self.groups)
        else:
            need = sum(1 for g in self.groups if g.kind == "mamba")
        if need <= free:
            self.fail(
                "progress",
                f"{what} raised OutOfBlocks although it needs at most {need} blocks and {free} are free",
            )

    # ----- successful operations ----------------------------------------------------------------

    def _apply_free(self, request_id: RequestId) -> None:
        del self.live[request_id]
        if any(group.kind == "mamba" for group in self.groups):
            for b in [b for b, w in self.writer.items() if w == request_id]:  # aborted: never written
                del self.writer[b]
                if b in self.data and self.data[b].state is not None:
                    self.data[b].state = None
                    self.aborted.add(b)
            self.seen = [s for s in self.seen if not (s.rid == request_id and s.step == self.step_index)]

    def _apply_new_step(self) -> None:
        self.written_in_step.clear()
        self.writer.clear()
        self.step_index += 1

    def _apply_lookup(self, hit: int, num_tokens: int, what: str) -> None:
        self._check_boundary(hit, num_tokens, what)

    def _apply_reset(self, what: str) -> None:
        if self.live:
            self.fail(H6, f"{what} returned True while {len(self.live)} requests hold blocks")
        self.seen.clear()
        self.attention_seen.clear()
        self.engine_pops = 0

    def _check_boundary(self, hit: int, n: int, what: str) -> None:
        if not 0 <= hit <= n - 1 or hit % self.A:
            self.fail(
                H2,
                f"{what} resumes at {hit} tokens of {n}: not a multiple of the hit alignment "
                f"{self.A} in [0, {n - 1}]",
            )

    def _check_shape(self, tables: Tables, n: int, what: str) -> None:
        if len(tables) != len(self.groups):
            self.fail(H6, f"{what}: {len(tables)} tables for {len(self.groups)} groups")
        for g, (group, table) in enumerate(zip(self.groups, tables)):
            if len(table) != num_entries(group, n):
                self.fail(H6, f"{what}: group {g}'s table has {len(table)} entries for {n} tokens")
            if any(b is not None and not 0 <= b < self.N for b in table):
                self.fail(H6, f"{what}: group {g}'s table {table} has ids outside 0..{self.N - 1}")

    def _apply_allocate(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid = step["request_id"]
        tokens = list(step["tokens"])
        n = len(tokens)
        hit = int(result["num_computed_tokens"])
        tables: Tables = [list(t) for t in result["block_tables"]]
        self._check_boundary(hit, n, what)
        self._check_shape(tables, n, what)
        req = self._new_req(tokens, extras_from_json(step.get("extras")), tables)
        req.hit = hit
        self._check_own_blocks(tables, hit, what)
        for g, group in enumerate(self.groups):
            for j in need_set(group, hit):
                b = tables[g][j]
                if b is None:
                    self.fail(
                        H1,
                        f"{what} hit {hit} tokens but holds no block for group {g}'s entry {j}, "
                        "which the next step reads",
                    )
                self._check_entry(req, g, j, b, H1, f"{what} hit {hit} tokens")
            for j in range(hit // group.block_size):
                b = tables[g][j]
                if b is not None and j not in need_set(group, hit):
                    self._check_entry(req, g, j, b, H1, f"{what}: an entry it holds below the hit")
        self._write_group_positions(holders, rid, req, hit, set())
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                for j in range(hit // group.block_size, len(tables[g])):
                    b = tables[g][j]
                    if b is not None:
                        self._write_state(holders, rid, b, g, self._expected_state(req, g, j), "its state")
        self._write_checkpoints(holders, rid, req, result, hit, what)
        self.live[rid] = req
        self.engine_pops += self._popped(tables, hit) + len(result.get("checkpoints", []))
        self._remember(req, rid, admission=True, hit=hit)

    def _check_own_blocks(self, tables: Tables, hit: int, what: str) -> None:
        """H5: no block twice in one request's tables (an admission that pops its own hit)."""
        where: dict[int, tuple[int, int]] = {}
        for g, table in enumerate(tables):
            for j, b in enumerate(table):
                if b is None:
                    continue
                if b in where:
                    g0, j0 = where[b]
                    hits = [j0 * self.groups[g0].block_size < hit, j * self.groups[g].block_size < hit]
                    prop = H5 if any(hits) and not all(hits) else H6
                    self.fail(
                        prop,
                        f"{what}: block {b} is group {g0}'s entry {j0} and group {g}'s entry {j}"
                        + (" (a hit reused for new content in the same admission)" if prop == H5 else ""),
                    )
                where[b] = (g, j)

    def _write_checkpoints(
        self,
        holders: Holders,
        rid: RequestId,
        req: HReq,
        result: dict[str, Json],
        low: int,
        what: str,
    ) -> None:
        n = len(req.tokens)
        for g, t, b in result.get("checkpoints", []):
            if not (
                0 <= g < len(self.groups)
                and self.groups[g].kind == "mamba"
                and low < t <= n
                and t % self.groups[g].block_size == 0
                and 0 <= b < self.N
            ):
                self.fail(
                    H6, f"{what} reported checkpoint {[g, t, b]}: not a Mamba state of the tokens it computed"
                )
            self._write_state(holders, rid, b, g, req.idents[t - 1], f"the checkpoint after {t} tokens")

    def _popped(self, tables: Tables, hit: int) -> int:
        return sum(
            1
            for g, table in enumerate(tables)
            for j, b in enumerate(table)
            if b is not None and j * self.groups[g].block_size >= hit
        )

    def _apply_append(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid, req, old_len, copies, new_tokens = self._appending(step, result)
        old = req.tables
        tables: Tables = [list(t) for t in result["block_tables"]]
        self._check_shape(tables, old_len + len(new_tokens), what)
        copied = {src: dst for src, dst in copies}
        kept: set[tuple[int, int]] = set()
        for g, group in enumerate(self.groups):
            for j, (a, b) in enumerate(zip(old[g], tables[g])):
                if a == b:
                    if a is not None and j == len(old[g]) - 1 and old_len % group.block_size:
                        kept.add((g, j))
                    continue
                inside = j in need_set(group, old_len)
                # a copy-on-write of the last entry (a released entry, ``b is None``, is no copy: the
                # old last entry is what the step reads, a Mamba running state's copy source too)
                last_cow = j == len(old[g]) - 1 and a is not None and a in copied and copied[a] == b
                if b is None and not inside:
                    continue  # released: outside the need set at the previous length
                if not last_cow:
                    self.fail(
                        H3 if inside else H6,
                        f"{what} replaced group {g}'s entry {j}: {a} -> {b}"
                        + (" inside the need set" if inside else ""),
                    )
        for src, dst in copies:
            if not (0 <= src < self.N and 0 <= dst < self.N):
                self.fail(H6, f"{what} reported copy ({src}, {dst}) outside 0..{self.N - 1}")
            data = self.data.get(src)
            if data is not None:
                for s, ident in data.slots.items():
                    self._write_slot(
                        holders, rid, dst, data.group, s, ident, None, "a copy-on-write destination"
                    )
        req.tables = tables
        req.tokens.extend(new_tokens)
        self._extend_idents(req, new_tokens)
        self._write_group_positions(holders, rid, req, old_len, kept)
        for g, group in enumerate(self.groups):
            if group.kind != "mamba":
                continue
            at_end = old_len % group.block_size == 0  # the old running state already fills its entry
            for j, b in enumerate(tables[g]):
                # every new entry, and the old running one unless it already held its entry's end
                # state and the running state moved on (then nothing rewrites it)
                moved_on = j == len(old[g]) - 1 and j < len(tables[g]) - 1 and at_end
                if b is not None and j >= len(old[g]) - 1 and not moved_on:
                    self._write_state(holders, rid, b, g, self._expected_state(req, g, j), "its state")
        self._write_checkpoints(holders, rid, req, result, old_len, what)
        grown = sum(len(t) for t in tables) - sum(len(t) for t in old)
        self.engine_pops += max(grown, 0) + len(copies) + len(result.get("checkpoints", []))
        self._remember(req, rid, admission=False)

    def _apply_fork(self, step: Step, result: dict[str, Json], obs: Observation, what: str) -> None:
        holders = self._holders()
        parent = self.live[step["parent_id"]]
        child_id = step["child_id"]
        tables = {rid: t for rid, t in obs["group_tables"]}.get(child_id)
        if tables is None:
            self.fail(H6, f"{what}: the child is not live")
        child = HReq(
            list(parent.tokens), parent.extras, [list(t) for t in tables], list(parent.idents), parent.hit,
            max(parent.inherited, len(parent.tokens)),
        )
        self._check_shape(child.tables, len(child.tokens), what)
        self.live[child_id] = child
        for src, dst in (tuple(c) for c in result.get("copies", [])):
            data = self.data.get(src)
            if data is None or data.state is None:
                self.fail(H4, f"{what} copied block {src}, which holds no recurrent state")
                return
            self._write_state(holders, child_id, dst, data.group, data.state, "the copied running state")
        for g, group in enumerate(self.groups):
            if group.kind == "mamba" and child.tables[g][-1] == parent.tables[g][-1]:
                self.fail(
                    H4,
                    f"{what}: parent and child share the running state block {parent.tables[g][-1]} "
                    f"of group {g} (a running state is never shared; fork must copy it)",
                )
        self.live[child_id] = child
        self.engine_pops += len(result.get("copies", []))

    # ----- after every step ---------------------------------------------------------------------

    def _tables_of(self, req: HReq) -> Json:
        return req.tables

    def _changed_tables(self, rid: RequestId, req: HReq, got: Json, touched: bool, what: str) -> str:
        return f"after {what}, block_tables({rid!r}) = {got}, but the judge has {req.tables}"

    def _check_contents(self, step: Step) -> None:
        """H3: every live request holds its need set, with its own content; every other held
        entry still holds its own content (H1)."""
        for rid, req in self.live.items():
            n = len(req.tokens)
            for g, group in enumerate(self.groups):
                needed = need_set(group, n)
                for j, b in enumerate(req.tables[g]):
                    if b is None:
                        if j in needed:
                            self.fail(
                                H3,
                                f"request {rid!r} no longer holds group {g}'s entry {j}, inside "
                                f"the need set at {n} tokens",
                            )
                        continue
                    prop = H3 if j in needed else H1
                    if group.kind == "mamba" and j not in needed:
                        continue  # a superseded state: never read again
                    self._check_entry(req, g, j, b, prop, f"request {rid!r}")

    # ----- comparisons with the spec --------------------------------------------------------

    def _compare_maximal(self, step: Step, got: int, exp: dict[str, Json], what: str, owed: int) -> None:
        """Without eviction pressure, a hit at least as long as the spec's, for an engine whose
        retention, same-step and publication claims are the spec's."""
        if not self.maximal_hits or self._pressure(exp):
            return
        got_hit, want_hit = int(got), int(exp["result"]["num_computed_tokens"])
        if got_hit < want_hit:
            self.fail(
                "maximal-hits",
                f"{what} hit {got_hit} tokens; the spec hits {want_hit}, and no block ever had to be reused",
            )

    def _compare_result(self, op: str, exp_res: dict[str, Json], res: dict[str, Json], what: str) -> None:
        if "block_tables" in exp_res:
            self._same_tables(exp_res["block_tables"], res["block_tables"], f"{what}: block_tables")
        for name in ("copies", "checkpoints"):
            if name in exp_res:
                self._same_pairs(exp_res[name], res.get(name, []), name, what)

    def _same_tables(self, spec: list[list[int | None]], engine: list[list[int | None]], what: str) -> None:
        if len(spec) != len(engine) or any(
            len(s) != len(e) or [x is None for x in s] != [x is None for x in e] for s, e in zip(spec, engine)
        ):
            self.fail("policy-sharing", f"{what}: engine {engine}, spec {spec}")
        self._same_seq(
            [b for t in spec for b in t if b is not None],
            [b for t in engine for b in t if b is not None],
            "policy-sharing",
            f"{what}: engine {engine}, spec {spec}",
        )

    def _same_pairs(self, spec: list[list[int]], engine: list[list[int]], name: str, what: str) -> None:
        if name == "checkpoints":
            if [c[:2] for c in spec] != [c[:2] for c in engine]:
                self.fail("policy-sharing", f"{what}: checkpoints engine {engine}, spec {spec}")
            self._same_seq(
                [c[2] for c in spec], [c[2] for c in engine], "policy-sharing", f"{what}: checkpoints"
            )
            return
        self._same_seq(
            [b for p in spec for b in p], [b for p in engine for b in p], "policy-sharing", f"{what}: copies"
        )


def judge_for(config: CacheConfig, level: str, disabled: frozenset[str], caps: Capabilities) -> Any:
    """The judge of a run: :class:`HybridJudge` for hybrid groups, else :class:`Judge`."""
    from pagedprefix.spec import is_hybrid

    if is_hybrid(config.groups, config.block_size):  # KV-cache events per group when caps.events
        return HybridJudge(config, level, disabled, caps)
    return Judge(
        config,
        level,
        disabled,
        caps.publish_decode,
        events=caps.events,
        publishes_at_operation=caps.publish == "allocation" and caps.publish_decode == "append",
    )

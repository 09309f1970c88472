"""The judge: the comparison rules of one run, for any list of KV-cache groups.

:class:`Judge` sees, after each step, the engine's outcome and observation and the spec's expected
outcome and observation, and raises :class:`~pagedprefix.conformance.judging.properties.Violation`
naming the first property that does not hold. The groups are data: the one full-attention group
of SEMANTICS.md sections 1-7 is the config ``(full(block_size),)`` and goes through the same model
(:class:`~pagedprefix.conformance.judging.judge_groups.GroupModel`) and the same rules as hybrid
groups (section 8, HYBRID.md section 4); what the two readings differ in is named in
:class:`~pagedprefix.conformance.judging.judge_base.Names` (property names, the observation's shape)
and in the few rules section 6 states for the one group only: hits of any token length,
canonicalized tables, the ``maximal`` promise read from the engine's publication claims, and
the exact block count of a decode.

The core checker needs nothing but tables and hit lengths. It remembers what was written into
every block (:mod:`~pagedprefix.conformance.judging.judge_groups`). Then:

- a hit must read slots holding exactly the request's own identities (``hit-content``, H1);
- a write must not change a slot another live request reads (``cow-isolation`` when the writer
  got the block by sharing — a hit or a fork; ``held-blocks`` / H3 when it was handed out fresh
  while someone still held it);
- after every step, every live request must read its own identities through its tables (its need
  set for hybrid groups);
- hybrid groups add H2 one resume point, H4 no hit on a recurrent state before ``new_step``, H5 an
  admission never pops its own hit, H6 accounting across groups, H7 failed operations change
  nothing but a refused decode's release.

Observations the engine declares (``ref_cnt``, ``free_blocks``) add conservation checks; an engine
declaring ``events`` has its event stream checked against its own ``cached_keys()``
(:class:`~pagedprefix.conformance.judging.event_check.EventChecker`). Above ``core``, the spec's
observations are compared: ``maximal`` compares hit lengths while no block has had to be reused
(the spec has taken at most ``num_blocks`` blocks for new content since creation or the last
reset, so a never-used block was always at hand), and for hybrid groups the hit the claimed
retention promises (HYBRID.md section 4.3); ``lru`` compares everything up to one consistent
renaming of physical ids (a bijection built as blocks are first seen, kept for the whole run);
``exact`` requires the identity.
"""

from __future__ import annotations

from pagedprefix.spec import CacheConfig, RequestId
from pagedprefix.spec.groups import need_set, num_entries

from ..protocol import Capabilities
from ..protocol.codec import Json, extras_from_json
from .driver import Observation, Outcome, Step, describe_step
from .judge_base import Lost, Renaming, Req, Tables, first_error
from .judge_groups import GroupModel
from .properties import H1, H3, H4, H6

__all__ = ["Judge", "Lost", "Renaming", "Req", "first_error", "judge_for"]


class Judge(GroupModel):
    """Checks one run (a vector case or a stateful example) at one profile level (see the module
    docstring; the shared skeleton is :class:`~pagedprefix.conformance.judging.judge_base.JudgeBase`).

    Args:
        config: the cache config the engine was built with.
        level: the effective profile (already lowered for undeclared claims).
        disabled: properties whose violation raises :class:`Lost` instead of
            :class:`Violation` (the stateful runner uses it to look past a known failure).
        caps: the engine's capabilities: ``publish_decode`` (when blocks filled by ``append``
            become visible: ``maximal`` expects hits only on what the engine has published),
            ``events`` (observations carry ``events`` and ``cached_keys``), ``publish`` (an engine
            keying during the operation must store exactly that request's newly keyed blocks), and
            for hybrid groups ``retention`` and ``same_step_state``.
    """

    def __init__(
        self,
        config: CacheConfig,
        level: str,
        disabled: frozenset[str] = frozenset(),
        caps: Capabilities | None = None,
    ) -> None:
        caps = Capabilities() if caps is None else caps
        super().__init__(config, level, disabled, caps)
        self.maximal_hits = self.maximal and (
            not self.hybrid
            or (
                caps.retention == config.retention
                and caps.same_step_state == "defer"
                and caps.publish == "allocation"
            )
        )

    # ----- failures -----------------------------------------------------------------------------

    def _released_on_refusal(self, step: Step, outcome: Outcome, obs: Observation) -> bool:
        """A refused decode may release its entries outside the need set at its previous length
        (SEMANTICS.md section 8: the one exception to atomic failure). Returns whether it did
        exactly that (and takes the release into the model); fails the atomicity property on any
        other change of a table."""
        if step["op"] != "append" or outcome.error != "OutOfBlocks":
            return False
        rid = step["request_id"]
        req = self.live.get(rid)
        if req is None:
            return False
        tables = self._observed(obs)
        got = tables.get(rid)
        if got is None or got == req.tables:
            return False
        n = len(req.tokens)
        atomic = self.names.atomic
        for g, (old, new) in enumerate(zip(req.tables, got)):
            for j, (a, b) in enumerate(zip(old, new)):
                if a != b and not (b is None and j not in need_set(self.groups[g], n)):
                    self.fail(
                        atomic,
                        f"{describe_step(step)} raised OutOfBlocks but changed group {g} entry {j} "
                        f"of request {rid!r}: {a} -> {b}",
                    )
            if len(old) != len(new):
                self.fail(atomic, f"{describe_step(step)} raised OutOfBlocks but resized a table of {rid!r}")
        for r, t in tables.items():
            if r != rid and r in self.live and t != self.live[r].tables:
                self.fail(
                    atomic, f"{describe_step(step)} raised OutOfBlocks but changed request {r!r}'s tables"
                )
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
        """``OutOfBlocks`` although the free blocks cover what the operation needs: every entry of
        every group, and a copy per group of a decode — for the one group exactly the copy of a
        shared partial last block, for hybrid groups at most one per group and one state per
        Mamba group (what any engine could need)."""
        free = int(before["num_free_blocks"])
        if step["op"] == "allocate":
            n = len(step["tokens"])
            need = sum(num_entries(g, n) for g in self.groups)
        elif step["op"] == "append":
            req = self.live[step["request_id"]]
            old, new = len(req.tokens), len(req.tokens) + len(step["tokens"])
            need = sum(num_entries(g, new) - num_entries(g, old) for g in self.groups)
            need += len(self.groups) if self.hybrid else self._copy_needed(step["request_id"], req)
        else:
            need = sum(1 for g in self.groups if g.kind == "mamba")
        if need <= free:
            bound = "at most " if self.hybrid else ""
            self.fail(
                "progress",
                f"{what} raised OutOfBlocks although it needs {bound}{need} blocks and {free} are free",
            )

    def _copy_needed(self, rid: RequestId, req: Req) -> int:
        """1 when the one group's decode must copy its partial last block (another request holds it)."""
        if not len(req.tokens) % self.B:
            return 0
        last = req.tables[0][-1]
        return int(any(last in r.tables[0] for other, r in self.live.items() if other != rid))

    # ----- successful operations ----------------------------------------------------------------

    def _apply_free(self, request_id: RequestId) -> None:
        del self.live[request_id]
        self.published |= self.pending.pop(request_id, set())
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
        self._check_boundary(hit, num_tokens, what, admission=False)

    def _apply_reset(self, what: str) -> None:
        if self.live:
            prop = H6 if self.hybrid else self.names.held
            self.fail(prop, f"{what} returned True while {len(self.live)} requests hold blocks")
        self.published.clear()
        self.seen.clear()
        self.attention_seen.clear()
        self.engine_pops = 0

    def _apply_allocate(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid = step["request_id"]
        tokens = list(step["tokens"])
        n = len(tokens)
        hit = int(result["num_computed_tokens"])
        tables = self._result_tables(result)
        self._check_boundary(hit, n, what, admission=True)
        self._check_shape(tables, n, what)
        req = self._new_req(tokens, extras_from_json(step.get("extras")), tables)
        req.hit = hit
        self._check_own_blocks(tables, hit, what)
        self._check_hit(req, hit, what)
        # the one group may hit into a block (section 6): its own write there is a copy-on-write
        kept = {(g, hit // group.block_size) for g, group in enumerate(self.groups) if hit % group.block_size}
        self._write_positions(holders, rid, req, hit, kept, "a block it hit")
        self._write_states(holders, rid, req, None, hit)
        self._write_checkpoints(holders, rid, req, result, hit, what)
        self.live[rid] = req
        self.engine_pops += self._popped(tables, hit) + len(result.get("checkpoints", []))
        if self.hybrid:
            self._remember(req, rid, admission=True, hit=hit)
        else:
            self.published |= self._block_idents(req, 0, n // self.B)
        self._given(req, hit // self.B)

    def _check_hit(self, req: Req, hit: int, what: str) -> None:
        """H1 / ``hit-content``: every entry in a group's need set at the hit is held and holds
        this prefix's content, and so does every entry the admission holds below the hit."""
        sound = self.names.sound
        for g, group in enumerate(self.groups):
            table = req.tables[g]
            needed = need_set(group, hit)
            for j in needed:
                b = table[j]
                if b is None:
                    self.fail(
                        sound,
                        f"{what} hit {hit} tokens but holds no block for group {g}'s entry {j}, "
                        "which the next step reads",
                    )
                self._check_entry(req, g, j, b, sound, f"{what} hit {hit} tokens", upto=hit)
            for j in range(hit // group.block_size):
                b = table[j]
                if b is not None and j not in needed:
                    self._check_entry(req, g, j, b, sound, f"{what}: an entry it holds below the hit")

    def _apply_append(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid, req, old_len, copies, new_tokens = self._appending(step, result)
        old = req.tables
        tables = self._result_tables(result)
        self._check_shape(tables, old_len + len(new_tokens), what)
        kept = self._check_kept(old, tables, old_len, dict(copies), what)
        for src, dst in copies:
            if not (0 <= src < self.N and 0 <= dst < self.N):
                self.fail(
                    self.names.accounting, f"{what} reported copy ({src}, {dst}) outside 0..{self.N - 1}"
                )
            data = self.data.get(src)
            if data is not None:
                for s, ident in sorted(data.slots.items()):
                    why = "a copy-on-write destination"
                    self._write_slot(holders, rid, dst, data.group, s, ident, None, why)
        req.tables = tables
        req.tokens.extend(new_tokens)
        self._extend_idents(req, new_tokens)
        self._write_positions(holders, rid, req, old_len, kept, "its shared last block")
        self._write_states(holders, rid, req, old, old_len)
        self._write_checkpoints(holders, rid, req, result, old_len, what)
        grown = sum(len(t) for t in tables) - sum(len(t) for t in old)
        self.engine_pops += max(grown, 0) + len(copies) + len(result.get("checkpoints", []))
        full = old_len // self.B
        self._given(req, full)
        if self.hybrid:
            self._remember(req, rid, admission=False)
            return
        filled = self._block_idents(req, full, len(req.tokens) // self.B)
        if self.caps.publish_decode == "append":
            self.published |= filled
        else:
            self.pending.setdefault(rid, set()).update(filled)

    def _check_kept(
        self, old: Tables, tables: Tables, old_len: int, copied: dict[int, int], what: str
    ) -> set[tuple[int, int]]:
        """A decode keeps every entry it reads: the one group its full blocks (a replaced partial
        last block shows as a missing copy-on-write copy), hybrid groups every entry inside the
        need set at the previous length, up to a copy-on-write of the last one; entries outside it
        may be released (``None``). Returns the ``(group, entry)`` of a kept partial last block."""
        kept: set[tuple[int, int]] = set()
        for g, group in enumerate(self.groups):
            for j, (a, b) in enumerate(zip(old[g], tables[g])):
                if a == b:
                    if a is not None and j == len(old[g]) - 1 and old_len % group.block_size:
                        kept.add((g, j))
                    continue
                if not self.hybrid:
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
        full = old_len // self.B
        if not self.hybrid and tables[0][:full] != old[0][:full]:
            self.fail(self.names.held, f"{what} replaced full blocks: table {old[0]} -> {tables[0]}")
        return kept

    def _apply_fork(self, step: Step, result: dict[str, Json], obs: Observation, what: str) -> None:
        holders = self._holders()
        parent = self.live[step["parent_id"]]
        child_id = step["child_id"]
        tables = self._observed(obs).get(child_id)
        if tables is None:
            if self.hybrid:
                self.fail(H6, f"{what}: the child is not live")
            tables = [[]]
        child = Req(
            list(parent.tokens), parent.extras, [list(t) for t in tables], list(parent.idents), parent.hit,
            max(parent.inherited, len(parent.tokens)),
        )
        self._check_shape(child.tables, len(child.tokens), what)
        self.live[child_id] = child
        if step["parent_id"] in self.pending:
            self.pending[child_id] = set(self.pending[step["parent_id"]])
        copies = [tuple(c) for c in result.get("copies", [])] if self.hybrid else []
        for src, dst in copies:
            data = self.data.get(src)
            if data is None or data.state is None:
                self.fail(H4, f"{what} copied block {src}, which holds no recurrent state")
            self._write_state(holders, child_id, dst, data.group, data.state, "the copied running state")
        for g, group in enumerate(self.groups):
            if group.kind == "mamba" and child.tables[g][-1] == parent.tables[g][-1]:
                self.fail(
                    H4,
                    f"{what}: parent and child share the running state block {parent.tables[g][-1]} "
                    f"of group {g} (a running state is never shared; fork must copy it)",
                )
        self.engine_pops += len(copies)

    # ----- after every step ---------------------------------------------------------------------

    def _shown(self, tables: Tables | None) -> Json:
        """Tables as the observation shows them (the one group: its one table)."""
        if tables is None or not self.names.one_table:
            return tables
        return tables[0]

    def _accepted(self, req: Req, got: Tables) -> bool:
        """A canonicalized duplicate of the one group (SEMANTICS section 6): an entry replaced by
        another block holding the same content. The judge takes the new table over."""
        if self.hybrid or self._refusal(req, list(got[0])) is not None:
            return False
        req.tables = [list(got[0])]
        return True

    def _changed_tables(self, rid: RequestId, req: Req, got: Tables | None, touched: bool, what: str) -> str:
        if self.hybrid:
            return f"after {what}, block_tables({rid!r}) = {got}, but the judge has {req.tables}"
        shown, mine = self._shown(got), req.tables[0]
        why = "" if got is None else self._refusal(req, list(got[0])) or ""
        if touched:
            return f"after {what}, block_table({rid!r}) = {shown}, but the operation returned {mine}" + why
        return f"{what} changed the block_table of request {rid!r}: {mine} -> {shown}" + why

    def _refusal(self, req: Req, table: list[int | None]) -> str | None:
        """Why replacing the one group's table by ``table`` is not a canonicalization (SEMANTICS
        section 6 allows a full block replaced only by one holding the same content and extras):
        the first replaced entry and what differs in its new block, ``""`` when the shapes alone
        rule it out (which the message already shows); ``None`` when it is one."""
        mine = req.tables[0]
        if len(table) != len(mine) or any(b is None or not 0 <= b < self.N for b in table):
            return ""
        for j, (old, new) in enumerate(zip(mine, table)):
            if old == new:
                continue
            assert new is not None
            if (j + 1) * self.B > len(req.tokens):
                return f"; entry {j} (block {old} -> {new}) is not a full block, so it cannot be swapped"
            slots = self._slots_of(new, 0)
            for s in range(self.B):
                p = j * self.B + s
                if slots[s] != req.idents[p]:
                    return (
                        f"; a rewrite is allowed only onto a block of the same content and extras, and "
                        f"block {new} (entry {j}, position {p}) differs: "
                        + self.differs(slots[s], req.idents[p], j * self.B, f"block {new}")
                    )
        if len(set(table)) != len(table):
            return "; the new table holds a block twice"
        return None

    def _check_contents(self, step: Step) -> None:
        """Every live request holds its need set (the one group: every entry), with its own
        content (H3 / ``held-blocks``); every other held entry still holds its own content (H1)."""
        mine = (step.get("request_id"), step.get("child_id")) if step["op"] in ("append", "fork") else ()
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
                    if group.kind == "mamba" and j not in needed:
                        continue  # a superseded state: never read again
                    if self.hybrid:
                        self._check_entry(req, g, j, b, H3 if j in needed else H1, f"request {rid!r}")
                    else:
                        self._check_read(step, rid, req, j, b, rid in mine)

    def _check_read(self, step: Step, rid: RequestId, req: Req, j: int, b: int, mine: bool) -> None:
        """The one group: entry ``j`` of a live request reads its own positions. When the step
        just decoded or forked this request, a wrong slot is a missing copy-on-write copy."""
        data = self.data.get(b)
        slots = data.slots if data is not None and data.group == 0 else {}
        for s in range(min(self.B, len(req.tokens) - j * self.B)):
            p = j * self.B + s
            got = slots.get(s)
            if got == req.idents[p]:
                continue
            if mine:
                self.fail(
                    "cow-isolation",
                    f"after {describe_step(step)}, request {rid!r} no longer reads its own position {p} "
                    f"in block {b}: a copy-on-write copy is missing",
                )
            self.fail(
                self.names.held,
                f"after {describe_step(step)}, request {rid!r} reads other content at its position {p} "
                f"(block {b} was overwritten while held): "
                + self.differs(got, req.idents[p], p - s, f"block {b}"),
            )

    # ----- comparisons with the spec --------------------------------------------------------

    def published_hit(self, step: Step) -> int:
        """The one group: the longest hit (tokens) the engine can owe ``step`` from what it has
        published: the leading blocks whose content was published, capped at ``(n - 1) // B``."""
        probe = self._new_req(list(step["tokens"]), extras_from_json(step.get("extras")), [])
        hits, most = 0, (len(probe.tokens) - 1) // self.B
        while hits < most and probe.idents[(hits + 1) * self.B - 1] in self.published:
            hits += 1
        return hits * self.B

    def _owed(self, step: Step) -> int:
        """The hit ``maximal`` may ask: for the one group what the engine has published, for hybrid
        groups what the claimed retention promises (:class:`RetentionAdequacy`)."""
        return super()._owed(step) if self.hybrid else self.published_hit(step)

    def _check_promised(
        self, step: Step, outcome: Outcome, exp: dict[str, Json], what: str, owed: int
    ) -> None:
        if self.hybrid:  # the one group's promise is part of maximal-hits (``_compare_maximal``)
            super()._check_promised(step, outcome, exp, what, owed)

    def _compare_maximal(self, step: Step, got: int, exp: dict[str, Json], what: str, owed: int) -> None:
        """Without eviction pressure, a hit at least as long as the spec's — for the one group
        capped at what the engine itself has published (``owed``), for hybrid groups only for an
        engine whose retention, same-step and publication claims are the spec's. Pressure counts
        blocks taken for new content since creation or reset, by the spec and by the engine (which
        may have taken more: shorter hits of its own, or publication after compute); while neither
        took more than ``num_blocks``, a never-used block was always at hand."""
        want = int(exp["result"]["num_computed_tokens"])
        bar = want if self.hybrid else min(want, owed)
        spec_pops = int(exp.get("pops", 0))
        if not self.maximal_hits or self._pressure(exp) or got >= bar:
            return
        self.fail(
            "maximal-hits",
            f"{what} hit {got} tokens; the spec hits {want}, and no block ever had to be reused "
            f"({spec_pops} blocks taken for new content by the spec, {self.engine_pops} by the engine, "
            f"{self.N} in the pool)",
        )

    def _compare_result(self, op: str, exp_res: dict[str, Json], res: dict[str, Json], what: str) -> None:
        """The copies, tables and checkpoints a successful operation returned, up to the renaming."""
        if "copies" in exp_res:
            exp_c = [b for pair in exp_res["copies"] for b in pair]
            got_c = [b for pair in res.get("copies", []) for b in pair]
            self._same_seq(exp_c, got_c, "policy-sharing", f"{what}: copy-on-write copies")
        name = self.names.table_name
        if name in exp_res:
            self._same_tables(exp_res[name], res[name], f"{what}: {name}")
        if "checkpoints" in exp_res:
            spec, engine = exp_res["checkpoints"], res.get("checkpoints", [])
            if [c[:2] for c in spec] != [c[:2] for c in engine]:
                self.fail("policy-sharing", f"{what}: checkpoints engine {engine}, spec {spec}")
            ids = [c[2] for c in spec], [c[2] for c in engine]
            self._same_seq(*ids, "policy-sharing", f"{what}: checkpoints")

    def _same_tables(self, spec: Json, engine: Json, what: str) -> None:
        if self.names.one_table:
            self._same_seq(spec, engine, "policy-sharing", what)
            return
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


def judge_for(config: CacheConfig, level: str, disabled: frozenset[str], caps: Capabilities) -> Judge:
    """The judge of a run (one class whatever the groups; kept for callers that pick by config)."""
    return Judge(config, level, disabled, caps)


"""The judge's skeleton, whatever its KV-cache groups.

A run is judged step by step: :meth:`JudgeBase.start` checks the fresh engine, :meth:`JudgeBase.check`
each operation — crashes and error kinds on input alone (:func:`first_error`), a failed operation's
atomicity, a successful one taken into the judge's model, then after every step the tables, the
content every live request reads, held blocks and pool accounting, the event stream, and above
``core`` the comparison with the spec's expectation. The identities of what was written (a token
with its whole history) and the renaming of physical ids are shared as well.

What depends on the groups is data: the property names and the observation's shape
(:class:`~pagedprefix.conformance.judging.properties.Names`: ``ONE_GROUP`` for the one
full-attention group of SEMANTICS.md sections 1-7, ``HYBRID_GROUPS`` for section 8), and the
per-group model and operation rules of :class:`~pagedprefix.conformance.judging.judge.Judge`
that the hooks below name.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pagedprefix.spec import (
    CacheConfig,
    Extras,
    PrefixCacheError,
    RequestId,
    check_extras,
    check_request_id,
    check_tokens,
)
from pagedprefix.spec.extras import canonical_mm_items

from ..protocol.codec import Json, error_kind, extras_from_json
from .driver import Observation, Outcome, Step, describe_step
from .event_check import EventChecker, Keyed
from .properties import Names, Violation, at_least


class Lost(Exception):
    """A violation of a property the caller disabled: the judge's model no longer matches the
    engine, so the run cannot go on meaningfully (the stateful runner discards the example)."""

    def __init__(self, prop: str, message: str) -> None:
        self.prop = prop
        super().__init__(f"[{prop}] {message}")


class Renaming:
    """A partial bijection spec block id <-> engine block id, built as pairs are first seen."""

    def __init__(self) -> None:
        self.s2e: dict[int, int] = {}
        self.e2s: dict[int, int] = {}

    def pair(self, s: int, e: int) -> bool:
        """Record ``s <-> e``; False if it contradicts an earlier pair."""
        if s in self.s2e:
            return self.s2e[s] == e
        if e in self.e2s:
            return False
        self.s2e[s] = e
        self.e2s[e] = s
        return True


class _Kind(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


def first_error(step: Step, live: Container[Any]) -> str | None:
    """The error kind the spec's precedence gives ``step`` on input alone (request id, liveness,
    tokens, extras) — everything but capacity. ``None`` when the input is valid."""
    op = step["op"]

    def new_id(rid: Any) -> None:
        check_request_id(rid)
        if rid in live:
            raise _Kind("DuplicateRequest")

    def live_id(rid: Any) -> None:
        check_request_id(rid)
        if rid not in live:
            raise _Kind("UnknownRequest")

    try:
        if op == "allocate":
            new_id(step["request_id"])
            tokens = check_tokens(step["tokens"])
            check_extras(extras_from_json(step.get("extras")), len(tokens))
        elif op == "append":
            live_id(step["request_id"])
            check_tokens(step["tokens"])
        elif op == "fork":
            live_id(step["parent_id"])
            new_id(step["child_id"])
        elif op == "free":
            live_id(step["request_id"])
        elif op == "lookup":
            tokens = check_tokens(step["tokens"])
            check_extras(extras_from_json(step.get("extras")), len(tokens))
    except _Kind as k:
        return k.kind
    except PrefixCacheError as exc:
        return error_kind(exc)
    return None


def _extras_text(lora: tuple[str, int] | None, salt: str) -> str:
    """The extras of an identity's root, in the steps' JSON form (``no extras`` for none)."""
    parts: dict[str, Json] = {}
    if lora is not None:
        parts["lora"] = {"id": lora[1], "name": lora[0]}
    if salt:
        parts["cache_salt"] = salt
    return json.dumps(parts, sort_keys=True) if parts else "no extras"


def _items_text(items: tuple[tuple[str, int], ...]) -> str:
    """Multimodal items starting at one position, as ``identifier (length n)``; ``none``."""
    return ", ".join(f"{ident!r} (length {n})" for ident, n in items) or "none"


Tables = list[list[int | None]]
"""A request's tables, one per group (``None``: an entry not held)."""


@dataclass
class Req:
    """A live request as the judge knows it: its tokens, extras, one table per group and the
    identity of each position."""

    tokens: list[int]
    extras: Extras
    tables: Tables
    idents: list[int] = field(default_factory=list)
    hit: int = 0
    """The admission's hit: entries it skipped were never computed by this request."""
    inherited: int = 0
    """Tokens a fork child got from its parent: their states were keyed by the parent, not by the
    child (dropped with the parent's pending keys when it is freed before ``new_step``)."""


class JudgeBase:
    """The judge of one run at one profile level, for any list of groups; ``names`` are what the
    config calls its properties and observations. The per-group model and the rule of each
    operation are the hooks below (:class:`~pagedprefix.conformance.judging.judge.Judge`).
    ``disabled``: properties whose violation raises :class:`Lost` instead of :class:`Violation`
    (the stateful runner uses it to look past a known failure)."""

    def __init__(self, config: CacheConfig, level: str, disabled: frozenset[str], names: Names) -> None:
        self.config = config
        self.names = names
        self.B = config.block_size
        self.N = config.num_blocks
        self.level = level
        self.policy = at_least(level, "lru")
        self.maximal = at_least(level, "maximal")
        self.exact = level == "exact"
        self.disabled = disabled
        self.events: EventChecker | None = None
        self._keyed: Keyed | None = None
        self.engine_pops = 0
        self.live: dict[RequestId, Req] = {}
        self.renaming = Renaming()
        self.prev: Observation = {}
        self._interned: dict[tuple[Any, ...], int] = {}
        self._keys: list[tuple[Any, ...]] = []

    # ----- reporting ------------------------------------------------------------------------

    def fail(self, prop: str, message: str, detail: str = "") -> NoReturn:
        """Raise the violation of ``prop`` (``Lost`` when it is disabled)."""
        if prop in self.disabled:
            raise Lost(prop, message)
        raise Violation(prop, message, detail)

    # ----- identities -----------------------------------------------------------------------

    def _intern(self, key: tuple[Any, ...]) -> int:
        ident = self._interned.get(key)
        if ident is None:
            ident = len(self._interned)
            self._interned[key] = ident
            self._keys.append(key)
        return ident

    def _chain(self, ident: int) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        """The root key ``("root", lora, salt)`` of an identity and its per-position keys
        ``(prev, token, starting multimodal items, prompt embedding)``, position 0 first."""
        chain: list[tuple[Any, ...]] = []
        key = self._keys[ident]
        while key[0] != "root":
            chain.append(key)
            key = self._keys[key[0]]
        chain.reverse()
        return key, chain

    def differs(
        self,
        held: int | None,
        want: int,
        first: int = 0,
        held_name: str = "the block",
        want_name: str = "this request",
    ) -> str:
        """Which part of the content differs when a slot holds identity ``held`` (the content
        ``held_name`` has there) where ``want_name`` reads ``want``: the tokens (the first
        position they differ at; before ``first``, the start of the block read, the block's own
        tokens are equal and its parent chain differs), a multimodal item or prompt embedding at
        a position, the position itself, or, with every token equal, only the extras (each
        side's LoRA and ``cache_salt`` named). Reads the judge's model of what each slot holds."""
        if held is None:
            return "it was never written"
        (_, h_lora, h_salt), h = self._chain(held)
        (_, w_lora, w_salt), w = self._chain(want)
        sides = f"in {held_name}, {{}} in {want_name}"
        own_equal = len(h) == len(w) and all(h[k][1:] == w[k][1:] for k in range(first, len(w)))
        for i, (a, b) in enumerate(zip(h, w)):
            parent = ""
            if i < first:
                own = "are equal" if own_equal else "differ too"
                parent = f" (the parent chain differs: the block's own tokens {own})"
            if a[1] != b[1]:
                return f"the tokens differ at position {i}: {a[1]} {sides.format(b[1])}{parent}"
            if a[2] != b[2]:
                return (
                    f"the multimodal items starting at position {i} differ: {_items_text(a[2])} "
                    f"{sides.format(_items_text(b[2]))}{parent}"
                )
            if a[3] != b[3]:
                return f"the prompt embedding at position {i} differs{parent}"
        if len(h) != len(w):
            return (
                f"the tokens agree, but {held_name} holds the KV of position {len(h) - 1} where "
                f"{want_name} reads position {len(w) - 1}"
            )
        return (
            f"the tokens are equal, only the extras differ: {_extras_text(h_lora, h_salt)} "
            + sides.format(_extras_text(w_lora, w_salt))
        )

    def _extend_idents(self, req: Req, new_tokens: list[int]) -> None:
        extras = req.extras
        if req.idents:
            prev = req.idents[-1]
        else:
            lora = None if extras.lora is None else (extras.lora.name, extras.lora.lora_id)
            prev = self._intern(("root", lora, extras.cache_salt))
        items = canonical_mm_items(extras.mm_items)
        embeds = extras.prompt_embeds
        embedded = dict(zip(embeds.positions, embeds.data)) if embeds is not None else {}
        for token in new_tokens:
            p = len(req.idents)
            starting = tuple((m.identifier, m.length) for m in items if m.start == p)
            prev = self._intern((prev, token, starting, embedded.get(p)))
            req.idents.append(prev)

    # ----- the run --------------------------------------------------------------------------

    def start(self, obs: Observation, expected: Observation | None) -> None:
        """Check the fresh engine's state (everything free) and pair it with the spec's."""
        self.prev = obs
        self._check_accounting(obs)
        if self.events is not None:
            self.events.check(
                "the engine's creation", obs.get("events"), obs.get("cached_keys"),
                failed=False, reset=False, keyed=None,
            )
        if expected is not None and self.policy:
            self._compare_state(obs, expected, "creation")

    def check(
        self,
        step: Step,
        outcome: Outcome,
        obs: Observation,
        expected: dict[str, Json] | None,
        leaked_id: bool = False,
    ) -> None:
        """Judge one step. ``leaked_id``: a failed allocate/fork left its new id live."""
        before = self.prev
        op = step["op"]
        what = describe_step(step)
        self._keyed = None
        if outcome.crash is not None:
            self.fail("engine-errors", f"{what} crashed: {outcome.crash}", outcome.trace)
        want = first_error(step, self.live)
        owed = self._owed(step) if want is None and op in ("allocate", "lookup") else 0
        if not outcome.ok:
            self._check_failure(step, outcome, obs, before, want, leaked_id, what)
        else:
            if want is not None:
                self.fail("error-kinds", f"{what} succeeded; the spec raises {want}")
            self._apply(step, outcome, obs, what)
        self._check_tables(step, obs, what)
        self._check_contents(step)
        self._check_held(obs)
        self._check_accounting(obs)
        if self.events is not None:
            self._check_events(step, outcome, obs, what)
        if expected is not None:
            self._compare(step, outcome, obs, expected, what, owed)
        self.prev = obs

    # ----- the per-group model (hooks) ------------------------------------------------------

    def _owed(self, step: Step) -> int:
        """The hit (tokens) profile ``maximal`` may ask of an admission or lookup ``step`` from
        what the engine has kept."""
        raise NotImplementedError

    def _apply(self, step: Step, outcome: Outcome, obs: Observation, what: str) -> None:
        """Take a successful operation into the judge's model, checking its core properties: one
        hook per verb (a ``reset`` only when it did reset); what a block holds is the family's."""
        result = outcome.result or {}
        match step["op"]:
            case "allocate":
                self._apply_allocate(step, result, what)
            case "append":
                self._apply_append(step, result, what)
            case "fork":
                self._apply_fork(step, result, obs, what)
            case "free":
                self._apply_free(step["request_id"])
            case "lookup":
                self._apply_lookup(int(result["num_computed_tokens"]), len(step["tokens"]), what)
            case "reset" if result["reset"]:
                self._apply_reset(what)
            case "new_step":
                self._apply_new_step()

    def _apply_allocate(self, step: Step, result: dict[str, Json], what: str) -> None:
        raise NotImplementedError

    def _appending(
        self, step: Step, result: dict[str, Json]
    ) -> tuple[RequestId, Req, int, list[tuple[Any, ...]], list[int]]:
        """An ``append``'s request id and request (before the step), its length in tokens before the
        step, the ``(src, dst)`` copy-on-write copies the engine reported and the appended tokens."""
        rid = step["request_id"]
        req = self.live[rid]
        copies = [tuple(c) for c in result["copies"]]
        return rid, req, len(req.tokens), copies, list(step["tokens"])

    def _apply_append(self, step: Step, result: dict[str, Json], what: str) -> None:
        raise NotImplementedError

    def _apply_fork(self, step: Step, result: dict[str, Json], obs: Observation, what: str) -> None:
        raise NotImplementedError

    def _apply_free(self, request_id: RequestId) -> None:
        raise NotImplementedError

    def _apply_lookup(self, hit: int, num_tokens: int, what: str) -> None:
        """A lookup's hit of ``hit`` tokens for a ``num_tokens``-token prompt."""
        raise NotImplementedError

    def _apply_reset(self, what: str) -> None:
        """A ``reset_prefix_cache`` that returned True."""
        raise NotImplementedError

    def _apply_new_step(self) -> None:
        """A scheduler step boundary: nothing to record unless the family publishes at steps."""

    def _check_tables(self, step: Step, obs: Observation, what: str) -> None:
        """Every live request's tables must be as the operations left them, except a change the
        judge accepts (:meth:`_accepted`): otherwise the accounting property for a request the step
        touched (the engine's observation contradicts what the step returned) and the held-block one
        for any other (the step changed a request it had no business with)."""
        reported = self._observed(obs)
        touched = [step.get("request_id"), step.get("child_id")]
        for rid, req in self.live.items():
            got = reported.get(rid)
            if got == req.tables or (got is not None and self._accepted(req, got)):
                continue
            prop = self.names.accounting if rid in touched else self.names.held
            self.fail(prop, self._changed_tables(rid, req, got, rid in touched, what))

    def _observed(self, obs: Observation) -> dict[RequestId, Tables]:
        """The live requests' tables the engine reports, one table per group."""
        if self.names.one_table:
            return {rid: [t] for rid, t in obs[self.names.tables]}
        return {rid: t for rid, t in obs[self.names.tables]}

    def _accepted(self, req: Req, got: Tables) -> bool:
        """Whether a reported change of the request's tables is allowed (and taken over); none is."""
        return False

    def _changed_tables(
        self, rid: RequestId, req: Req, got: Tables | None, touched: bool, what: str
    ) -> str:
        """The message of a reported table (``None``: the request is missing) that is not the judge's."""
        raise NotImplementedError

    def _check_contents(self, step: Step) -> None:
        """Every live request reads its own content through its tables."""
        raise NotImplementedError

    def _check_progress(self, step: Step, before: Observation, what: str) -> None:
        """``OutOfBlocks`` only when the free blocks could not cover the operation."""
        raise NotImplementedError

    def _entries(self, req: Req) -> Iterator[tuple[int, int, int]]:
        """The held entries ``(group, entry, block)`` of a live request."""
        raise NotImplementedError

    def _released_on_refusal(self, step: Step, outcome: Outcome, obs: Observation) -> bool:
        """Whether a refused operation made the one allowed change (and took it into the model)."""
        return False

    def _check_deferral(self, step: Step, what: str) -> None:
        """A ``Deferred`` admission is owed (only where ``ALLOWED_ERRORS`` lets it through)."""

    def _check_promised(
        self, step: Step, outcome: Outcome, exp: dict[str, Json], what: str, owed: int
    ) -> None:
        """At ``maximal`` and above: a hit at least the ``owed`` one, where that is promised."""

    def _compare_maximal(self, step: Step, got: int, exp: dict[str, Json], what: str, owed: int) -> None:
        """Below ``lru``: a successful hit ``got`` against the spec's."""
        raise NotImplementedError

    def _compare_result(self, op: str, exp_res: dict[str, Json], res: dict[str, Json], what: str) -> None:
        """At ``lru``: the tables and copies a successful operation returned."""
        raise NotImplementedError

    def _same_tables(self, spec: Json, engine: Json, what: str) -> None:
        """At ``lru``: one request's tables equal up to the renaming."""
        raise NotImplementedError

    # ----- failures -------------------------------------------------------------------------

    def _check_failure(
        self,
        step: Step,
        outcome: Outcome,
        obs: Observation,
        before: Observation,
        want: str | None,
        leaked_id: bool,
        what: str,
    ) -> None:
        """The right error kind, and nothing changed (but the one change the model allows)."""
        op = step["op"]
        assert outcome.error is not None
        if want is not None and outcome.error != want:
            self.fail("error-kinds", f"{what} raised {outcome.error}; the spec raises {want}")
        if want is None:
            if outcome.error not in self.names.allowed_errors.get(op, ()):
                self.fail("error-kinds", f"{what} raised {outcome.error} on valid input")
            if outcome.error == "Deferred":
                self._check_deferral(step, what)
        released = self._released_on_refusal(step, outcome, obs)
        fields = () if released else self.names.state_fields
        changed = [f for f in fields if f in obs and obs.get(f) != before.get(f)]
        if changed:
            self.fail(
                self.names.atomic,
                f"{what} raised {outcome.error} but changed {', '.join(changed)}: "
                + "; ".join(f"{f} {before.get(f)} -> {obs.get(f)}" for f in changed),
            )
        if leaked_id:
            self.fail(self.names.atomic, f"{what} raised {outcome.error} but left the new request live")
        if outcome.error == "OutOfBlocks":
            self._check_progress(step, before, what)

    # ----- after every step -----------------------------------------------------------------

    def _check_held(self, obs: Observation) -> None:
        queue = obs.get("free_blocks")
        queued = set(queue or [])
        refs = obs.get("ref_cnt")
        for rid, req in self.live.items():
            for _, _, b in self._entries(req):
                if b in queued:
                    self.fail(self.names.held, self.names.in_queue.format(b=b, rid=rid, queue=queue))
                if refs is not None and refs[b] <= 0:
                    self.fail(
                        self.names.held, f"block {b} is held by request {rid!r} but has ref_cnt {refs[b]}"
                    )

    def _check_accounting(self, obs: Observation) -> None:
        uses: Counter[int] = Counter()
        group_of: dict[int, int] = {}
        for req in self.live.values():
            for g, _, b in self._entries(req):
                uses[b] += 1
                if group_of.setdefault(b, g) != g:
                    self.fail(
                        self.names.accounting, f"block {b} is in group {group_of[b]}'s and group {g}'s tables"
                    )
        free = int(obs["num_free_blocks"])
        if free + len(uses) != self.N:
            self.fail(
                self.names.accounting,
                f"{free} free blocks + {len(uses)} held blocks != {self.N}"
                + ("" if self.live else " (no request is live: every block must be free)"),
            )
        refs = obs.get("ref_cnt")
        if refs is not None:
            for b in range(self.N):
                if refs[b] != uses.get(b, 0):
                    self.fail(
                        self.names.accounting,
                        f"ref_cnt({b}) = {refs[b]} but {uses.get(b, 0)} table entries point at it",
                    )
        queue = obs.get("free_blocks")
        if queue is not None:
            if len(queue) != free or len(set(queue)) != len(queue):
                self.fail(
                    self.names.accounting,
                    f"free queue {queue} does not hold num_free_blocks = {free} distinct blocks",
                )
            unused = set(range(self.N)) - set(uses)
            if set(queue) != unused:
                message = self.names.not_unreferenced.format(queue=queue, unused=sorted(unused))
                self.fail(self.names.accounting, message)

    def _check_events(self, step: Step, outcome: Outcome, obs: Observation, what: str) -> None:
        assert self.events is not None
        reset = bool(outcome.ok and step["op"] == "reset" and (outcome.result or {}).get("reset") is True)
        self.events.check(
            what, obs.get("events"), obs.get("cached_keys"),
            failed=not outcome.ok, reset=reset, keyed=self._keyed,
        )

    # ----- comparisons with the spec --------------------------------------------------------

    def _pressure(self, exp: dict[str, Json]) -> bool:
        """Whether some block may have had to be reused: the spec or the engine has taken more than
        ``num_blocks`` blocks for new content since creation or reset."""
        return max(int(exp.get("pops", 0)), self.engine_pops) > self.N

    def _compare(
        self, step: Step, outcome: Outcome, obs: Observation, exp: dict[str, Json], what: str, owed: int
    ) -> None:
        """Compare with the spec's expectation ``exp`` at the profile's level. ``owed``: the hit
        the engine's own publications or retention allow (:meth:`_owed`)."""
        self._compare_keys(obs, exp)
        if not self.maximal:
            return
        exp_err = exp.get("error")
        exp_res = exp.get("result") or {}
        res = outcome.result or {}
        op = step["op"]
        self._check_promised(step, outcome, exp, what, owed)
        if not self.policy:
            if outcome.ok and exp_err is None and op in ("allocate", "lookup"):
                self._compare_maximal(step, res["num_computed_tokens"], exp, what, owed)
            return
        if outcome.error != exp_err:
            prop = "policy-sharing" if "OutOfBlocks" in (outcome.error, exp_err) else "error-kinds"
            self.fail(prop, f"{what}: engine {outcome.describe()}, spec {exp_err or 'succeeds'}")
        if outcome.ok:
            if op in ("allocate", "lookup") and res["num_computed_tokens"] != exp_res["num_computed_tokens"]:
                self.fail(
                    "policy-hits",
                    f"{what} hit {res['num_computed_tokens']} tokens; "
                    f"the spec hits {exp_res['num_computed_tokens']}",
                )
            if op == "reset" and res["reset"] != exp_res["reset"]:
                self.fail(
                    "policy-hits", f"{what} returned {res['reset']}; the spec returns {exp_res['reset']}"
                )
            self._compare_result(op, exp_res, res, what)
        self._compare_state(obs, exp, what)

    def _same_seq(self, spec_ids: list[int], engine_ids: list[int], prop: str, what: str) -> None:
        if len(spec_ids) != len(engine_ids):
            self.fail(prop, f"{what}: engine {engine_ids}, spec {spec_ids}")
        for s, e in zip(spec_ids, engine_ids):
            if not self.renaming.pair(s, e):
                self.fail(
                    prop,
                    f"{what}: engine {engine_ids}, spec {spec_ids} (no consistent renaming: spec block {s} "
                    f"was engine block {self.renaming.s2e.get(s)}, engine block {e} was spec block "
                    f"{self.renaming.e2s.get(e)})",
                )
        if self.exact and list(spec_ids) != list(engine_ids):
            self.fail("exact-ids", f"{what}: engine {engine_ids}, spec {spec_ids}")

    def _compare_state(self, obs: Observation, exp: Observation, what: str) -> None:
        if obs["num_free_blocks"] != exp["num_free_blocks"]:
            self.fail(
                "policy-sharing",
                f"after {what}: {obs['num_free_blocks']} free blocks; the spec has {exp['num_free_blocks']}",
            )
        exp_tables = {self._rid_key(rid): t for rid, t in exp.get(self.names.tables, [])}
        for rid, tables in obs[self.names.tables]:
            want = exp_tables.get(self._rid_key(rid))
            if want is None:
                self.fail(
                    "policy-sharing", f"after {what}: request {rid!r} is live; the spec has no such request"
                )
            self._same_tables(want, tables, f"after {what}: {self.names.table_name}({rid!r})")
        if "free_blocks" in obs and "free_blocks" in exp:
            self._same_seq(
                exp["free_blocks"], obs["free_blocks"], "policy-free-queue", f"after {what}: free queue"
            )
        if "ref_cnt" in obs and "ref_cnt" in exp:
            for s, e in sorted(self.renaming.s2e.items()):
                if obs["ref_cnt"][e] != exp["ref_cnt"][s]:
                    self.fail(
                        "policy-sharing",
                        f"after {what}: ref_cnt({e}) = {obs['ref_cnt'][e]}; "
                        f"the spec's block {s} has {exp['ref_cnt'][s]}",
                    )

    @staticmethod
    def _rid_key(rid: Json) -> tuple[bool, str]:
        return (isinstance(rid, str), repr(rid))

    def _compare_keys(self, obs: Observation, exp: dict[str, Json]) -> None:
        if "keys" not in obs or "keys" not in exp:
            return
        want = {self._rid_key(rid): k for rid, k in exp["keys"]}
        for rid, keys in obs["keys"]:
            expected = want.get(self._rid_key(rid))
            if expected is not None and keys != expected:
                self.fail("block-keys", f"keys of request {rid!r}: engine {keys}, spec {expected}")

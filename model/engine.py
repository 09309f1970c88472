"""A tiny inference engine: requests share KV blocks through the project's block manager.

:class:`Engine` ties three things together:

* a **block manager** with the API of :class:`pagedprefix.spec.SpecCache` (``allocate``, ``append``,
  ``fork``, ``free``): it decides which physical blocks hold each request's tokens, finds the cached
  prefix of a new prompt, and reports the copy-on-write copies a write needs;
* the **paged KV cache** (:class:`pagedprefix.impl.KVCache`), the only place K and V are kept;
* the **model** (:class:`.llama.Llama`), run over just the tokens that are not in the cache yet.

Admission (:meth:`Engine.add_request`) allocates the prompt and prefills only the tokens after
``num_computed_tokens``: the leading full blocks another request already computed are reused as they
are. Decoding (:meth:`Engine.decode`) appends one token to each request, executes the reported
copy-on-write copies for all layers at once (``kernels.copy_blocks``) and only then runs the forward
pass that writes the new K/V. ``execute_copies=False`` skips the copies: a deliberately broken engine
that tests use to show the copies matter.

:func:`generate` runs several prompts (admitted one after another, so later ones hit the blocks of
earlier ones) with ``n`` samples each: sample 0 is greedy, sample ``j`` is forked from it and forced to
take the ``j``-th most likely first token, and every sample then continues greedily. :func:`run_alone`
replays one sample in a fresh engine with nothing to share, and :func:`check_against_alone` compares;
:func:`check_without_sharing` reruns everything in the same batches with sharing turned off; both
checks take one :class:`Rerun` (the generation's limits and the engine it ran on).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import torch
from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, RequestId, SpecCache

from .llama import ForwardBatch, Llama

if TYPE_CHECKING:
    from pagedprefix.kernels import Backend

__all__ = [
    "MANAGERS",
    "BlockManagerLike",
    "CheckResult",
    "ContextTooLong",
    "Engine",
    "EngineStats",
    "GenerationResult",
    "ManagerFactory",
    "Prefill",
    "Rerun",
    "Sample",
    "blocks_needed_alone",
    "check_against_alone",
    "check_context",
    "check_without_sharing",
    "compare_samples",
    "generate",
    "ranked_tokens",
    "resolve_manager",
    "run_alone",
]


class AllocationLike(Protocol):
    """What ``allocate`` returns (e.g. :class:`pagedprefix.spec.Allocation`)."""

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def block_table(self) -> Sequence[int]: ...


class AppendResultLike(Protocol):
    """What ``append`` returns (e.g. :class:`pagedprefix.spec.AppendResult`)."""

    @property
    def copies(self) -> Sequence[tuple[int, int]]: ...

    @property
    def block_table(self) -> Sequence[int]: ...


class BlockManagerLike(Protocol):
    """The part of the block manager API the engine uses (``SpecCache`` and ``impl.BlockManager``)."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...
    ) -> AllocationLike: ...

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResultLike: ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None: ...

    def free(self, request_id: RequestId) -> None: ...


ManagerFactory = Callable[[CacheConfig], BlockManagerLike]
MANAGERS: tuple[str, ...] = ("auto", "impl", "spec")


def resolve_manager(name: str) -> ManagerFactory:
    """The block manager to build: ``"spec"`` (the executable spec), ``"impl"`` (the optimized
    ``pagedprefix.impl.BlockManager``) or ``"auto"`` (impl when it is installed, else spec)."""
    if name not in MANAGERS:
        raise ValueError(f"unknown block manager {name!r}; choose from {MANAGERS}")
    if name in ("auto", "impl"):
        try:
            module = importlib.import_module("pagedprefix.impl")
        except ImportError:
            module = None
        manager_class = getattr(module, "BlockManager", None)
        if manager_class is not None:
            return cast(ManagerFactory, manager_class.create)
        if name == "impl":
            raise ValueError("pagedprefix.impl.BlockManager is not available")
    spec_factory: ManagerFactory = SpecCache.create
    return spec_factory


@dataclass
class EngineStats:
    """Counters of an engine's work.

    Attributes:
        prompt_tokens: tokens of every admitted prompt.
        prefill_tokens_skipped: prompt tokens whose K/V came from shared cached blocks.
        prefill_tokens_computed: prompt tokens run through the model.
        decode_tokens: tokens appended by decode steps.
        cow_copies: copy-on-write block copies reported by the manager.
        forks: requests created by ``fork``.
    """

    prompt_tokens: int = 0
    prefill_tokens_skipped: int = 0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    cow_copies: int = 0
    forks: int = 0


@dataclass(frozen=True)
class Prefill:
    """Result of an admission: how much of the prompt was cached, and the last prompt token's logits."""

    num_computed_tokens: int
    logits: torch.Tensor


class ContextTooLong(ValueError):
    """A request that would run past the model's context (``LlamaConfig.max_positions``, the GGUF
    ``llama.context_length``): refused before any work."""


def check_context(prompt_lens: Iterable[int], max_tokens: int, max_positions: int) -> None:
    """Raise :class:`ContextTooLong` unless every prompt plus ``max_tokens`` generated tokens fits in
    ``max_positions`` (prompt + output <= context, vLLM's ``max_model_len`` rule; the last generated
    token is never fed back, so this is one position stricter than the forward passes need)."""
    for index, length in enumerate(prompt_lens):
        if length + max_tokens > max_positions:
            raise ContextTooLong(
                f"prompt {index + 1} has {length} tokens and up to {max_tokens} are generated: "
                f"{length + max_tokens} positions, but the model's context is {max_positions} "
                f"(lower max_tokens, --max-tokens, to at most {max(max_positions - length, 0)} "
                f"or shorten the prompt)"
            )


@dataclass
class _Live:
    num_tokens: int
    block_table: tuple[int, ...]


def _namespace(model: Llama) -> str:
    cfg = model.config
    return (
        f"llama:{cfg.num_layers}x{cfg.hidden_size}:layers={model.num_layers}:dtype={model.dtype}:"
        f"rope={cfg.rope_theta}"
    )


class Engine:
    """Runs requests of one model over a paged KV cache with prefix sharing.

    Args:
        model: the model.
        num_blocks: physical blocks of the cache.
        block_size: tokens per block.
        manager: a name for :func:`resolve_manager` or a factory ``CacheConfig -> manager``.
        backend: kernel backend passed to every kernel call (``"auto"`` by default).
        execute_copies: run the copy-on-write copies (``False`` only to show what breaks without them).
        prefix_sharing: ``False`` gives every admitted request a cache salt of its own (the spec's
            tenant isolation), so no request ever hits another's blocks; :func:`generate` then also
            admits each sample on its own instead of forking. Same batches, nothing shared.
        namespace: the cache namespace (default: derived from the model's shape and dtype).
    """

    def __init__(
        self,
        model: Llama,
        *,
        num_blocks: int,
        block_size: int = 16,
        manager: str | ManagerFactory = "auto",
        backend: Backend = "auto",
        execute_copies: bool = True,
        prefix_sharing: bool = True,
        namespace: str | None = None,
    ) -> None:
        self.model = model
        self.prefix_sharing = prefix_sharing
        self.block_size = block_size
        self.backend = backend
        self.execute_copies = execute_copies
        factory = resolve_manager(manager) if isinstance(manager, str) else manager
        config = CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            namespace=_namespace(model) if namespace is None else namespace,
        )
        self.manager = factory(config)
        self.kv = model.new_kv(num_blocks, block_size, backend=backend)
        self.stats = EngineStats()
        self._live: dict[RequestId, _Live] = {}
        self._admissions = 0

    # -- requests ---------------------------------------------------------------------------------

    def add_request(self, request_id: RequestId, tokens: Sequence[int]) -> Prefill:
        """Admit a prompt and prefill the tokens the cache does not hold yet.

        Raises :class:`ContextTooLong`, before anything changes, for a prompt longer than the model's
        ``max_positions``."""
        check_context([len(tokens)], 0, self.model.config.max_positions)
        self._admissions += 1
        extras = NO_EXTRAS if self.prefix_sharing else Extras(cache_salt=f"private-{self._admissions}")
        allocation = self.manager.allocate(request_id, list(tokens), extras)
        computed = allocation.num_computed_tokens
        table = tuple(allocation.block_table)
        self._live[request_id] = _Live(num_tokens=len(tokens), block_table=table)
        self.stats.prompt_tokens += len(tokens)
        self.stats.prefill_tokens_skipped += computed
        self.stats.prefill_tokens_computed += len(tokens) - computed
        logits = self._forward([(table, computed, list(tokens[computed:]))])
        return Prefill(num_computed_tokens=computed, logits=logits[0])

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """A child request sharing every block of the parent (nothing is copied until a write)."""
        self.manager.fork(parent_id, child_id)
        parent = self._live[parent_id]
        self._live[child_id] = _Live(num_tokens=parent.num_tokens, block_table=parent.block_table)
        self.stats.forks += 1

    def decode(self, next_tokens: Mapping[RequestId, int]) -> dict[RequestId, torch.Tensor]:
        """Append one token to each named request and return each request's next-token logits.

        Raises ``OutOfBlocks`` when the cache is too small (size it with :func:`blocks_needed_alone`);
        the requests appended before the failure then hold a token without its K/V. Raises
        :class:`ContextTooLong`, before anything changes, when a request would pass the model's
        ``max_positions``.
        """
        if not next_tokens:
            return {}
        limit = self.model.config.max_positions
        for request_id in next_tokens:
            live = self._live.get(request_id)
            if live is not None and live.num_tokens + 1 > limit:
                raise ContextTooLong(f"request {request_id!r} holds {live.num_tokens} tokens: one more "
                                     f"passes the model's context of {limit} positions")
        copies: list[tuple[int, int]] = []
        items: list[tuple[tuple[int, ...], int, list[int]]] = []
        for request_id, token in next_tokens.items():
            result = self.manager.append(request_id, [token])
            copies.extend((int(src), int(dst)) for src, dst in result.copies)
            live = self._live[request_id]
            items.append((tuple(result.block_table), live.num_tokens, [token]))
            live.num_tokens += 1
            live.block_table = tuple(result.block_table)
        self.stats.decode_tokens += len(items)
        self.stats.cow_copies += len(copies)
        if copies and self.execute_copies:
            # Executed by the forward pass's first write, before it writes into any destination.
            self.kv.schedule(copies)
        logits = self._forward(items)
        return {request_id: logits[i] for i, request_id in enumerate(next_tokens)}

    def free(self, request_id: RequestId) -> None:
        """Release a request's blocks (they stay cached until evicted)."""
        self.manager.free(request_id)
        del self._live[request_id]

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's physical blocks, in order."""
        return self._live[request_id].block_table

    def live_requests(self) -> tuple[RequestId, ...]:
        return tuple(self._live)

    def sharing(self) -> tuple[int, int]:
        """``(block-table entries, distinct blocks)`` over the live requests: without sharing every
        entry would be a block of its own."""
        entries = sum(len(live.block_table) for live in self._live.values())
        distinct = len({b for live in self._live.values() for b in live.block_table})
        return entries, distinct

    # -- the forward pass -------------------------------------------------------------------------

    def _forward(self, items: Sequence[tuple[tuple[int, ...], int, list[int]]]) -> torch.Tensor:
        """Run ``(block_table, first_position, new_tokens)`` items in one batch; the logits of each
        item's last token, ``[len(items), vocab]``."""
        size = self.block_size
        device = self.model.device
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        for table, first, new_tokens in items:
            for offset, token in enumerate(new_tokens):
                position = first + offset
                token_ids.append(token)
                positions.append(position)
                slots.append(table[position // size] * size + position % size)
            starts.append(len(token_ids))
            seq_lens.append(first + len(new_tokens))
        width = max(len(table) for table, _, _ in items)
        rows = [list(table) + [0] * (width - len(table)) for table, _, _ in items]

        def ints(values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        batch = ForwardBatch(
            token_ids=ints(token_ids, torch.int64),
            positions=ints(positions, torch.int64),
            slot_mapping=ints(slots, torch.int64),
            block_table=ints(rows, torch.int32),
            seq_lens=ints(seq_lens, torch.int32),
            query_start_loc=ints(starts, torch.int32),
            logits_index=ints([end - 1 for end in starts[1:]], torch.int64),
        )
        with torch.inference_mode():
            return self.model.forward(batch, self.kv, backend=self.backend)


# -- generation -------------------------------------------------------------------------------------


def ranked_tokens(logits: torch.Tensor, count: int) -> list[int]:
    """The ``count`` most likely token ids, best first; ties go to the smaller id (as ``argmax``)."""
    order = torch.sort(logits, descending=True, stable=True).indices
    return [int(i) for i in order[:count]]


@dataclass
class Sample:
    """One generated sequence.

    Attributes:
        request_id: its id in the engine.
        prompt_index: which prompt it continues.
        rank: its first token is the ``rank``-th most likely one (0: greedy); the rest are greedy.
        tokens: generated ids (a stop token, if reached, is the last).
        logits: the float32 logits each generated token was chosen from (when recorded).
    """

    request_id: RequestId
    prompt_index: int
    rank: int
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass
class GenerationResult:
    """Samples (prompt after prompt, rank after rank), engine counters, and the sharing seen at the end
    of generation (before the requests were freed)."""

    samples: list[Sample]
    stats: EngineStats
    num_computed_tokens: list[int]
    table_entries: int
    distinct_blocks: int


def blocks_needed_alone(prompt_lens: Iterable[int], n: int, max_tokens: int, block_size: int) -> int:
    """Blocks enough for every sample with no sharing at all (so also enough with sharing)."""
    return sum(n * -(-(length + max_tokens) // block_size) for length in prompt_lens)


def _finished(sample: Sample, max_tokens: int, stop_ids: frozenset[int]) -> bool:
    return len(sample.tokens) >= max_tokens or sample.tokens[-1] in stop_ids


def _decode_greedily(
    engine: Engine, samples: list[Sample], max_tokens: int, stop_ids: frozenset[int], record: bool
) -> None:
    """Feed each sample's last token and append the argmax until it stops; all samples batched."""
    while True:
        active = [s for s in samples if not _finished(s, max_tokens, stop_ids)]
        if not active:
            return
        logits = engine.decode({s.request_id: s.tokens[-1] for s in active})
        for sample in active:
            row = logits[sample.request_id]
            sample.tokens.append(ranked_tokens(row, 1)[0])
            if record:
                sample.logits.append(row.clone())


def generate(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    *,
    n: int = 1,
    max_tokens: int = 16,
    stop_ids: frozenset[int] = frozenset(),
    record_logits: bool = False,
    free: bool = True,
) -> GenerationResult:
    """Generate ``n`` samples for each prompt with prefix sharing.

    The prompts are admitted in order (each prefill reuses the cached blocks of the earlier ones);
    samples ``1 .. n-1`` of a prompt are forked from sample 0 right after its prefill, so all ``n``
    share the prompt's blocks, including its partial last block, until their first writes diverge
    (copy-on-write). Sample ``j`` starts with the ``j``-th most likely token, then all go greedily,
    decoded together in one batch per step, until ``max_tokens`` tokens or a stop token.

    On an engine with ``prefix_sharing=False`` every sample is admitted and prefilled on its own
    instead (no hit, no fork), and the decode batches are the same: a comparison with sharing on
    then differs only by what was shared.

    Raises :class:`ContextTooLong` before any work when a prompt plus ``max_tokens`` does not fit in
    the model's ``max_positions`` (:func:`check_context`).
    """
    if n < 1 or max_tokens < 1:
        raise ValueError("n and max_tokens must be >= 1")
    check_context((len(p) for p in prompts), max_tokens, engine.model.config.max_positions)
    samples: list[Sample] = []
    computed: list[int] = []
    for index, prompt in enumerate(prompts):
        parent = f"p{index}"
        prefill = engine.add_request(parent, prompt)
        computed.append(prefill.num_computed_tokens)
        first_tokens = ranked_tokens(prefill.logits, n)
        for rank, token in enumerate(first_tokens):
            request_id = parent if rank == 0 else f"p{index}.s{rank}"
            logits = prefill.logits
            if rank and engine.prefix_sharing:
                engine.fork(parent, request_id)
            elif rank:
                logits = engine.add_request(request_id, prompt).logits
                token = ranked_tokens(logits, rank + 1)[rank]
            sample = Sample(request_id=request_id, prompt_index=index, rank=rank, tokens=[token])
            if record_logits:
                sample.logits.append(logits.clone())
            samples.append(sample)
    _decode_greedily(engine, samples, max_tokens, stop_ids, record_logits)
    entries, distinct = engine.sharing()
    if free:
        for sample in samples:
            engine.free(sample.request_id)
    return GenerationResult(
        samples=samples,
        stats=engine.stats,
        num_computed_tokens=computed,
        table_entries=entries,
        distinct_blocks=distinct,
    )


@dataclass(frozen=True)
class Rerun:
    """How a check reruns the samples of a generation: with its ``max_tokens`` and ``stop_ids``, in
    engines of ``block_size``-token blocks with the block ``manager`` (a :data:`MANAGERS` name or a
    factory) and kernel ``backend`` the shared run used."""

    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    block_size: int = 16
    manager: str | ManagerFactory = "auto"
    backend: Backend = "auto"


def run_alone(
    model: Llama, prompt: Sequence[int], rerun: Rerun, *, rank: int = 0, record_logits: bool = False
) -> Sample:
    """Replay one sample (``rank``: which first token it takes, 0 = greedy) as ``rerun`` says, in a
    fresh engine that holds nothing else: no prefix hit, no fork, no copy."""
    max_tokens, block_size = rerun.max_tokens, rerun.block_size
    num_blocks = blocks_needed_alone([len(prompt)], 1, max_tokens, block_size)
    engine = Engine(
        model, num_blocks=num_blocks, block_size=block_size, manager=rerun.manager, backend=rerun.backend
    )
    prefill = engine.add_request("alone", prompt)
    if prefill.num_computed_tokens != 0:
        raise AssertionError("a fresh cache served a prefix hit")
    sample = Sample(
        request_id="alone", prompt_index=0, rank=rank, tokens=[ranked_tokens(prefill.logits, rank + 1)[rank]]
    )
    if record_logits:
        sample.logits.append(prefill.logits.clone())
    _decode_greedily(engine, [sample], max_tokens, rerun.stop_ids, record_logits)
    if engine.stats.cow_copies or engine.stats.prefill_tokens_skipped:
        raise AssertionError("a request alone shared blocks")
    return sample


@dataclass
class CheckResult:
    """Each shared sample against its rerun without sharing (``reruns``, in the same order):
    ``mismatches`` lists the shared samples whose tokens differ; ``max_logit_diff`` is the largest
    absolute logit difference over the steps both runs took (``nan`` when logits were not recorded)."""

    reruns: list[Sample]
    mismatches: list[Sample]
    max_logit_diff: float

    @property
    def ok(self) -> bool:
        return not self.mismatches


def compare_samples(shared: Sequence[Sample], reruns: list[Sample]) -> CheckResult:
    """Pair ``shared[i]`` with ``reruns[i]``: token mismatches and the largest logit difference."""
    record = all(sample.logits for sample in shared) and all(sample.logits for sample in reruns)
    mismatches = [a for a, b in zip(shared, reruns, strict=True) if a.tokens != b.tokens]
    worst = 0.0
    for a, b in zip(shared, reruns, strict=True):
        for row_a, row_b in zip(a.logits, b.logits, strict=False):
            worst = max(worst, float((row_a - row_b).abs().max()))
    return CheckResult(reruns=reruns, mismatches=mismatches, max_logit_diff=worst if record else float("nan"))


def check_without_sharing(
    model: Llama, prompts: Sequence[Sequence[int]], result: GenerationResult, rerun: Rerun, *, n: int
) -> CheckResult:
    """Rerun the whole generation (``n`` samples a prompt) with ``prefix_sharing=False`` (every
    sample admitted and prefilled on its own, decoded in the same batches) and compare. Only sharing
    differs between the two runs, so on one device the logits usually agree bit for bit."""
    num_blocks = blocks_needed_alone((len(p) for p in prompts), n, rerun.max_tokens, rerun.block_size)
    engine = Engine(
        model,
        num_blocks=num_blocks,
        block_size=rerun.block_size,
        manager=rerun.manager,
        backend=rerun.backend,
        prefix_sharing=False,
    )
    record = all(sample.logits for sample in result.samples)
    again = generate(
        engine, prompts, n=n, max_tokens=rerun.max_tokens, stop_ids=rerun.stop_ids, record_logits=record
    )
    if again.stats.prefill_tokens_skipped or again.stats.cow_copies or again.stats.forks:
        raise AssertionError("an engine without prefix sharing shared blocks")
    return compare_samples(result.samples, again.samples)


def check_against_alone(
    model: Llama, prompts: Sequence[Sequence[int]], result: GenerationResult, rerun: Rerun
) -> CheckResult:
    """Rerun every sample of ``result`` alone (:func:`run_alone`: a fresh engine, batches of one) and
    compare. Different batch shapes round differently, so logits agree only to about 1e-5 in float32;
    greedy tokens must still be equal."""
    record = all(sample.logits for sample in result.samples)
    reruns = [
        run_alone(model, prompts[sample.prompt_index], rerun, rank=sample.rank, record_logits=record)
        for sample in result.samples
    ]
    return compare_samples(result.samples, reruns)

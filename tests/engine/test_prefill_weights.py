"""Prefill weights: quantized layers keep a dense copy, or int8 codes (kept, or made for each
step), for prefill-sized steps.

A dense copy holds the dequantized weight exactly, so a prefill through it gives the
dequantizing path's results; int8 codes round it (and the activations) to 8 bits, so a prefill
through them stays close; codes made for a step are the codes kept. The kernel still serves
decodes. Real SmolLM2 GGUF weights (int4 and
int8 layers), float32 so that results compare tightly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.engine import BatchEntry, ConfigError, EngineConfig
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.kernels import has_amx, has_int8_dot_products
from inference.engine.layers.quantization import QuantizedLinear
from inference.engine.model_runner import (
    DENSE_AMX_KERNEL_TOKENS,
    INT8_CODES_PER_STEP_KERNEL_TOKENS,
    INT8_GEMM_KERNEL_TOKENS,
    PACKED_INT8_MIN_HIDDEN_SIZE,
    ModelRunner,
    auto_prefill_weights,
    dense_kernel_token_limit,
    packed_int8_kernel_tokens,
    packs_int8_gemm_weights,
)
from tests.engine.real_model import RealEngines, chat

pytestmark = pytest.mark.real_weights

MAX_MODEL_LEN = 512
PREDICTION_TOKENS = 448
PREDICTION_CHUNK = 112  # tokens a prefill step: above every int8 path's kernel limit
DATA_DIR = Path(__file__).parents[1] / "data"


def quantized_runner(
    model_dir, dtype: str, prefill_weights: str, kv_cache_mb: int = 32
) -> ModelRunner:
    config = EngineConfig(
        model_dir,
        dtype=dtype,
        quantization="auto",  # the GGUF's own int4/int8 tensors
        kv_cache_mb=kv_cache_mb,
        max_model_len=MAX_MODEL_LEN,
        prefill_weights=prefill_weights,
    )
    return ModelRunner(config)


def quantized_layers(runner: ModelRunner) -> list[QuantizedLinear]:
    return [m for m in runner.model.modules() if isinstance(m, QuantizedLinear)]


def test_a_dense_copy_multiplies_like_the_dequantizing_path(chat_model_dir) -> None:
    runner = quantized_runner(chat_model_dir, "float32", "quantized")
    layers = [layer for layer in quantized_layers(runner) if layer is not runner.model.lm_head]
    assert layers and runner.prefill_weights == "quantized" and runner.prefill_weight_bytes == 0
    generator = torch.Generator().manual_seed(0)
    for layer in layers[:8]:
        x = torch.randn(40, layer.in_features, generator=generator)
        expected = layer.dequantized_matmul(x)
        num_bytes = layer.keep_dense_weight(DENSE_AMX_KERNEL_TOKENS)
        assert num_bytes == layer.in_features * layer.out_features * 4
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        assert layer.max_kernel_tokens <= DENSE_AMX_KERNEL_TOKENS


def test_int8_codes_multiply_close_to_the_dequantizing_path(chat_model_dir) -> None:
    runner = quantized_runner(chat_model_dir, "float32", "quantized")
    layers = [layer for layer in quantized_layers(runner) if layer is not runner.model.lm_head]
    generator = torch.Generator().manual_seed(0)
    for layer in layers[:8]:
        x = torch.randn(40, layer.in_features, generator=generator)
        expected = layer.dequantized_matmul(x)
        num_bytes = layer.keep_int8_gemm_weight(INT8_GEMM_KERNEL_TOKENS)
        assert num_bytes == layer.in_features * layer.out_features + layer.out_features * 4
        y = layer(x)
        assert float((y - expected).norm() / expected.norm()) < 0.02
        assert layer.max_kernel_tokens <= INT8_GEMM_KERNEL_TOKENS


def answers(
    chat_model_dir, tokenizer, settings: tuple[str, ...], dtype: str = "float32"
) -> dict[str, list[int]]:
    """12 greedy tokens of one prompt from an engine per `prefill_weights` setting."""
    prompt = chat(tokenizer, "Name three rivers of Europe and the seas they flow into.")
    params = SamplingParams(temperature=0, max_tokens=12)
    answered = {}
    for setting in settings:
        runner = quantized_runner(chat_model_dir, dtype, setting)
        assert runner.prefill_weights == setting
        # NOTE: int8 codes are made for each step where the native kernels run (nothing
        # kept), unless they are packed (AMX)
        kept_anything = setting == "dense" or (
            setting == "int8"
            and (
                packs_int8_gemm_weights(runner.dtype)
                or not all(layer.makes_int8_codes_natively for layer in quantized_layers(runner))
            )
        )
        assert (runner.prefill_weight_bytes > 0) == kept_anything
        engines = RealEngines(runner, tokenizer, chat_model_dir, MAX_MODEL_LEN)
        try:
            engine = engines.make(quantization="auto", prefill_weights=setting, dtype=dtype)
            answered[setting] = engine.generate([prompt], params)[0].token_ids
        finally:
            engines.shutdown()
    return answered


def test_an_engine_with_dense_prefill_weights_answers_as_one_without(
    chat_model_dir, real_tokenizer
) -> None:
    answered = answers(chat_model_dir, real_tokenizer, ("quantized", "dense"))
    assert answered["dense"] == answered["quantized"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_engine_with_int8_prefill_weights_answers(chat_model_dir, real_tokenizer, dtype) -> None:
    """int8 codes round the prompt's prefill, so a near tie may go the other way (SmolLM2's
    first token here: "The" 30.87 against "1" 30.63): the answer is checked as text, and the
    predictions below, token by token. (In bf16 on AMX CPUs: on the packed codes.)"""
    answered = answers(chat_model_dir, real_tokenizer, ("int8",), dtype)["int8"]
    assert len(answered) == 12
    assert "river" in real_tokenizer.decode(answered).lower() or any(
        name in real_tokenizer.decode(answered) for name in ("Danube", "Rhine", "Volga", "Seine")
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_prefill_weights_keep_the_models_next_token_predictions(
    chat_model_dir, real_tokenizer, dtype
) -> None:
    """Teacher-forced over real text, in prefill chunks above the kernel's token limit (in bf16
    on AMX CPUs: on the packed codes)."""
    text = (DATA_DIR / "squad_passages.txt").read_text()
    token_ids = real_tokenizer(text)["input_ids"][:PREDICTION_TOKENS]
    block_table = list(range(-(-PREDICTION_TOKENS // 16)))
    predictions, perplexities = {}, {}
    for setting in ("quantized", "int8"):
        runner = quantized_runner(chat_model_dir, dtype, setting)
        logits = torch.cat(
            [
                runner.execute(
                    [
                        BatchEntry(
                            token_ids[start : start + PREDICTION_CHUNK],
                            start,
                            block_table,
                            num_logits=PREDICTION_CHUNK,
                        )
                    ]
                )
                for start in range(0, PREDICTION_TOKENS, PREDICTION_CHUNK)
            ]
        )
        predictions[setting] = logits.argmax(-1)[:-1]
        perplexities[setting] = float(
            torch.nn.functional.cross_entropy(
                logits[:-1].float(), torch.tensor(token_ids[1:])
            ).exp()
        )
    agreement = float((predictions["int8"] == predictions["quantized"]).float().mean())
    assert agreement >= 0.88
    assert perplexities["int8"] == pytest.approx(perplexities["quantized"], rel=0.03)


def decode_logits_past_the_kernel_limit(
    chat_model_dir, tokenizer, dtype: str, settings: tuple[str, ...], num_sequences: int
) -> dict[str, torch.Tensor]:
    """Logits of one decode step of `num_sequences` sequences per `prefill_weights` setting,
    each sequence a 24-token prompt of real text prefilled first."""
    prompt_len = 24
    token_ids = tokenizer((DATA_DIR / "squad_passages.txt").read_text())["input_ids"]
    prompts = [token_ids[i * prompt_len : (i + 1) * prompt_len] for i in range(num_sequences)]
    blocks = -(-(prompt_len + 1) // 16)
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(num_sequences)]
    logits = {}
    for setting in settings:
        # NOTE: room for 68 sequences where the limit is 64 (no AMX), in float32
        runner = quantized_runner(chat_model_dir, dtype, setting, kv_cache_mb=160)
        prefill = runner.execute(
            [BatchEntry(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
        )
        next_ids = prefill.argmax(-1).tolist()
        decodes = [BatchEntry([n], prompt_len, t) for n, t in zip(next_ids, tables, strict=True)]
        logits[setting] = runner.execute(decodes)
        fused = runner.model.fused_decode
        if setting == "dense":
            assert runner.model.lm_head.dense_weight is not None
            assert fused is None or fused.max_tokens == dense_kernel_token_limit()
        if setting == "int8" and packs_int8_gemm_weights(runner.dtype):
            lm_head_codes = runner.model.lm_head.int8_gemm_weight
            assert lm_head_codes is not None and lm_head_codes.packed is not None
            limit = packed_int8_kernel_tokens(runner.model.args.hidden_size)
            assert fused is None or fused.max_tokens == limit
            assert lm_head_codes is not None and runner.model.lm_head.max_kernel_tokens == limit
    return logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decodes_of_more_sequences_than_the_kernel_limit_run_on_the_dense_copies(
    chat_model_dir, real_tokenizer, dtype
) -> None:
    """Past the quantized kernels' token limit a decode step leaves the fused call and runs
    layer by layer on the dense copies, the logits table's included; its logits are the
    quantized path's, up to the kernels' 8-bit activation codes (and in bf16 the packed GEMM's
    rounding)."""
    logits = decode_logits_past_the_kernel_limit(
        chat_model_dir,
        real_tokenizer,
        dtype,
        ("quantized", "dense"),
        dense_kernel_token_limit() + 4,
    )
    agreement = (logits["dense"].argmax(-1) == logits["quantized"].argmax(-1)).float()
    error = (logits["dense"] - logits["quantized"]).norm() / logits["quantized"].norm()
    if dtype == "float32":  # the kernels' activation codes against the dense GEMM's floats
        assert float(agreement.mean()) == 1.0 and float(error) < 1e-3
    else:
        assert float(agreement.mean()) >= 0.9 and float(error) < 0.03


@pytest.mark.skipif(
    not packs_int8_gemm_weights(torch.bfloat16),
    reason="int8 codes are packed where oneDNN's int8 GEMM runs (AMX or VNNI) only",
)
def test_decodes_of_more_sequences_than_the_kernel_limit_run_on_packed_int8_codes(
    chat_model_dir, real_tokenizer
) -> None:
    """With AMX or VNNI, int8 codes are kept packed for every layer, the logits table's too, and
    a decode step past the kernels' limit runs layer by layer on them: its logits stay those of
    the dense copies (the same weights multiplied in bf16) up to the activations' codes per
    token, the prompts' prefill on them included. Each sequence's error relative to its
    logits' norm: SmolLM2 at 12 sequences (AMX) 7% in all, every argmax the same; at 68 (Zen 4,
    where its decodes of up to 64 stay in the fused call) a median of 5%, 1-28% (a few
    low-confidence positions amplify the codes' rounding), 60 of 68 argmaxes the same."""
    num_sequences = packed_int8_kernel_tokens(576) + 4
    logits = decode_logits_past_the_kernel_limit(
        chat_model_dir, real_tokenizer, "bfloat16", ("dense", "int8"), num_sequences
    )
    agreement = (logits["int8"].argmax(-1) == logits["dense"].argmax(-1)).float()
    errors = (logits["int8"] - logits["dense"]).norm(dim=-1) / logits["dense"].norm(dim=-1)
    assert float(agreement.mean()) >= 0.85 and float(errors.median()) < 0.1


@pytest.mark.skipif(
    not packs_int8_gemm_weights(torch.bfloat16),
    reason="int8 codes are packed where oneDNN's int8 GEMM runs (AMX or VNNI) only",
)
def test_int8_codes_kept_packed_take_two_bytes_a_weight(chat_model_dir) -> None:
    runner = quantized_runner(chat_model_dir, "bfloat16", "int8")
    layers = quantized_layers(runner)
    assert runner.prefill_weights == "int8" and runner.int8_codes_are_packed
    assert all(layer.int8_gemm_weight is not None for layer in layers)
    assert runner.prefill_weight_bytes == sum(
        2 * layer.in_features * layer.out_features + 4 * layer.out_features for layer in layers
    )


def test_auto_keeps_dense_copies_only_for_bf16_on_cpus_with_amx(chat_model_dir) -> None:
    """SmolLM2 is 576 wide: with AMX too narrow for packed int8 codes to pay
    (auto_prefill_weights); with VNNI they are packed in bf16, made per step in float32."""
    runner = quantized_runner(chat_model_dir, "bfloat16", "auto")
    without_amx = "int8" if has_int8_dot_products() else "quantized"
    assert runner.model.args.hidden_size < PACKED_INT8_MIN_HIDDEN_SIZE
    assert runner.prefill_weights == ("dense" if has_amx() else without_amx)
    assert runner.int8_codes_are_packed == (not has_amx() and packs_int8_gemm_weights(runner.dtype))
    assert (runner.prefill_weight_bytes > 0) == (has_amx() or runner.int8_codes_are_packed)
    float32_runner = quantized_runner(chat_model_dir, "float32", "auto")
    assert float32_runner.prefill_weights == without_amx
    assert float32_runner.prefill_weight_bytes == 0  # int8 codes are made per step


@pytest.mark.skipif(
    auto_prefill_weights(torch.bfloat16, 576) != "int8"
    or not packs_int8_gemm_weights(torch.bfloat16),
    reason="auto packs SmolLM2's int8 codes only where oneDNN's int8 GEMM runs, without AMX",
)
def test_auto_makes_int8_codes_per_step_where_packed_ones_would_not_fit(
    chat_model_dir, monkeypatch
) -> None:
    """Packed codes take two bytes a weight; on a machine with too little memory for them,
    `auto` makes the codes for each prefill step instead (no bytes kept)."""
    monkeypatch.setattr("inference.engine.model_runner.available_memory_bytes", lambda: 2**20)
    runner = quantized_runner(chat_model_dir, "bfloat16", "auto")
    assert runner.prefill_weights == "int8" and not runner.int8_codes_are_packed
    assert runner.prefill_weight_bytes == 0
    layers = [layer for layer in quantized_layers(runner) if layer is not runner.model.lm_head]
    assert all(layer.codes_int8_gemm_weight_per_step for layer in layers)


def test_auto_packs_int8_codes_for_wide_bf16_models_on_cpus_with_amx() -> None:
    without_amx = "int8" if has_int8_dot_products() else "quantized"
    wide, narrow = PACKED_INT8_MIN_HIDDEN_SIZE, PACKED_INT8_MIN_HIDDEN_SIZE - 64
    if has_amx():
        assert auto_prefill_weights(torch.bfloat16, narrow) == "dense"
        packed = "int8" if packs_int8_gemm_weights(torch.bfloat16) else "dense"
        assert auto_prefill_weights(torch.bfloat16, wide) == packed
    else:
        assert auto_prefill_weights(torch.bfloat16, narrow) == without_amx
        assert auto_prefill_weights(torch.bfloat16, wide) == without_amx
    assert auto_prefill_weights(torch.float32, wide) == without_amx


def test_int8_codes_made_per_step_multiply_as_the_codes_kept(chat_model_dir) -> None:
    """The same codes (csrc/int8_row_codes.h makes Int8GemmWeight.from_rows's), so the same
    products, bit for bit; steps up to the limit still run the kernel."""
    runner = quantized_runner(chat_model_dir, "float32", "quantized")
    layers = [layer for layer in quantized_layers(runner) if layer is not runner.model.lm_head]
    if not all(layer.makes_int8_codes_natively for layer in layers):
        pytest.skip("the native kernels do not run here: int8 codes are kept instead")
    generator = torch.Generator().manual_seed(0)
    for layer in layers[:8]:
        x = torch.randn(
            INT8_CODES_PER_STEP_KERNEL_TOKENS + 36, layer.in_features, generator=generator
        )
        small = x[:INT8_CODES_PER_STEP_KERNEL_TOKENS]
        from_kernel = layer(small)
        layer.keep_int8_gemm_weight(INT8_CODES_PER_STEP_KERNEL_TOKENS)
        kept = layer(x)
        layer.int8_gemm_weight = None
        layer.make_int8_codes_per_step(INT8_CODES_PER_STEP_KERNEL_TOKENS)
        assert torch.equal(layer(x), kept)
        assert torch.equal(layer(small), from_kernel)


def test_an_unknown_prefill_weights_setting_is_refused(chat_model_dir) -> None:
    with pytest.raises(ConfigError, match="prefill_weights must be one of"):
        EngineConfig(chat_model_dir, prefill_weights="fast")

"""GGUF checkpoints loaded straight into the engine's formats, on the real files.

References: the `gguf` package's own dequantization (each weight format within its bound) and
transformers' own GGUF loading (its config, and float32 logits). The real files: the bundled
SmolLM2-135M (llama, Q4_1 + a Q8_0 table), Gemma 3 270M (Q4_K, Q5_0, Q6_K, Q8_0), the
Qwen2.5-Coder 0.5B and 1.5B (qwen2; Q4_K + Q6_K).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from django.conf import settings
from transformers import AutoConfig, AutoTokenizer

from bench.perplexity import perplexity
from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine.gguf_blocks import int4_blocks
from inference.engine.gguf_file import GGUFFileError, open_gguf
from inference.engine.gguf_metadata import read_hf_config
from inference.engine.kernels.int4_linear import unpack_int4_vnni
from inference.engine.layers.quantization import (
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    unpack_int4,
    weight_formats,
)
from inference.engine.loader import load_model
from inference.model_files import resolve_chat_model
from tests.engine.broken_gguf import truncated_copy, with_metadata_value, with_tensor_type
from tests.engine.models.transformers_snapshot import transformers_float32_dir

pytestmark = pytest.mark.usefixtures("torch_threads_on_free_cores")

SMOLLM2 = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m"
QWEN_05B = "qwen2.5-coder-0.5b-instruct"
QWEN_15B = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture(scope="module")
def auto_bf16(catalogue_gguf):
    """Factory: the model of a GGUF loaded as the engine serves it (bf16, "auto"), once each."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            path = catalogue_gguf(name)
            loaded[name] = load_model(path, dtype=torch.bfloat16, quantization="auto")
        return loaded[name]

    return load


def reference_values(path: Path, tensor_name: str) -> tuple[torch.Tensor, str]:
    tensor = open_gguf(path).tensors[tensor_name]
    values = gguf.quants.dequantize(tensor.data, tensor.ggml_type)
    return torch.from_numpy(np.asarray(values, dtype=np.float32)), tensor.ggml_type.name


# --- the metadata and the block formats ------------------------------------------------------


@pytest.mark.real_weights
@pytest.mark.parametrize("model", [SMOLLM2, GEMMA])
def test_the_config_from_the_metadata_is_transformers_own(catalogue_gguf, model) -> None:
    path = catalogue_gguf(model)
    expected = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    config = read_hf_config(open_gguf(path)).to_dict()
    expected.pop("_name_or_path")
    config.pop("_name_or_path")
    assert config == expected


@pytest.mark.parametrize(
    ("model", "tensor_name"), [(QWEN_15B, "blk.0.attn_q.weight"), (SMOLLM2, "blk.0.ffn_up.weight")]
)
def test_4_bit_blocks_are_codes_scales_and_offsets_that_give_gguf_values_exactly(
    catalogue_gguf, model, tensor_name
) -> None:
    path = catalogue_gguf(model)
    tensor = open_gguf(path).tensors[tensor_name]
    blocks = int4_blocks(tensor.data, tensor.ggml_type)
    expected, _ = reference_values(path, tensor_name)
    assert blocks.codes.dtype == torch.uint8 and int(blocks.codes.max()) <= 15
    assert torch.equal(blocks.dequantize(), expected)


def test_q4_0_blocks_match_gguf_to_float32_rounding() -> None:
    # NOTE: no real file here has Q4_0 tensors; these come from the gguf package's quantizer.
    weights = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q4_0)
    blocks = int4_blocks(raw, gguf.GGMLQuantizationType.Q4_0)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0))
    torch.testing.assert_close(blocks.dequantize(), expected, rtol=1e-6, atol=1e-7)
    assert (blocks.scales < 0).any()  # Q4_0's d takes the sign of the block's largest value


# --- each weight format against gguf's dequantization ------------------------------------------


# (model, GGUF tensor, its type, engine layer, the tensor's first row in the layer)
CASE_FIELDS = ("model", "tensor_name", "ggml_type", "layer_name", "first_row")
INT4_CASES = [
    (GEMMA, "blk.0.attn_output.weight", "Q4_K", "layers.0.self_attn.o_proj", 0),
    (SMOLLM2, "blk.0.ffn_up.weight", "Q4_1", "layers.0.mlp.gate_up_proj", 1536),
]
INT8_CASES = [
    (GEMMA, "blk.0.attn_k.weight", "Q5_0", "layers.0.self_attn.qkv_proj", 1024),
    (GEMMA, "blk.0.ffn_down.weight", "Q6_K", "layers.0.mlp.down_proj", 0),
    (GEMMA, "token_embd.weight", "Q8_0", "embed_tokens.table", 0),
]


@pytest.mark.parametrize(
    ("model", "tensor_name", "ggml_type", "layer_name", "first_row"), INT4_CASES
)
def test_4_bit_tensors_keep_their_codes_within_bf16_scale_and_zero_point_rounding(
    auto_bf16, catalogue_gguf, model, tensor_name, ggml_type, layer_name, first_row
) -> None:
    layer = auto_bf16(model).model.get_submodule(layer_name)
    assert isinstance(layer, Int4Linear) and layer.group_size == 32
    expected, stored_type = reference_values(catalogue_gguf(model), tensor_name)
    assert stored_type == ggml_type
    num_rows, num_columns = expected.shape
    rows = slice(first_row, first_row + num_rows)
    values = layer.dequantize_rows(rows.start, rows.stop, torch.float32)

    tensor = open_gguf(catalogue_gguf(model)).tensors[tensor_name]
    blocks = int4_blocks(tensor.data, tensor.ggml_type)
    scale = blocks.scales[..., None]
    bf16_scale = scale.to(torch.bfloat16).float()
    # a code q moves by q |scale - s| at most; the zero point by half a sixteenth of s
    bound = 15 * (scale - bf16_scale).abs() + bf16_scale.abs() / 32 + 1e-5 * scale.abs()
    error = (values - expected).view(num_rows, -1, 32).abs()
    out_of_bound_groups = int((error > bound).any(dim=-1).sum())
    if layer.is_native:
        codes = unpack_int4_vnni(layer.weight_int4)[rows]
    else:
        codes = unpack_int4(layer.weight_int4)[rows]
    changed_groups = int((codes != blocks.codes).view(num_rows, -1, 32).any(dim=-1).sum())
    # NOTE: only the groups of one sign, whose zero point does not fit a byte, are refitted.
    assert out_of_bound_groups <= layer.num_refitted_groups
    assert changed_groups <= layer.num_refitted_groups
    assert layer.num_refitted_groups < 0.01 * num_rows * num_columns / 32


@pytest.mark.parametrize(
    ("model", "tensor_name", "ggml_type", "layer_name", "first_row"), INT8_CASES
)
def test_5_to_8_bit_tensors_are_int8_rows_within_half_a_step(
    auto_bf16, catalogue_gguf, model, tensor_name, ggml_type, layer_name, first_row
) -> None:
    layer = auto_bf16(model).model.get_submodule(layer_name)
    assert isinstance(layer, Int8Linear)
    expected, stored_type = reference_values(catalogue_gguf(model), tensor_name)
    assert stored_type == ggml_type
    values = layer.dequantize_rows(first_row, first_row + expected.shape[0], torch.float32)
    row_max = expected.abs().amax(dim=1, keepdim=True)
    # half a step of row_max / 127, the step's own bf16 rounding included
    assert ((values - expected).abs() <= row_max / 254 * (1 + 2**-8)).all()


# --- whole models ------------------------------------------------------------------------------


@pytest.mark.real_weights
@pytest.mark.parametrize("model", [SMOLLM2, GEMMA, QWEN_05B])
def test_float32_logits_from_the_gguf_match_transformers_own_gguf_load(
    catalogue_gguf, model
) -> None:
    """quantization "none": the float32 reference path (llama's q/k rows, Gemma's norms)."""
    from transformers import AutoModelForCausalLM

    path = catalogue_gguf(model)
    token_ids = [2, 818, 5279, 529, 7001, 563, 1374, 23676, 108, 506, 3385, 15, 88, 104]
    # NOTE: transformers' own load of the GGUF, saved once (its Python dequantization takes
    # most of a minute per model; the snapshot holds the same weights bit for bit).
    hf_model = AutoModelForCausalLM.from_pretrained(
        transformers_float32_dir(path), dtype=torch.float32
    ).eval()
    with torch.inference_mode():
        expected = hf_model(torch.tensor([token_ids])).logits[0].float()
    del hf_model  # NOTE: one float32 copy of the model in memory at a time
    config = EngineConfig(
        path, dtype=torch.float32, quantization="none", kv_cache_mb=8, max_model_len=64
    )
    runner = ModelRunner(config)
    assert set(runner.load_report.formats) == {"float"}
    logits = runner.execute([BatchEntry(token_ids, 0, [0], num_logits=len(token_ids))])
    assert (logits - expected).abs().max() < 1e-3


def test_auto_is_the_default_and_follows_each_tensors_type(auto_bf16) -> None:
    assert EngineConfig("unused").quantization == "auto"
    model = auto_bf16(SMOLLM2).model
    # SmolLM2's Q4_1 layers in int4; its Q8_0 table, tied, in int8 for the lookup and the logits
    assert weight_formats(model) == {"int4": 30 * 4, "int8": 1}
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert model.lm_head is model.embed_tokens.table
    assert isinstance(model.lm_head, Int8Linear)


def test_a_fused_projection_takes_its_most_precise_shards_format(auto_bf16, catalogue_gguf) -> None:
    tensors = open_gguf(catalogue_gguf(GEMMA)).tensors
    model = auto_bf16(GEMMA).model
    for index, layer in enumerate(model.layers):
        types = {tensors[f"blk.{index}.attn_{name}.weight"].ggml_type.name for name in "qkv"}
        expected = Int4Linear if types <= {"Q4_K"} else Int8Linear
        assert isinstance(layer.self_attn.qkv_proj, expected), (index, types)


@pytest.mark.parametrize(
    ("quantization", "formats"),
    [("none", {"float": 121}), ("int8", {"int8": 121}), ("int4", {"int4": 120, "int8": 1})],
)
def test_a_configured_quantization_applies_to_every_layer(catalogue_gguf, quantization, formats):
    loaded = load_model(catalogue_gguf(SMOLLM2), dtype=torch.bfloat16, quantization=quantization)
    assert weight_formats(loaded.model) == formats
    assert loaded.report.formats == formats


@pytest.mark.real_weights
def test_the_15b_is_served_in_int4_and_int8_within_15_percent_of_its_gguf_bytes(catalogue_gguf):
    # NOTE: through its prepared directory (config.json, tokenizer, model.gguf), as it is served
    prepared = resolve_chat_model(
        QWEN_15B, Path(settings.MODELS_DIR), model_cache=settings.CACHET_MODEL_CACHE
    ).directory
    path = catalogue_gguf(QWEN_15B)
    config = EngineConfig(prepared, dtype="bfloat16", kv_cache_mb=64, max_model_len=1024)
    runner = ModelRunner(config)
    report = runner.load_report
    assert report.checkpoint_format == "gguf"
    assert set(report.formats) == {"int4", "int8"}  # nothing left in bf16
    assert report.checkpoint_bytes == open_gguf(path).tensor_bytes
    assert report.weight_bytes == runner.weight_bytes
    assert 1.0 < report.weight_ratio < 1.15
    assert report.peak_rss_bytes > report.weight_bytes and report.seconds > 0
    model = runner.model
    assert isinstance(model.embed_tokens.table, Int4Linear)  # token_embd is Q4_K
    assert isinstance(model.lm_head, Int8Linear)  # output.weight is Q6_K
    # NOTE: a sanity bound (a wrong code, scale or row order puts it in the thousands)
    text = (Path(__file__).parents[1] / "data" / "squad_passages.txt").read_text()[:6000]
    tokenizer = AutoTokenizer.from_pretrained(prepared)
    assert perplexity(runner, tokenizer(text)["input_ids"], window=1024) < 12


# --- bad input ---------------------------------------------------------------------------------


def test_a_truncated_gguf_is_refused_naming_the_file(catalogue_gguf, tmp_path) -> None:
    source = catalogue_gguf(SMOLLM2)
    broken = truncated_copy(source, tmp_path / "cut.gguf", source.stat().st_size - 4096)
    with pytest.raises(GGUFFileError, match=f"^{broken}: the file is truncated: tensor "):
        load_model(broken, dtype=torch.bfloat16, quantization="auto")


def test_an_unknown_architecture_is_refused_naming_the_file(catalogue_gguf, tmp_path) -> None:
    broken = with_metadata_value(
        catalogue_gguf(SMOLLM2), tmp_path / "bloom.gguf", "general.architecture", "bloom"
    )
    with pytest.raises(GGUFFileError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    assert str(caught.value) == (
        f"{broken}: architecture 'bloom' is not supported by the engine; "
        "supported: llama, qwen2, qwen3, gemma3"
    )


def test_an_unsupported_quantization_type_names_the_file_the_tensor_and_the_type(
    catalogue_gguf, tmp_path
) -> None:
    iq4_nl = int(gguf.GGMLQuantizationType.IQ4_NL)
    broken = with_tensor_type(
        catalogue_gguf(SMOLLM2), tmp_path / "iq.gguf", "blk.3.ffn_up.weight", iq4_nl
    )
    with pytest.raises(GGUFFileError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    assert str(caught.value).startswith(
        f"{broken}: tensor 'blk.3.ffn_up.weight' is of quantization type IQ4_NL, which the "
        "engine cannot load; supported: Q4_0, Q4_1, Q4_K, "
    )


def test_a_tensor_whose_shape_disagrees_with_the_config_is_refused(
    catalogue_gguf, tmp_path
) -> None:
    broken = with_metadata_value(
        catalogue_gguf(SMOLLM2), tmp_path / "ffn.gguf", "llama.feed_forward_length", 1024
    )
    with pytest.raises(GGUFFileError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    message = str(caught.value)
    assert message.startswith(f"{broken}: tensor 'blk.0.ffn_")
    assert "but the model's config makes layers.0.mlp." in message


def test_a_prepared_directory_whose_config_disagrees_with_its_gguf_is_refused(
    chat_model_dir, tmp_path
) -> None:
    config = json.loads((chat_model_dir / "config.json").read_text())
    config["num_key_value_heads"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.gguf").symlink_to((chat_model_dir / "model.gguf").resolve())
    with pytest.raises(GGUFFileError, match=r"tensor 'blk\.0\.attn_k\.weight' has shape"):
        load_model(tmp_path, dtype=torch.bfloat16)

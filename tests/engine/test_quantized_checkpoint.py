"""AWQ, GPTQ and compressed-tensors int4 checkpoints loaded into the engine's int4 layers, on
checkpoints the real libraries made (harness/quantized_checkpoints.py, run by `make test-models`).

The checkpoints: one random Qwen2-shaped model (2 layers, hidden 256, SmolLM2's vocabulary)
quantized in groups of 128 by AutoAWQ (GEMM), GPTQModel (classic "gptq" asymmetric with desc_act,
and "gptq_v2" symmetric) and llmcompressor (compressed-tensors pack-quantized, by GPTQ and by
AWQ). References: each library's own dequantization of its int4 layers, saved beside the
checkpoint by the quantizers' venv (the libraries are not in the project's venv), and transformers'
float32 model of those dequantized weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from harness.quantized_checkpoints import FORMATS, quantized_dir
from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.engine import Engine
from inference.engine.layers.act_order import ActOrderLinear
from inference.engine.layers.quantization import Int4Linear, Int8Linear, weight_formats
from inference.engine.loader import load_model

pytestmark = pytest.mark.usefixtures("torch_threads_on_free_cores")

ALL_FORMATS = list(FORMATS)
PROMPT = "The capital of France is Paris, and the capital of Germany is"
# checkpoint projection -> (engine layer, shard index)
FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
NUM_INT4_LAYERS = 2 * 4  # qkv, o, gate_up, down per layer; the tied table stays float


@pytest.fixture(scope="session")
def quantized_checkpoint():
    """Factory: `quantized_checkpoint("gptq")` -> the directory of that test checkpoint.

    NOTE: fails rather than skips when it is missing: `make test-models` makes them, so a
    missing one is a broken set-up, and a skip would let these tests pass without running.
    """
    directory = quantized_dir()

    def find(name: str) -> Path:
        path = directory / name
        if not (path / "reference" / "dequantized.safetensors").is_file():
            pytest.fail(
                f"the {name} test checkpoint is not in {directory}; make it with: "
                "python -m harness.quantized_checkpoints  (make test-models makes it)",
                pytrace=False,
            )
        return path

    return find


@pytest.fixture(scope="module")
def loaded(quantized_checkpoint):
    """Factory: `loaded("awq", torch.float32, "auto")` -> load_model's result, once each."""
    models = {}

    def load(name: str, dtype: torch.dtype, quantization: str = "auto"):
        key = (name, dtype, quantization)
        if key not in models:
            # NOTE: float32 is the exactness reference: PyTorch's format keeps the checkpoint's
            # scales and zeros as they are (the native one refits them to its bf16 grid).
            models[key] = load_model(
                quantized_checkpoint(name),
                dtype=dtype,
                quantization=quantization,
                native_kernels=dtype != torch.float32,
            )
        return models[key]

    return load


def reference_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "reference" / "dequantized.safetensors")


def engine_rows(model, key: str) -> tuple[str, slice]:
    """The engine layer and rows holding checkpoint weight `key` (model.layers.0.mlp.up_proj...)."""
    module, _, projection = key.removeprefix("model.").removesuffix(".weight").rpartition(".")
    if projection not in FUSED:
        return f"{module}.{projection}", slice(None)
    fused, shard = FUSED[projection]
    args = model.args
    sizes = {
        "qkv_proj": [args.num_heads * args.head_dim] + [args.num_kv_heads * args.head_dim] * 2,
        "gate_up_proj": [args.intermediate_size] * 2,
    }[fused]
    start = sum(sizes[:shard])
    return f"{module}.{fused}", slice(start, start + sizes[shard])


def dequantized(layer) -> torch.Tensor:
    if isinstance(layer, torch.nn.Linear):
        return layer.weight.detach().float()
    return layer.dequantize_rows(0, layer.out_features, torch.float32)


def reference_model(checkpoint: Path):
    """transformers' float32 model of the checkpoint's float tensors and the library's own
    dequantized int4 weights."""
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("quantization_config")
    config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    names = set(model.state_dict())
    state = {}
    for path in checkpoint.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            keys = [key for key in f.keys() if key in names]  # noqa: SIM118 (not a dict)
            state |= {key: f.get_tensor(key).float() for key in keys}
    state |= reference_weights(checkpoint)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected  # the tied table
    model.tie_weights()
    return model


def prompt_ids(checkpoint: Path) -> list[int]:
    return AutoTokenizer.from_pretrained(str(checkpoint))(PROMPT)["input_ids"]


# --- the int4 layers against each library's own dequantization --------------------------------


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_auto_keeps_each_int4_layer_exactly_as_the_library_dequantizes_it(
    loaded, quantized_checkpoint, name
) -> None:
    """float32: w = s (q - z) is exact there, so the engine's weights are the library's, bit
    for bit (fused q/k/v and gate/up rows, AWQ's nibble order, GPTQ's stored zeros, act-order)."""
    model = loaded(name, torch.float32).model
    references = reference_weights(quantized_checkpoint(name))
    assert len(references) == 7 * 2  # q, k, v, o, gate, up, down per layer
    for key, expected in references.items():
        layer_name, rows = engine_rows(model, key)
        layer = model.get_submodule(layer_name)
        assert isinstance(layer, Int4Linear | ActOrderLinear), key
        assert torch.equal(dequantized(layer)[rows], expected), key


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_float32_logits_match_transformers_on_the_librarys_dequantized_weights(
    quantized_checkpoint, name
) -> None:
    checkpoint = quantized_checkpoint(name)
    token_ids = prompt_ids(checkpoint)
    with torch.inference_mode():
        expected = reference_model(checkpoint)(torch.tensor([token_ids])).logits[0]
    config = EngineConfig(
        checkpoint, dtype=torch.float32, kv_cache_mb=4, max_model_len=64, native_kernels=False
    )
    runner = ModelRunner(config)
    assert weight_formats(runner.model) == {"int4": NUM_INT4_LAYERS, "float": 1}
    logits = runner.execute([BatchEntry(token_ids, 0, [0], num_logits=len(token_ids))])
    assert (logits - expected).abs().max() < 1e-4


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_served_in_bf16_the_layers_are_int4_and_take_about_the_checkpoints_bytes(
    loaded, quantized_checkpoint, name
) -> None:
    checkpoint = quantized_checkpoint(name)
    result = loaded(name, torch.bfloat16)
    model, report = result.model, result.report
    assert weight_formats(model) == report.formats == {"int4": NUM_INT4_LAYERS, "float": 1}
    files = sorted(checkpoint.glob("*.safetensors"))
    assert report.checkpoint_bytes == sum(path.stat().st_size for path in files)
    assert 0.85 < report.weight_ratio < 1.15
    # NOTE: the float table is most of this model's bytes: the int4 layers on their own too
    int4_modules = [m for m in model.modules() if isinstance(m, Int4Linear | ActOrderLinear)]
    layer_bytes = sum(
        buffer.numel() * buffer.element_size()
        for module in int4_modules
        for buffer in module.buffers(recurse=False)
    )
    assert 0.85 < layer_bytes / int4_tensor_bytes(files) < 1.15


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_served_in_bf16_the_weights_are_the_librarys_within_bf16_scale_rounding(
    loaded, quantized_checkpoint, name
) -> None:
    """The native int4 format keeps the codes with a bf16 scale s and a zero point in sixteenths
    of s: a weight moves by at most 15 |scale - s| + s / 32 (quantization.py), and no group of
    these checkpoints needs refitting. (PyTorch's format, on CPUs without the native kernel,
    rounds the scale and a zero of at most 15 s to bf16: within the same bound.)"""
    model = loaded(name, torch.bfloat16).model
    for key, expected in reference_weights(quantized_checkpoint(name)).items():
        layer_name, rows = engine_rows(model, key)
        layer = model.get_submodule(layer_name)
        int4 = layer.layer if isinstance(layer, ActOrderLinear) else layer
        assert int4.num_refitted_groups == 0, key
        columns = torch.arange(int4.in_features)
        if isinstance(layer, ActOrderLinear):  # column c sits at the place order[j] == c
            columns[layer.input_order.long()] = torch.arange(int4.in_features)
        scales = int4.scales if int4.is_native else int4.scales_and_zeros[..., 0]
        step = scales[columns // int4.group_size].T[rows].float().abs()
        # |scale - s| <= 2^-9 |scale| (bf16 rounding), bounded by 2^-8 s
        bound = step * (15 * 2**-8 + 1 / 32) + 1e-7
        assert ((dequantized(layer)[rows] - expected).abs() <= bound).all(), key


def test_act_order_layers_permute_their_input_and_the_others_do_not(loaded) -> None:
    """GPTQ's desc_act puts a group's columns anywhere (g_idx); the engine stores them sorted
    by group and permutes the input the same way. In order: plain Int4Linear layers."""
    for name in ALL_FORMATS:
        model = loaded(name, torch.bfloat16).model
        layers = [model.get_submodule(n) for n, m in model.named_modules() if n.endswith("_proj")]
        expected = ActOrderLinear if name == "gptq" else Int4Linear
        assert all(type(layer) is expected for layer in layers), name


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_greedy_generation_from_int4_matches_transformers_on_the_dequantized_weights(
    quantized_checkpoint, name
) -> None:
    checkpoint = quantized_checkpoint(name)
    token_ids = prompt_ids(checkpoint)
    with torch.inference_mode():
        expected = (
            reference_model(checkpoint)
            .generate(
                torch.tensor([token_ids]), max_new_tokens=8, do_sample=False, eos_token_id=None
            )[0, len(token_ids) :]
            .tolist()
        )
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for dtype in ("float32", "bfloat16"):
        config = EngineConfig(
            checkpoint,
            dtype=dtype,
            kv_cache_mb=4,
            max_model_len=64,
            native_kernels=dtype != "float32",  # the exactness reference, as in `loaded`
        )
        engine = Engine(config)
        try:
            (result,) = engine.generate([token_ids], greedy)
        finally:
            engine.shutdown()
        assert len(result.token_ids) == 8
        if dtype == "float32":  # NOTE: bf16 rounds differently; float32 is the exact path
            assert result.token_ids == expected


# --- the other quantization settings -----------------------------------------------------------


@pytest.mark.parametrize("name", ["gptq", "compressed-tensors-awq"])
def test_none_dequantizes_the_int4_layers_to_the_librarys_weights(
    loaded, quantized_checkpoint, name
) -> None:
    model = loaded(name, torch.float32, "none").model
    assert weight_formats(model) == {"float": NUM_INT4_LAYERS + 1}
    for key, expected in reference_weights(quantized_checkpoint(name)).items():
        layer_name, rows = engine_rows(model, key)
        assert torch.equal(dequantized(model.get_submodule(layer_name))[rows], expected), key


@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_int8_requantizes_each_dequantized_row_within_half_a_step(
    loaded, quantized_checkpoint, name
) -> None:
    model = loaded(name, torch.bfloat16, "int8").model
    assert weight_formats(model) == {"int8": NUM_INT4_LAYERS + 1}  # the table too
    for key, expected in reference_weights(quantized_checkpoint(name)).items():
        layer_name, rows = engine_rows(model, key)
        layer = model.get_submodule(layer_name)
        assert isinstance(layer, Int8Linear)
        row_max = expected.abs().amax(dim=1, keepdim=True)
        # half a step of row_max / 127, the step's own bf16 rounding included
        assert ((dequantized(layer)[rows] - expected).abs() <= row_max / 254 * (1 + 2**-8)).all(), (
            key
        )


def test_int4_keeps_the_checkpoints_codes_and_quantizes_only_the_float_table(loaded) -> None:
    auto = loaded("awq", torch.bfloat16).model
    forced = loaded("awq", torch.bfloat16, "int4").model
    assert weight_formats(forced) == {"int4": NUM_INT4_LAYERS, "int8": 1}
    for name, layer in auto.named_modules():
        if isinstance(layer, Int4Linear):
            assert torch.equal(forced.get_submodule(name).weight_int4, layer.weight_int4), name


# --- bad input ---------------------------------------------------------------------------------


def edited_copy(source: Path, target: Path, edit) -> Path:
    """`source`'s checkpoint in `target` (weights linked) with `edit` applied to config.json."""
    target.mkdir()
    for path in source.iterdir():
        if path.is_file() and path.name != "config.json":
            (target / path.name).symlink_to(path)
    config = json.loads((source / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def set_quantization(**values):
    return lambda config: config["quantization_config"].update(values)


def set_ct_weights(**values):
    def edit(config):
        for group in config["quantization_config"]["config_groups"].values():
            group["weights"].update(values)

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "reason"),
    [
        (
            "gptq",
            set_quantization(bits=8),
            "gptq checkpoint of 8-bit weights; the engine loads 4-bit ones only",
        ),
        (
            "awq",
            set_quantization(bits=3),
            "awq checkpoint of 3-bit weights; the engine loads 4-bit ones only",
        ),
        (
            "awq",
            set_quantization(quant_method="bitsandbytes"),
            "quantization_config.quant_method "
            "'bitsandbytes' is not supported; the engine loads int4 checkpoints of awq, gptq, "
            "compressed-tensors",
        ),
        (
            "awq",
            set_quantization(version="gemv"),
            "AWQ version 'gemv' is not supported; the engine reads 'gemm'",
        ),
        (
            "gptq",
            set_quantization(checkpoint_format="marlin"),
            "GPTQ checkpoint_format 'marlin' is not supported; the engine reads gptq, gptq_v2",
        ),
        (
            "gptq-v2",
            set_quantization(group_size=-1),
            "group_size -1 is not supported; the "
            "engine's int4 layers take groups of 32, 64, 128, 256",
        ),
        (
            "compressed-tensors-gptq",
            set_ct_weights(num_bits=8),
            "compressed-tensors weights of "
            "8 bits, type 'int', strategy 'group' (group_0); the engine loads 4-bit int weights in "
            "groups",
        ),
    ],
)
def test_a_config_the_engine_cannot_load_is_refused_naming_the_file_and_the_reason(
    quantized_checkpoint, tmp_path, name, edit, reason
) -> None:
    broken = edited_copy(quantized_checkpoint(name), tmp_path / name, edit)
    with pytest.raises(ValueError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    assert str(caught.value) == f"{broken / 'config.json'}: {reason}"


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_int4_tensors_whose_shape_disagrees_with_the_config_are_refused(
    quantized_checkpoint, tmp_path, name
) -> None:
    def widen_the_mlp(config):
        config["intermediate_size"] = 1024

    broken = edited_copy(quantized_checkpoint(name), tmp_path / name, widen_the_mlp)
    with pytest.raises(ValueError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    message = str(caught.value)
    assert message.startswith(f"{broken / 'model.safetensors'}: tensor 'model.layers.0.mlp.")
    assert "but the model's config makes model.layers.0.mlp." in message


def test_fused_projections_with_different_act_order_groups_are_refused(
    quantized_checkpoint, tmp_path
) -> None:
    source = quantized_checkpoint("gptq")
    broken = tmp_path / "gptq"
    shutil.copytree(source, broken, ignore=shutil.ignore_patterns("reference"))
    tensors = load_file(broken / "model.safetensors")
    key = "model.layers.1.self_attn.k_proj.g_idx"
    tensors[key] = tensors[key].flip(0)  # still 128 columns a group, in another order
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as caught:
        load_model(broken, dtype=torch.bfloat16)
    assert str(caught.value) == (
        f"{broken / 'model.safetensors'}: the projections of layers.1.self_attn.qkv_proj have "
        "different act-order groups (g_idx)"
    )


def int4_tensor_bytes(files: list[Path]) -> int:
    """Bytes of the int4 layers' tensors in the checkpoint: codes, scales, zeros, group
    indices, and those layers' biases."""
    suffixes = ("qweight", "qzeros", "scales", "g_idx")
    suffixes += ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
    sizes = {"I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4}
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            int4_prefixes = {key.rpartition(".")[0] for key in keys if key.endswith(suffixes)}
            for key in keys:
                prefix, _, suffix = key.rpartition(".")
                if suffix in suffixes or (suffix == "bias" and prefix in int4_prefixes):
                    tensor = f.get_slice(key)
                    total += torch.Size(tensor.get_shape()).numel() * sizes[tensor.get_dtype()]
    return total

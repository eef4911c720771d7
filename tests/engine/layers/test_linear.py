"""oneDNN-packed bf16 linear layers: same results as F.linear, swapped in for bf16 CPU models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import BatchEntry, EngineConfig, ModelRunner, model_runner
from inference.engine.kernels import linear_bf16
from inference.engine.layers.linear import PackedLinear, can_pack, pack_linear_layers
from inference.engine.layers.quantization import model_weight_bytes

needs_onednn_bf16 = pytest.mark.skipif(
    not can_pack(torch.bfloat16, "cpu"), reason="this CPU has no oneDNN bf16 kernels"
)


@needs_onednn_bf16
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("has_bias", [False, True])
def test_a_packed_layer_gives_bitwise_the_results_of_f_linear(num_tokens, has_bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=has_bias).to(torch.bfloat16)
    x = torch.randn(2, num_tokens, 96, dtype=torch.bfloat16)
    packed = PackedLinear(linear)
    assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
    assert packed(x).shape == (2, num_tokens, 160)


def test_only_bf16_models_on_cpu_are_packed():
    assert not can_pack(torch.float32, "cpu")
    assert not can_pack(torch.bfloat16, "cuda")


@needs_onednn_bf16
def test_packing_swaps_bf16_linears_and_keeps_the_weight_bytes():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False))
    model = model.to(torch.bfloat16)
    before = model_weight_bytes(model)
    assert pack_linear_layers(model) == 2
    assert [type(m) for m in model] == [PackedLinear, nn.ReLU, PackedLinear]
    assert model_weight_bytes(model) == before


@needs_onednn_bf16
def test_a_bf16_runner_packs_its_layers_and_computes_the_same_logits(tiny_model_dir, monkeypatch):
    def logits(runner: ModelRunner) -> torch.Tensor:
        prompt = list(range(3, 40))
        runner.execute([BatchEntry(prompt, 0, [0, 1, 2])])
        return runner.execute([BatchEntry([7], len(prompt), [0, 1, 2])])

    def make() -> ModelRunner:
        config = EngineConfig(
            tiny_model_dir("qwen2"),
            dtype=torch.bfloat16,
            kv_cache_mb=1,
            block_size=16,
            max_model_len=64,
        )
        return ModelRunner(config)

    # NOTE: on CPUs with AMX the runner prefers the AMX kernel's layers; this test is about oneDNN.
    monkeypatch.setattr(linear_bf16, "is_supported", lambda *args: False)
    packed_runner = make()
    assert isinstance(packed_runner.model.layers[0].self_attn.qkv_proj, PackedLinear)
    monkeypatch.setattr(model_runner, "can_pack", lambda *args: False)
    plain_runner = make()
    assert type(plain_runner.model.layers[0].self_attn.qkv_proj) is nn.Linear
    assert torch.equal(logits(packed_runner), logits(plain_runner))

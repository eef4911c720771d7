"""The AMX bf16 matmul (csrc/linear_bf16.c) in `AmxLinear` layers: F.linear's results, swapped in
for bf16 models on AMX CPUs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine.kernels import linear_bf16
from inference.engine.layers.linear import AmxEmbedding, AmxLinear, PackedLinear, pack_model_for_amx
from inference.engine.layers.quantization import model_weight_bytes
from tests.engine.real_model import bfloat16_runner

pytestmark = pytest.mark.skipif(
    not linear_bf16.is_supported(16, 32, torch.bfloat16, "cpu"),
    reason="needs a CPU with AMX (amx_tile, amx_bf16), Linux and a C compiler",
)


def bf16_linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)


# 1 token (decode), a partial tile of rows, exactly one tile, one past it, two row blocks and a
# prefill chunk; 48 outputs = three column tiles (an odd one at the end).
@pytest.mark.parametrize("num_tokens", [1, 5, 16, 17, 33, 300])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 48), (576, 960)])
@pytest.mark.parametrize("has_bias", [False, True])
def test_an_amx_layer_gives_the_results_of_f_linear(
    num_tokens, in_features, out_features, has_bias
):
    linear = bf16_linear(in_features, out_features, has_bias, seed=num_tokens)
    x = torch.randn(num_tokens, in_features).to(torch.bfloat16)
    expected = F.linear(x, linear.weight, linear.bias)
    out = AmxLinear(linear.weight, linear.bias)(x)
    assert out.shape == expected.shape and out.dtype == torch.bfloat16
    # Both sum bf16 products in float32 and round once; only the order of the sums may
    # differ, so a rare result lands one bf16 step away.
    assert torch.allclose(out.float(), expected.float(), rtol=2**-7, atol=1e-3)
    assert (out == expected).float().mean() > 0.99


def test_leading_dimensions_are_kept():
    linear = bf16_linear(64, 32, bias=False)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    assert AmxLinear(linear.weight, None)(x).shape == (2, 3, 32)


def test_an_input_of_the_wrong_width_is_refused_before_the_kernel_reads_it():
    layer = AmxLinear(bf16_linear(64, 32, bias=False).weight, None)
    with pytest.raises(ValueError, match="input of 96 features"):
        layer(torch.zeros(2, 96, dtype=torch.bfloat16))


def test_rows_read_back_from_the_packed_layout_are_the_original_weight_rows():
    linear = bf16_linear(96, 64, bias=False)
    layer = AmxLinear(linear.weight, None)
    row_ids = torch.tensor([[0, 17, 63], [5, 5, 16]])
    assert torch.equal(layer.weight_rows(row_ids), linear.weight[row_ids])


def test_shapes_that_do_not_fit_amx_tiles_are_refused():
    assert linear_bf16.is_supported(48, 64)
    assert not linear_bf16.is_supported(40, 64) and not linear_bf16.is_supported(48, 48)
    with pytest.raises(ValueError, match="does not fit AMX tiles"):
        AmxLinear(torch.zeros(40, 64, dtype=torch.bfloat16), None)


def test_packing_a_model_swaps_fitting_linears_and_the_tied_embedding_once():
    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(64, 32)
            self.proj = nn.Linear(32, 48)
            self.odd = nn.Linear(32, 40)  # 40 outputs: not a whole number of tiles
            self.lm_head = None  # tied

    model = TinyLM().to(torch.bfloat16)
    table = model.embed_tokens.weight.detach().clone()
    before = model_weight_bytes(model)
    assert pack_model_for_amx(model) == 2
    assert type(model.proj) is AmxLinear and type(model.odd) is nn.Linear
    assert (
        isinstance(model.embed_tokens, AmxEmbedding) and model.lm_head is model.embed_tokens.table
    )
    assert model_weight_bytes(model) == before  # one packed copy replaces each weight
    token_ids = torch.tensor([3, 0, 63])
    assert torch.equal(model.embed_tokens(token_ids), table[token_ids])
    hidden = torch.randn(2, 32).to(torch.bfloat16)
    assert torch.allclose(
        model.lm_head(hidden).float(), F.linear(hidden, table).float(), rtol=2**-7
    )


@pytest.mark.parametrize("kind", ["qwen2", "llama"])  # untied with biases / tied embeddings
def test_a_bf16_runner_on_amx_computes_the_logits_of_the_onednn_runner(
    tiny_model_dir, monkeypatch, kind
):
    def logits(runner: ModelRunner) -> torch.Tensor:
        prompt = list(range(3, 40))
        prefill = runner.execute([BatchEntry(prompt, 0, [0, 1, 2])])
        return torch.cat([prefill, runner.execute([BatchEntry([7], len(prompt), [0, 1, 2])])])

    def make() -> ModelRunner:
        config = EngineConfig(
            tiny_model_dir(kind),
            dtype=torch.bfloat16,
            kv_cache_mb=1,
            block_size=16,
            max_model_len=64,
        )
        return ModelRunner(config)

    amx_runner = make()
    assert isinstance(amx_runner.model.layers[0].mlp.gate_up_proj, AmxLinear)
    monkeypatch.setattr(linear_bf16, "is_supported", lambda *args: False)
    onednn_runner = make()
    assert isinstance(onednn_runner.model.layers[0].mlp.gate_up_proj, PackedLinear)
    amx_logits, onednn_logits = logits(amx_runner), logits(onednn_runner)
    assert torch.allclose(amx_logits, onednn_logits, atol=0.05, rtol=0.02)
    assert torch.equal(amx_logits.argmax(-1), onednn_logits.argmax(-1))


@pytest.mark.real_weights
@pytest.mark.usefixtures("torch_threads_on_free_cores")
def test_the_real_model_on_amx_predicts_like_the_onednn_model(
    chat_model_dir, real_tokenizer, monkeypatch
):
    # Next-token predictions over a real paragraph (one prefill): AMX and oneDNN bf16 layers
    # differ only in the order of float32 sums.
    text = "The printing press was invented in the fifteenth century and changed how " * 8
    prompt = real_tokenizer(text)["input_ids"]

    def predictions() -> tuple[torch.Tensor, torch.Tensor]:
        runner = bfloat16_runner(chat_model_dir, kv_cache_mb=16, max_model_len=256)
        entry = BatchEntry(prompt, 0, list(range(16)), num_logits=len(prompt))
        logits = runner.execute([entry])
        return logits.log_softmax(-1), type(runner.model.layers[0].self_attn.o_proj)

    amx_logprobs, amx_type = predictions()
    monkeypatch.setattr(linear_bf16, "is_supported", lambda *args: False)
    onednn_logprobs, onednn_type = predictions()
    assert (amx_type, onednn_type) == (AmxLinear, PackedLinear)
    agreement = (amx_logprobs.argmax(-1) == onednn_logprobs.argmax(-1)).float().mean()
    assert agreement >= 0.95
    # measured: agreement 1.0, log-probabilities at most 0.0625 apart
    assert (amx_logprobs - onednn_logprobs).abs().max() < 0.5

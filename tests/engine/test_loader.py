"""Loading Hugging Face checkpoints into the fused Llama-family model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from inference.engine.loader import load_hf_config, load_model


def _checkpoint(directory) -> dict[str, torch.Tensor]:
    weights = {}
    for path in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(path))
    return weights


def test_q_k_v_and_gate_up_are_fused_in_checkpoint_order(tiny_model_dir):
    directory = tiny_model_dir("qwen2")
    model = load_model(directory, dtype=torch.float32).model
    ckpt = _checkpoint(directory)
    prefix = "model.layers.1."
    for kind in ("weight", "bias"):
        expected = torch.cat(
            [ckpt[f"{prefix}self_attn.{name}_proj.{kind}"] for name in ("q", "k", "v")]
        )
        torch.testing.assert_close(getattr(model.layers[1].self_attn.qkv_proj, kind), expected)
    expected = torch.cat(
        [ckpt[f"{prefix}mlp.gate_proj.weight"], ckpt[f"{prefix}mlp.up_proj.weight"]]
    )
    torch.testing.assert_close(model.layers[1].mlp.gate_up_proj.weight, expected)
    torch.testing.assert_close(model.lm_head.weight, ckpt["lm_head.weight"])
    assert model.layers[1].self_attn.o_proj.bias is None  # Qwen2: q/k/v biases only


def test_tied_embeddings_reuse_the_embedding_matrix_for_logits(tiny_model_dir):
    model = load_model(tiny_model_dir("llama"), dtype=torch.float32).model
    assert model.lm_head is None
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ model.embed_tokens.weight.T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weights_are_cast_to_the_requested_dtype(tiny_model_dir, dtype):
    model = load_model(tiny_model_dir("mistral"), dtype=dtype).model
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert not any(p.requires_grad for p in model.parameters())
    # NOTE: the RoPE frequencies stay float32 whatever the weight dtype, as in transformers.
    assert model.rotary_emb.inv_freq.dtype == torch.float32


def test_sharded_checkpoint_loads_the_same_weights_as_a_single_file(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    directory = tiny_model_dir("qwen2")
    hf_model = AutoModelForCausalLM.from_pretrained(directory)
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    single = load_model(directory, dtype=torch.float32).model.state_dict()
    sharded = load_model(tmp_path, dtype=torch.float32).model.state_dict()
    assert single.keys() == sharded.keys()
    for name, tensor in single.items():
        torch.testing.assert_close(sharded[name], tensor)


def test_unsupported_model_type_raises_value_error_naming_it(tiny_model_dir, tmp_path):
    shutil.copytree(tiny_model_dir("qwen2"), tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        load_model(tmp_path, dtype=torch.float32)


def test_missing_weight_raises_value_error_naming_it(tiny_model_dir, tmp_path):
    from safetensors.torch import save_file

    shutil.copytree(tiny_model_dir("qwen2"), tmp_path, dirs_exist_ok=True)
    weights = _checkpoint(tmp_path)
    del weights["model.layers.0.self_attn.v_proj.weight"]
    for path in tmp_path.glob("*.safetensors"):
        path.unlink()
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"missing weights: layers\.0\.self_attn\.qkv_proj\.weight"
    ):
        load_model(tmp_path, dtype=torch.float32)


def test_directory_without_config_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_hf_config(tmp_path)

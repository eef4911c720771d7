"""Loading Hugging Face checkpoints into the engine's models (fused q/k/v and gate/up)."""

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


def _rewrite_checkpoint(source, directory, edit) -> None:
    """Copy checkpoint `source` to `directory` with its weights passed through `edit`."""
    from safetensors.torch import save_file

    shutil.copytree(source, directory, dirs_exist_ok=True)
    weights = _checkpoint(directory)
    for path in directory.glob("*.safetensors"):
        path.unlink()
    edit(weights)
    save_file(weights, directory / "model.safetensors")


def test_qwen3_checkpoint_without_its_q_norm_is_refused_naming_the_weight(tiny_model_dir, tmp_path):
    def drop_q_norm(weights):
        del weights["model.layers.1.self_attn.q_norm.weight"]

    _rewrite_checkpoint(tiny_model_dir("qwen3"), tmp_path, drop_q_norm)
    with pytest.raises(
        ValueError, match=rf"{tmp_path} is missing weights: layers\.1\.self_attn\.q_norm\.weight"
    ):
        load_model(tmp_path, dtype=torch.float32)


def test_weight_of_another_shape_than_the_config_says_is_refused_naming_file_and_weight(
    tiny_model_dir, tmp_path
):
    def shrink_k_norm(weights):
        key = "model.layers.0.self_attn.k_norm.weight"
        weights[key] = weights[key][:16].clone()

    _rewrite_checkpoint(tiny_model_dir("gemma3"), tmp_path, shrink_k_norm)
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\.self_attn\.k_norm\.weight' in model\.safetensors has shape "
        r"\(16,\), expected \(32,\)",
    ):
        load_model(tmp_path, dtype=torch.float32)


def test_weight_the_config_has_no_place_for_is_refused_naming_file_and_weight(
    tiny_model_dir, tmp_path
):
    """A Qwen3 checkpoint labelled qwen2: its q/k norms do not belong to a Qwen2 model."""
    _rewrite_checkpoint(tiny_model_dir("qwen3"), tmp_path, lambda weights: None)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "qwen2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"_norm\.weight' in model\.safetensors has no place"):
        load_model(tmp_path, dtype=torch.float32)


def test_gemma3_norms_load_under_their_transformers_names(tiny_model_dir):
    directory = tiny_model_dir("gemma3")
    model = load_model(directory, dtype=torch.float32).model
    ckpt = _checkpoint(directory)
    for name, param in model.named_parameters():
        if "norm" in name:
            assert torch.equal(param, ckpt[f"model.{name}"]), name
    assert model.lm_head is None  # tied: the checkpoint's lm_head copy is skipped

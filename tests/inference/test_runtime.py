"""inference.runtime: one engine per process, reloaded on activation without a restart."""

from __future__ import annotations

import threading

import pytest

from inference import runtime
from inference.engine.core.sampling_params import SamplingParams
from inference.models import ModelConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.real_weights]

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(autouse=True)
def fresh_runtime(chat_model_dir):
    runtime.stop_engine()
    yield
    runtime.stop_engine()


def test_without_a_configuration_the_default_model_is_served() -> None:
    with pytest.raises(runtime.EngineUnavailable, match="not started"):
        runtime.get_engine()
    runtime.start_engine(wait=True)
    assert runtime.engine_status() == {
        "status": "ready",
        "config": "default",
        "model": "smollm2-135m-instruct",
        "error": "",
    }
    [result] = runtime.get_engine().generate(["The capital of France is"], GREEDY)
    assert result.usage.completion_tokens == 8


def test_activating_a_configuration_swaps_the_engine_and_in_flight_requests_finish() -> None:
    runtime.start_engine(wait=True)
    old_engine = runtime.get_engine()
    results = []
    long_request = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    worker = threading.Thread(
        target=lambda: results.extend(old_engine.generate(["Tell me a story."], long_request))
    )
    worker.start()
    config = ModelConfig.objects.create(name="small-batch", max_num_seqs=4, kv_cache_mb=256)
    config.activate()
    runtime.reload_engine(config, wait=True)
    new_engine = runtime.get_engine()
    assert new_engine is not old_engine
    assert runtime.engine_status()["config"] == "small-batch"
    assert new_engine.config.max_num_seqs == 4
    worker.join(timeout=120)
    assert results[0].finish_reason == "length"
    assert results[0].usage.completion_tokens == 48


def test_a_configuration_that_fails_to_load_leaves_the_previous_engine_serving(tmp_path) -> None:
    runtime.start_engine(wait=True)
    serving = runtime.get_engine()
    broken = ModelConfig(name="broken", source=str(tmp_path))  # no model in that directory
    runtime.reload_engine(broken, wait=True)
    assert runtime.get_engine() is serving
    status = runtime.engine_status()
    assert status["status"] == "ready"
    assert status["config"] == "default"
    assert "loading 'broken' failed" in status["error"]
    assert "has no config.json" in status["error"]


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ("truncated", "the file is truncated: tensor "),
        ("unknown type", "tensor 'blk.3.ffn_up.weight' is of quantization type IQ4_NL"),
        ("wrong shape", "but the model's config makes layers.0.mlp."),
    ],
)
def test_a_broken_gguf_is_refused_and_the_previous_engine_keeps_serving(
    settings, tmp_path, broken, reason
) -> None:
    import gguf

    from inference.model_files import bundled_chat_gguf
    from tests.engine.broken_gguf import truncated_copy, with_metadata_value, with_tensor_type

    source, path = bundled_chat_gguf(), tmp_path / "broken.gguf"
    if broken == "truncated":
        truncated_copy(source, path, source.stat().st_size - 4096)
    elif broken == "unknown type":
        with_tensor_type(source, path, "blk.3.ffn_up.weight", gguf.GGMLQuantizationType.IQ4_NL)
    else:
        with_metadata_value(source, path, "llama.feed_forward_length", 1024)
    runtime.start_engine(wait=True)
    serving = runtime.get_engine()
    settings.MODELS_DIR = tmp_path / "models"  # where the broken file is prepared, if it is
    runtime.reload_engine(ModelConfig(name="broken", source=str(path)), wait=True)
    assert runtime.get_engine() is serving
    status = runtime.engine_status()
    assert (status["status"], status["config"]) == ("ready", "default")
    assert "loading 'broken' failed" in status["error"]
    assert str(path) in status["error"] and reason in status["error"]
    [result] = serving.generate(["The capital of France is"], GREEDY)
    assert result.usage.completion_tokens == 8


def test_a_failed_first_load_is_reported_by_get_engine(settings, tmp_path) -> None:
    settings.CACHET_MODEL = str(tmp_path)
    runtime.start_engine(wait=True)
    with pytest.raises(runtime.EngineUnavailable, match="could not be loaded"):
        runtime.get_engine()
    assert runtime.engine_status()["status"] == "error"

"""inference.runtime: one engine per process, reloaded on activation without a restart."""

from __future__ import annotations

import threading

import pytest

from inference import runtime
from inference.engine.core.sampling_params import SamplingParams
from inference.models import ModelConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

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
        "model": "SmolLM2-135M-Instruct",
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


def test_a_failed_first_load_is_reported_by_get_engine(settings, tmp_path) -> None:
    settings.CACHET_MODEL = str(tmp_path)
    runtime.start_engine(wait=True)
    with pytest.raises(runtime.EngineUnavailable, match="could not be loaded"):
        runtime.get_engine()
    assert runtime.engine_status()["status"] == "error"

"""Engine: the threaded API, with a fake runner (fast) and with the real SmolLM2 model (slow)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest
import torch

from inference.engine.config import EngineConfig
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.engine import Engine
from inference.engine.outputs import (
    Delta,
    EngineClosedError,
    PromptTooLongError,
    RequestFailedError,
    Usage,
)
from tests.engine.fakes import FakeRunner, FakeTokenizer, ScriptedRunner, reference_completion
from tests.engine.real_model import RealEngines, chat, float32_runner

GREEDY = SamplingParams(temperature=0, max_tokens=6)


def make_fake_engine(runner: FakeRunner | None = None, **config) -> Engine:
    runner = runner or FakeRunner()
    settings = {"block_size": runner.block_size, "max_model_len": runner.max_model_len}
    settings |= config
    return Engine(EngineConfig("unused", **settings), runner=runner, tokenizer=FakeTokenizer())


@pytest.fixture
def engine():
    engine = make_fake_engine()
    yield engine
    engine.shutdown()


def prompt(seed: int, length: int = 6) -> list[int]:
    return [3 + (seed * 7 + i * 3) % 26 for i in range(length)]


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def kv_is_idle(engine: Engine) -> bool:
    snapshot = engine.metrics.snapshot()
    return snapshot["kv_usage"] == 0 and snapshot["num_running"] == 0


# ---- fake runner ----


def test_a_batch_matches_the_reference_model(engine):
    prompts = [prompt(i, 3 + i) for i in range(8)]
    results = engine.generate(prompts, GREEDY)
    for p, result in zip(prompts, results, strict=True):
        assert result.token_ids == reference_completion(p, 6)
        assert result.finish_reason == "length"
        assert result.text == FakeTokenizer().decode(result.token_ids)
        assert result.usage.prompt_tokens == len(p)
        assert result.usage.completion_tokens == 6
        assert result.usage.ttft_s is not None and result.usage.ttft_s >= 0


def test_chunked_prefill_with_a_tiny_budget_gives_the_same_output():
    engine = make_fake_engine(max_num_batched_tokens=3, max_num_seqs=2)
    try:
        p = prompt(1, 20)
        assert engine.generate([p], GREEDY)[0].token_ids == reference_completion(p, 6)
    finally:
        engine.shutdown()


def test_a_repeated_prompt_hits_the_prefix_cache_unless_salted_differently(engine):
    p = prompt(2, 13)
    cold = engine.generate([p], GREEDY)[0]
    warm = engine.generate([p], GREEDY)[0]
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == 12  # 3 full blocks; the last token is always computed
    assert warm.token_ids == cold.token_ids
    salted = engine.generate([p], GREEDY, cache_salt="tenant-a")[0]
    assert salted.usage.cached_tokens == 0
    assert salted.token_ids == cold.token_ids
    assert engine.generate([p], GREEDY, cache_salt="tenant-a")[0].usage.cached_tokens == 12
    assert engine.metrics.snapshot()["prefix_cache_hit_rate"] == 24 / 52


def test_a_kv_cache_too_small_for_the_batch_preempts_and_still_completes():
    runner = FakeRunner(num_kv_blocks=10, max_model_len=32)
    engine = make_fake_engine(runner)
    try:
        prompts = [prompt(i, 6) for i in range(8)]
        params = SamplingParams(temperature=0, max_tokens=12)
        results = engine.generate(prompts, params)
        for p, result in zip(prompts, results, strict=True):
            assert result.token_ids == reference_completion(p, 12)
        assert engine.metrics.snapshot()["num_preemptions"] > 0
        assert sum(r.usage.num_preemptions for r in results) > 0
        assert kv_is_idle(engine)
    finally:
        engine.shutdown()


def test_abort_returns_kv_usage_to_idle_and_reports_abort():
    engine = make_fake_engine(FakeRunner(step_delay_s=0.01))
    try:
        outputs = []
        request_id = engine.submit(
            prompt(3), SamplingParams(temperature=0, max_tokens=50), on_output=outputs.append
        )
        wait_until(lambda: engine.metrics.snapshot()["kv_usage"] > 0)
        engine.abort(request_id)
        wait_until(lambda: outputs and isinstance(outputs[-1], Usage))
        assert outputs[-2].finish_reason == "abort"
        assert outputs[-1].completion_tokens < 50
        wait_until(lambda: kv_is_idle(engine))
        assert engine.metrics.snapshot()["num_requests_by_finish_reason"]["abort"] == 1
        engine.abort(request_id)  # already finished: nothing happens
        engine.abort("never-existed")
    finally:
        engine.shutdown()


async def test_stream_yields_deltas_then_usage(engine):
    items = [item async for item in engine.stream(prompt(4), GREEDY)]
    deltas, usage = items[:-1], items[-1]
    assert all(isinstance(d, Delta) for d in deltas)
    assert isinstance(usage, Usage)
    assert [t for d in deltas for t in d.token_ids] == reference_completion(prompt(4), 6)
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert usage.completion_tokens == 6


async def test_closing_a_stream_early_aborts_the_request():
    engine = make_fake_engine(FakeRunner(step_delay_s=0.01))
    try:
        stream = engine.stream(prompt(5), SamplingParams(temperature=0, max_tokens=200))
        async for item in stream:
            assert isinstance(item, Delta)
            break
        await stream.aclose()  # what a client disconnect does
        await asyncio.to_thread(wait_until, lambda: kv_is_idle(engine))
        assert engine.metrics.snapshot()["num_requests_by_finish_reason"]["abort"] == 1
    finally:
        engine.shutdown()


async def test_cancelling_the_consumer_aborts_the_request():
    engine = make_fake_engine(FakeRunner(step_delay_s=0.01))
    try:

        async def consume():
            async for _ in engine.stream(prompt(6), SamplingParams(temperature=0, max_tokens=200)):
                pass

        task = asyncio.create_task(consume())
        await asyncio.to_thread(wait_until, lambda: engine.metrics.snapshot()["kv_usage"] > 0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(wait_until, lambda: kv_is_idle(engine))
    finally:
        engine.shutdown()


def test_an_over_long_prompt_is_rejected_before_it_is_queued(engine):
    with pytest.raises(PromptTooLongError, match="prompt has 64 tokens but max_model_len is 64"):
        engine.submit([5] * 64, GREEDY)
    with pytest.raises(PromptTooLongError) as error:
        engine.stream([5] * 100, GREEDY)  # raises at the call, not on iteration
    assert (error.value.num_prompt_tokens, error.value.max_model_len) == (100, 64)
    assert isinstance(error.value, ValueError)
    assert not engine.core.scheduler.has_work


def test_generation_stops_at_max_model_len(engine):
    result = engine.generate([[5] * 60], SamplingParams(temperature=0, max_tokens=100))[0]
    assert result.finish_reason == "length"
    assert result.usage.completion_tokens == 4


def test_bad_requests_raise_value_errors(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], GREEDY)
    with pytest.raises(ValueError, match="outside"):
        engine.submit([1, 999], GREEDY)
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.submit([5], {"temperature": 0})
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        engine.generate([[5]], [GREEDY, GREEDY])


def test_a_duplicate_live_request_id_is_rejected():
    engine = make_fake_engine(FakeRunner(step_delay_s=0.01))
    try:
        engine.submit([5, 6], SamplingParams(max_tokens=100), request_id="chat-1")
        with pytest.raises(ValueError, match="already in use"):
            engine.submit([5, 6], GREEDY, request_id="chat-1")
    finally:
        engine.shutdown()


def test_text_prompts_are_tokenized(engine):
    result = engine.generate(["hello"], GREEDY)[0]
    assert result.token_ids == reference_completion(FakeTokenizer().encode("hello"), 6)


def test_stop_token_ids_end_the_request_without_text(engine):
    p = prompt(7)
    completion = reference_completion(p, 6)
    end = next(i for i in range(1, 6) if completion[i] not in completion[:i])
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[completion[end]])
    result = engine.generate([p], params)[0]
    assert result.token_ids == completion[: end + 1]
    assert result.finish_reason == "stop"
    assert result.text == FakeTokenizer().decode(completion[:end])


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_running():
    runner = FakeRunner()
    engine = make_fake_engine(runner)
    try:
        runner.num_failures_left = 1
        with pytest.raises(RequestFailedError, match="simulated kernel failure"):
            engine.generate([prompt(8)], GREEDY)
        assert kv_is_idle(engine)
        assert engine.generate([prompt(8)], GREEDY)[0].token_ids == reference_completion(
            prompt(8), 6
        )
        assert engine.metrics.snapshot()["num_requests_by_finish_reason"]["error"] == 1
    finally:
        engine.shutdown()


async def test_a_failing_step_reaches_the_stream_as_an_error():
    runner = FakeRunner()
    engine = make_fake_engine(runner)
    try:
        runner.num_failures_left = 1
        with pytest.raises(RequestFailedError):
            async for _ in engine.stream(prompt(9), GREEDY):
                pass
    finally:
        engine.shutdown()


def test_a_failing_output_callback_aborts_only_its_request(engine):
    def broken(item):
        raise RuntimeError("consumer gone")

    engine.submit(prompt(10), SamplingParams(temperature=0, max_tokens=50), on_output=broken)
    assert engine.generate([prompt(11)], GREEDY)[0].token_ids == reference_completion(prompt(11), 6)
    wait_until(lambda: kv_is_idle(engine))


def test_shutdown_aborts_running_requests_and_refuses_new_ones():
    engine = make_fake_engine(FakeRunner(step_delay_s=0.01))
    outputs = []
    engine.submit(prompt(12), SamplingParams(max_tokens=500), on_output=outputs.append)
    wait_until(lambda: outputs)
    assert engine.has_unfinished_requests()
    engine.shutdown()
    assert not engine.has_unfinished_requests()
    assert isinstance(outputs[-1], Usage)
    assert outputs[-2].finish_reason == "abort"
    with pytest.raises(EngineClosedError):
        engine.submit(prompt(12), GREEDY)


@pytest.mark.real_weights
def test_an_engine_shut_down_and_let_go_is_freed_at_once_without_a_garbage_collection(
    chat_model_dir,
):
    # NOTE: freed by reference counting, its weights and KV cache go when the last reference
    # does (a replaced engine after its drain), not at Python's next full collection.
    gc.collect()
    gc.disable()
    try:
        engine = Engine(EngineConfig(str(chat_model_dir), max_model_len=256, kv_cache_mb=16))
        [result] = engine.generate(["The capital of France is"], GREEDY)
        assert result.usage.completion_tokens == GREEDY.max_tokens
        freed = weakref.ref(engine)
        engine.shutdown()
        del engine, result
        assert freed() is None
    finally:
        gc.enable()


def test_the_engine_thread_sleeps_when_idle(engine):
    engine.generate([prompt(13)], GREEDY)
    num_steps = engine.runner.num_steps
    time.sleep(0.05)
    assert engine.runner.num_steps == num_steps


def test_the_engine_thread_runs_torch_with_the_configured_thread_count():
    engine = make_fake_engine(num_threads=1)
    seen = []

    def on_output(item):
        # NOTE: output callbacks run on the engine thread, the one that does the torch work.
        seen.append((threading.current_thread().name, torch.get_num_threads()))

    try:
        engine.submit(prompt(1), GREEDY, on_output=on_output)
        wait_until(lambda: any(isinstance(item, tuple) for item in seen) and kv_is_idle(engine))
    finally:
        engine.shutdown()
    assert seen and all(thread == ("cachet-engine", 1) for thread in seen)


def test_weights_that_fail_to_load_raise_from_the_constructor_and_stop_the_thread(tmp_path):
    threads_before = {t.name for t in threading.enumerate()}
    with pytest.raises(ValueError, match="config.json"):
        Engine(EngineConfig(tmp_path))
    assert "cachet-engine" not in {t.name for t in threading.enumerate()} - threads_before


def test_requests_join_a_running_batch():
    runner = FakeRunner(step_delay_s=0.005)
    engine = make_fake_engine(runner)
    try:
        first = threading.Thread(
            target=engine.generate,
            args=([prompt(14)], SamplingParams(temperature=0, max_tokens=40)),
        )
        first.start()
        wait_until(lambda: runner.num_steps > 3)
        second = engine.generate([prompt(15)], GREEDY)[0]
        first.join()
        assert second.token_ids == reference_completion(prompt(15), 6)
        assert max(runner.batch_sizes) == 2
    finally:
        engine.shutdown()


# ---- the real model (float32 so exact equality holds) ----

REAL_MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def real_runner(chat_model_dir):
    return float32_runner(chat_model_dir, kv_cache_mb=48, max_model_len=REAL_MAX_MODEL_LEN)


@pytest.fixture
def make_real_engine(real_runner, real_tokenizer, chat_model_dir):
    engines = RealEngines(real_runner, real_tokenizer, chat_model_dir, REAL_MAX_MODEL_LEN)
    yield engines.make
    engines.shutdown()


QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "What do bees make?",
    "Name a planet.",
    "What colour is the sky?",
    "What is ice made of?",
]


@pytest.mark.real_weights
def test_real_model_concurrent_greedy_matches_one_at_a_time(make_real_engine, real_tokenizer):
    engine = make_real_engine(enable_prefix_caching=False)
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=8)
    one_by_one = [engine.generate([p], params)[0].token_ids for p in prompts]
    together = [r.token_ids for r in engine.generate(prompts, params)]
    assert together == one_by_one
    assert len({tuple(t) for t in together}) > 1


@pytest.mark.real_weights
def test_real_model_decodes_sharing_a_system_prompt_match_one_at_a_time(
    make_real_engine, real_tokenizer, monkeypatch
):
    from inference.engine.layers.attention import metadata as attention

    shared_blocks_per_step = []
    num_shared_blocks = attention._num_shared_blocks

    def recording_num_shared_blocks(*args):
        shared_blocks_per_step.append(num_shared_blocks(*args))
        return shared_blocks_per_step[-1]

    monkeypatch.setattr(attention, "_num_shared_blocks", recording_num_shared_blocks)
    system = "You are a careful assistant. Answer in one short sentence. " * 8
    prompts = [
        list(
            real_tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": q}],
                add_generation_prompt=True,
                return_dict=False,
            )
        )
        for q in QUESTIONS
    ]
    engine = make_real_engine()
    params = SamplingParams(temperature=0, max_tokens=8)
    one_by_one = [engine.generate([p], params)[0].token_ids for p in prompts]
    together = engine.generate(prompts, params)
    assert [r.token_ids for r in together] == one_by_one
    # The prompt's shared blocks came from the prefix cache and were attended once per step.
    assert min(r.usage.cached_tokens for r in together) >= attention.CASCADE_MIN_SHARED_TOKENS
    assert max(shared_blocks_per_step) * 16 >= attention.CASCADE_MIN_SHARED_TOKENS


@pytest.mark.real_weights
def test_real_model_prefix_cache_hit_gives_the_cold_output(make_real_engine, real_tokenizer):
    engine = make_real_engine()
    p = chat(real_tokenizer, "Write one sentence about the sea.")
    params = SamplingParams(temperature=0, max_tokens=10)
    cold = engine.generate([p], params)[0]
    warm = engine.generate([p], params)[0]
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == (len(p) - 1) // 16 * 16 > 0
    assert warm.token_ids == cold.token_ids
    # A follow-up turn (append-only history) reuses the first turn's prefix too.
    answer = real_tokenizer.decode(cold.token_ids, skip_special_tokens=True)
    messages = [
        {"role": "user", "content": "Write one sentence about the sea."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Another one."},
    ]
    follow_up = real_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    follow_up = list(follow_up["input_ids"] if hasattr(follow_up, "keys") else follow_up)
    assert engine.generate([follow_up], params)[0].usage.cached_tokens >= 32


@pytest.mark.real_weights
def test_real_model_preemption_keeps_outputs_identical(make_real_engine, real_tokenizer):
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS[:6]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    # 8 blocks (128 tokens): one max_model_len sequence fits, six ~52-token ones do not.
    small = make_real_engine(num_kv_blocks=8, max_model_len=128)
    squeezed = small.generate(prompts, params)
    small.shutdown()
    reference = make_real_engine().generate(prompts, params)
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in reference]
    assert small.metrics.snapshot()["num_preemptions"] > 0


@pytest.mark.real_weights
def test_real_model_seeded_sampling_is_reproducible(make_real_engine, real_tokenizer):
    engine = make_real_engine()
    p = chat(real_tokenizer, "Tell me a story.")
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7, max_tokens=8, ignore_eos=True)
    alone = engine.generate([p], seeded)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=8)
    batched = engine.generate([p, p], [other, seeded])[1].token_ids
    assert batched == alone


@pytest.mark.real_weights
async def test_real_model_stop_strings_are_not_leaked(make_real_engine, real_tokenizer):
    engine = make_real_engine()
    p = chat(real_tokenizer, "What is the capital of France?")
    full = engine.generate([p], SamplingParams(temperature=0, max_tokens=12))[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3
    params = SamplingParams(temperature=0, max_tokens=12, stop=stop)
    text = ""
    async for item in engine.stream(p, params):
        if isinstance(item, Delta):
            text += item.text
            assert stop not in text
            finish_reason = item.finish_reason
    assert text == full[: full.index(stop)]
    assert finish_reason == "stop"


@pytest.mark.real_weights
async def test_real_model_disconnect_and_abort_return_kv_to_idle(make_real_engine, real_tokenizer):
    engine = make_real_engine()
    p = chat(real_tokenizer, "Count from one to one hundred.")
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    stream = engine.stream(p, params)
    async for item in stream:
        if item.token_ids:
            break
    await stream.aclose()
    await asyncio.to_thread(wait_until, lambda: kv_is_idle(engine))
    request_id = engine.submit(p, params)
    await asyncio.to_thread(wait_until, lambda: engine.metrics.snapshot()["kv_usage"] > 0)
    engine.abort(request_id)
    await asyncio.to_thread(wait_until, lambda: kv_is_idle(engine))
    assert engine.metrics.snapshot()["num_requests_by_finish_reason"]["abort"] == 2
    with pytest.raises(PromptTooLongError, match=f"max_model_len is {REAL_MAX_MODEL_LEN}"):
        engine.stream(p * 10, params)


async def test_split_utf8_streams_whole_characters(real_tokenizer):
    text = "Sure: 😀 日本語 🎉!"
    script = [*real_tokenizer.encode(text), real_tokenizer.eos_token_id]
    p = real_tokenizer.encode("hi")
    runner = ScriptedRunner(script, len(p), len(real_tokenizer))
    config = EngineConfig("unused", max_model_len=64, block_size=runner.block_size)
    engine = Engine(config, runner=runner, tokenizer=real_tokenizer)
    try:
        items = [item async for item in engine.stream(p, SamplingParams(temperature=0))]
    finally:
        engine.shutdown()
    deltas = [item for item in items if isinstance(item, Delta)]
    assert all("\ufffd" not in d.text for d in deltas)
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].finish_reason == "stop"

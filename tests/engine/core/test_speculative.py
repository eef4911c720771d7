"""Speculative decoding: n-gram drafts, and output identical to decoding one token per step."""

from __future__ import annotations

import asyncio

import pytest

from inference.engine.config import EngineConfig
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.speculative import NgramProposer
from inference.engine.engine import Engine
from inference.engine.outputs import Delta
from tests.engine.fakes import (
    EOS_TOKEN_ID,
    FakeRunner,
    FakeTokenizer,
    ScriptedRunner,
    reference_completion,
)
from tests.engine.real_model import RealEngines, chat, float32_runner

# ---- the proposer ----


def test_the_latest_earlier_occurrence_of_the_longest_suffix_gives_the_drafts():
    proposer = NgramProposer(3, min_n=1, max_n=3)
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 6, 7, 8, 2, 3]
    # "2 3" occurs at 1 and 6 (the trigram "8 2 3" does not occur before): the later one wins.
    assert proposer.propose(tokens) == [6, 7, 8]
    # A trigram match beats a more recent bigram match.
    assert proposer.propose([7, 2, 3, 4, 5, 2, 3, 9, 7, 2, 3]) == [4, 5, 2]


def test_drafts_stop_at_the_limit_and_at_the_end_of_the_context():
    proposer = NgramProposer(5, min_n=1, max_n=2)
    assert proposer.propose([4, 5, 6, 7, 8, 9, 4, 5], max_num_tokens=2) == [6, 7]
    assert proposer.propose([4, 5, 6, 4, 5]) == [6, 4, 5]  # runs into the suffix itself
    assert proposer.propose([4, 5, 6, 7, 8, 9, 4, 5], max_num_tokens=0) == []


def test_no_match_or_too_short_a_context_proposes_nothing():
    proposer = NgramProposer(4, min_n=2, max_n=3)
    assert proposer.propose([1, 2, 3, 4, 5, 3]) == []  # only a 1-gram would match
    assert proposer.propose([1, 2]) == []
    assert proposer.propose([7, 7, 7]) == [7]  # "7 7" at 0 is followed by one 7


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "num_speculative_tokens must be >= 1"),
        ((3,), {"min_n": 0}, "1 <= min_n <= max_n"),
        ((3,), {"min_n": 3, "max_n": 2}, "1 <= min_n <= max_n"),
    ],
)
def test_bad_proposer_settings_raise_value_error(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        NgramProposer(*args, **kwargs)


# ---- the engine with fake runners (fast, exact) ----


def make_fake_engine(runner, *, tokenizer=None, **config) -> Engine:
    settings = {"block_size": runner.block_size, "max_model_len": runner.max_model_len}
    config = EngineConfig("unused", **(settings | config))
    return Engine(config, runner=runner, tokenizer=tokenizer or FakeTokenizer())


def kv_is_idle(engine: Engine) -> bool:
    snapshot = engine.metrics.snapshot()
    return snapshot["kv_usage"] == 0 and snapshot["num_running"] == 0


def repetitive_prompt(seed: int) -> list[int]:
    # NOTE: few distinct tokens, so n-gram matches (and some accepted drafts) are frequent.
    return [3 + (seed + i * i) % 5 for i in range(10)]


def test_drafts_through_a_tiny_kv_cache_keep_the_reference_output():
    # FakeRunner reads each context back through the block tables: a rejected draft left in the
    # cache, or a block hashed with a rejected token, would change the output.
    runner = FakeRunner(num_kv_blocks=14, max_model_len=40)
    engine = make_fake_engine(
        runner, num_speculative_tokens=4, speculative_ngram_min=1, speculative_max_num_seqs=8
    )
    try:
        prompts = [repetitive_prompt(i) for i in range(6)]
        params = SamplingParams(temperature=0, max_tokens=24)
        results = engine.generate(prompts, params)
        for prompt, result in zip(prompts, results, strict=True):
            assert result.token_ids == reference_completion(prompt, 24)
        snapshot = engine.metrics.snapshot()
        assert snapshot["spec_draft_tokens"] > 0
        assert snapshot["spec_accepted_tokens"] > 0
        assert snapshot["num_preemptions"] > 0
        assert kv_is_idle(engine)
        # The next turn's prompt reuses the blocks cached while drafting.
        alone = engine.generate([prompts[0]], params)[0]
        follow_up = prompts[0] + alone.token_ids[:12]
        again = engine.generate([follow_up], SamplingParams(temperature=0, max_tokens=8))[0]
        assert again.usage.cached_tokens >= 16
        assert again.token_ids == reference_completion(follow_up, 8)
    finally:
        engine.shutdown()


def test_drafting_stops_when_more_sequences_decode_than_the_limit():
    runner = FakeRunner()
    engine = make_fake_engine(
        runner, num_speculative_tokens=4, speculative_ngram_min=1, speculative_max_num_seqs=2
    )
    try:
        prompts = [repetitive_prompt(i) for i in range(6)]
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        assert engine.metrics.snapshot()["spec_draft_tokens"] == 0
        engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=6))
        assert engine.metrics.snapshot()["spec_draft_tokens"] > 0
    finally:
        engine.shutdown()


QUOTED = "abcdefghij"


def quoting_engines(answer: str):
    """Engines with and without speculation whose model answers `answer` after the prompt."""
    tokenizer = FakeTokenizer()
    prompt = tokenizer.encode("xy" + QUOTED + "z")
    script = [*tokenizer.encode(answer), EOS_TOKEN_ID]
    engines = [
        make_fake_engine(ScriptedRunner(script, len(prompt), 32), num_speculative_tokens=k)
        for k in (0, 5)
    ]
    return prompt, engines


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=50),  # eos right after the quote
        SamplingParams(temperature=0, max_tokens=7),  # max_tokens inside an accepted run
        SamplingParams(temperature=0, max_tokens=50, stop="efg"),  # a stop string inside one
        SamplingParams(temperature=0, max_tokens=50, stop_token_ids=[3 + 5]),  # the "f" token
        SamplingParams(temperature=0.8, seed=3, max_tokens=50, stop=["hi", "xx"]),
    ],
)
def test_stops_inside_an_accepted_run_end_where_plain_decoding_ends(params):
    prompt, (plain, speculative) = quoting_engines(QUOTED + QUOTED)
    try:
        expected = plain.generate([prompt], params)[0]
        got = speculative.generate([prompt], params)[0]
        assert (got.token_ids, got.text, got.finish_reason) == (
            expected.token_ids,
            expected.text,
            expected.finish_reason,
        )
        assert got.usage.completion_tokens == expected.usage.completion_tokens
        assert speculative.metrics.snapshot()["spec_accepted_tokens"] > 0
        # Fewer steps: several tokens were taken per step.
        assert speculative.runner.num_steps < plain.runner.num_steps
        assert kv_is_idle(speculative)
    finally:
        plain.shutdown()
        speculative.shutdown()


async def test_streamed_deltas_of_an_accepted_run_never_pass_a_stop_string():
    prompt, (plain, speculative) = quoting_engines(QUOTED + QUOTED)
    params = SamplingParams(temperature=0, max_tokens=50, stop="ghi")
    try:
        text = ""
        async for item in speculative.stream(prompt, params):
            if isinstance(item, Delta):
                text += item.text
                assert "ghi" not in text
        assert text == "abcdef"
    finally:
        plain.shutdown()
        speculative.shutdown()


def test_acceptance_counters_reach_the_prometheus_text():
    from prometheus_client import generate_latest

    prompt, (plain, speculative) = quoting_engines(QUOTED)
    try:
        speculative.generate([prompt], SamplingParams(temperature=0, max_tokens=50))
        snapshot = speculative.metrics.snapshot()
        assert 0 < snapshot["spec_accepted_tokens"] <= snapshot["spec_draft_tokens"]
        rate = snapshot["spec_accepted_tokens"] / snapshot["spec_draft_tokens"]
        assert snapshot["spec_acceptance_rate"] == rate
        assert snapshot["spec_tokens_per_verification"] > 1
        text = generate_latest(speculative.metrics.registry).decode()
        assert "cachet_engine_spec_decode_accepted_tokens_total" in text
        assert "cachet_engine_spec_decode_draft_tokens_total" in text
    finally:
        plain.shutdown()
        speculative.shutdown()


# ---- the real model (float32, so equality is exact) ----

REAL_MAX_MODEL_LEN = 512
PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin "
    "encompasses seven million square kilometres, of which five and a half million square "
    "kilometres are covered by the rainforest. The region includes territory belonging to nine "
    "nations and 3,344 formally acknowledged indigenous territories."
)
EXTRACTIVE_QUESTION = f"Here is a passage:\n\n{PASSAGE}\n\nRepeat the passage word for word."
OTHER_QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def real_runner(chat_model_dir):
    return float32_runner(chat_model_dir, kv_cache_mb=64, max_model_len=REAL_MAX_MODEL_LEN)


@pytest.fixture
def make_real_engine(real_runner, real_tokenizer, chat_model_dir):
    engines = RealEngines(real_runner, real_tokenizer, chat_model_dir, REAL_MAX_MODEL_LEN)

    def make(num_speculative_tokens: int, **config) -> Engine:
        return engines.make(num_speculative_tokens=num_speculative_tokens, **config)

    yield make
    engines.shutdown()


def compare_with_and_without_speculation(make_real_engine, prompts, params):
    plain = make_real_engine(0)
    expected = plain.generate(prompts, params)
    plain.shutdown()
    speculative = make_real_engine(5)
    got = speculative.generate(prompts, params)
    return expected, got, speculative


@pytest.mark.real_weights
def test_real_model_greedy_output_is_identical_with_speculation(make_real_engine, real_tokenizer):
    prompts = [chat(real_tokenizer, q) for q in [EXTRACTIVE_QUESTION, *OTHER_QUESTIONS]]
    params = SamplingParams(temperature=0, max_tokens=40)
    expected, got, engine = compare_with_and_without_speculation(
        make_real_engine, [prompts[0]], params
    )
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert "seven million square kilometres" in got[0].text  # it does quote the passage
    snapshot = engine.metrics.snapshot()
    assert snapshot["spec_accepted_tokens"] > 0
    assert snapshot["spec_tokens_per_verification"] > 1.5
    # Several at once, so verification passes share batches with plain decodes.
    expected, got, _ = compare_with_and_without_speculation(make_real_engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]


@pytest.mark.real_weights
def test_real_model_seeded_sampling_is_identical_with_speculation(make_real_engine, real_tokenizer):
    prompts = [chat(real_tokenizer, EXTRACTIVE_QUESTION), chat(real_tokenizer, OTHER_QUESTIONS[1])]
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=32),
        SamplingParams(temperature=1.0, seed=11, max_tokens=32, presence_penalty=0.5),
    ]
    expected, got, engine = compare_with_and_without_speculation(make_real_engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert engine.metrics.snapshot()["spec_accepted_tokens"] > 0


@pytest.mark.real_weights
def test_real_model_stops_inside_an_accepted_run_like_plain_decoding(
    make_real_engine, real_tokenizer
):
    prompt = chat(real_tokenizer, EXTRACTIVE_QUESTION)
    full = make_real_engine(0).generate([prompt], SamplingParams(temperature=0, max_tokens=40))
    text = full[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    cases = [
        SamplingParams(temperature=0, max_tokens=40, stop=stop),
        SamplingParams(temperature=0, max_tokens=23),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[full[0].token_ids[17]]),
    ]
    for params in cases:
        expected, got, _ = compare_with_and_without_speculation(make_real_engine, [prompt], params)
        assert (got[0].token_ids, got[0].text, got[0].finish_reason) == (
            expected[0].token_ids,
            expected[0].text,
            expected[0].finish_reason,
        )
    assert got[0].finish_reason == "stop"


@pytest.mark.real_weights
def test_real_model_preemption_with_speculation_keeps_outputs_identical(
    make_real_engine, real_tokenizer
):
    prompts = [chat(real_tokenizer, EXTRACTIVE_QUESTION), chat(real_tokenizer, OTHER_QUESTIONS[0])]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = make_real_engine(0).generate(prompts, params)
    # 10 blocks (160 tokens): the extractive answer alone ends at 134 tokens (9 blocks) while the
    # other sequence holds at least 3.
    small = make_real_engine(5, num_kv_blocks=10, max_model_len=160)
    squeezed = small.generate(prompts, params)
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in reference]
    snapshot = small.metrics.snapshot()
    assert snapshot["num_preemptions"] > 0
    assert snapshot["spec_accepted_tokens"] > 0
    assert kv_is_idle(small)


@pytest.mark.real_weights
async def test_real_model_abort_mid_run_returns_kv_to_idle(make_real_engine, real_tokenizer):
    engine = make_real_engine(5)
    prompt = chat(real_tokenizer, EXTRACTIVE_QUESTION)
    stream = engine.stream(prompt, SamplingParams(temperature=0, max_tokens=200))
    num_tokens = 0
    async for item in stream:
        num_tokens += len(item.token_ids)
        if num_tokens >= 12:
            break
    await stream.aclose()
    await asyncio.to_thread(wait_until, lambda: kv_is_idle(engine))
    assert engine.metrics.snapshot()["num_requests_by_finish_reason"]["abort"] == 1
    assert engine.metrics.snapshot()["spec_accepted_tokens"] > 0


def wait_until(predicate, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)

"""Logprobs from the engine, on the real model in float32: the model's own distribution, the
same whether a position is computed in a prefill or a decode step, untouched by batching."""

from __future__ import annotations

import math

import pytest

from inference.engine import SamplingParams, StructuredOutput
from tests.engine.real_model import RealEngines, float32_runner

pytestmark = pytest.mark.real_weights

MAX_MODEL_LEN = 256
PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def make_engine(chat_model_dir, real_tokenizer):
    runner = float32_runner(chat_model_dir, kv_cache_mb=32, max_model_len=MAX_MODEL_LEN)
    engines = RealEngines(runner, real_tokenizer, chat_model_dir, MAX_MODEL_LEN)
    yield engines.make
    engines.shutdown()


def test_each_token_comes_with_its_logprob_and_the_top_alternatives(make_engine):
    engine = make_engine()
    result = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, logprobs=4))[0]
    assert [lp.token_id for lp in result.logprobs] == result.token_ids
    for lp in result.logprobs:
        ids, values = zip(*lp.top, strict=True)
        assert ids[0] == lp.token_id and lp.logprob == values[0]  # greedy: the likeliest
        assert list(values) == sorted(values, reverse=True)
        assert 0 < sum(math.exp(v) for v in values) <= 1 + 1e-5
    plain = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))[0]
    assert plain.logprobs == [] and plain.token_ids == result.token_ids


def test_a_position_has_the_same_logprobs_from_a_decode_step_as_from_a_prefill(
    make_engine, real_tokenizer
):
    engine = make_engine(enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=3)
    decoded = engine.generate([PROMPT], params)[0]
    prompt_ids = real_tokenizer.encode(PROMPT) + decoded.token_ids[:2]
    prefilled = engine.generate(
        [prompt_ids], SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    )[0]
    third, again = decoded.logprobs[2], prefilled.logprobs[0]
    assert again.token_id == third.token_id
    assert [t for t, _ in again.top] == [t for t, _ in third.top]
    assert [v for _, v in again.top] == pytest.approx([v for _, v in third.top], abs=1e-4)


def test_logprobs_are_the_models_not_the_grammars_or_the_temperatures(make_engine):
    engine = make_engine(num_speculative_tokens=3)
    free = SamplingParams(temperature=0, max_tokens=1, logprobs=2)
    hot = SamplingParams(temperature=1.5, seed=1, max_tokens=1, logprobs=2)
    bound = SamplingParams(
        temperature=0, max_tokens=1, logprobs=2, structured_output=StructuredOutput("json")
    )
    results = engine.generate([PROMPT] * 3, [free, hot, bound])
    tops = [result.logprobs[0].top for result in results]
    assert [t for t, _ in tops[1]] == [t for t, _ in tops[2]] == [t for t, _ in tops[0]]
    assert [v for _, v in tops[1]] == pytest.approx([v for _, v in tops[0]], abs=1e-5)
    # the grammar's pick is a token the model itself ranks low here, reported as such
    assert results[2].logprobs[0].logprob < tops[0][0][1]


def test_speculative_decoding_leaves_requests_with_logprobs_unchanged(make_engine, real_tokenizer):
    prompt = real_tokenizer.encode("List the days of the week: Monday, Tuesday,")
    params = [
        SamplingParams(temperature=0, max_tokens=12, logprobs=2),
        SamplingParams(temperature=0, max_tokens=12),
    ]
    expected = make_engine().generate([prompt, prompt], params)
    got = make_engine(num_speculative_tokens=4).generate([prompt, prompt], params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [lp.token_id for lp in got[0].logprobs] == got[0].token_ids

"""Speculative decoding with a draft model: output identical to decoding one token per step.

Fake runners first (milliseconds; a FakeRunner reads every context back through its block tables,
so lost or stale KV blocks on either side change the output), then the real SmolLM2-135M drafting
for itself in float32 (acceptance near 100%, so long accepted runs reach every stop condition),
and drafts whose vocabulary differs from the target's, refused at load.
"""

from __future__ import annotations

import time

import pytest

from inference.engine import kernels as native_kernels
from inference.engine.config import ConfigError, EngineConfig
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.engine import Engine
from tests.engine.fakes import (
    EOS_TOKEN_ID,
    FakeRunner,
    FakeTokenizer,
    ScriptedRunner,
    reference_completion,
)
from tests.engine.real_model import SmallCache, chat, float32_runner, native_dtype_runner


class VocabularyTokenizer(FakeTokenizer):
    """FakeTokenizer with what the draft's vocabulary check reads."""

    all_special_tokens = ["</s>"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return super().encode(text)

    def convert_tokens_to_ids(self, token: str) -> int:
        return EOS_TOKEN_ID


def make_fake_engine(runner, draft_runner=None, **config) -> Engine:
    settings = {"block_size": runner.block_size, "max_model_len": runner.max_model_len}
    if draft_runner is not None:
        settings |= {"speculative_method": "draft", "draft_model_dir": "unused-draft"}
    return Engine(
        EngineConfig("unused", **(settings | config)),
        runner=runner,
        tokenizer=VocabularyTokenizer(),
        draft_runner=draft_runner,
        draft_tokenizer=VocabularyTokenizer(),
    )


def is_idle(engine: Engine, timeout_s: float = 5.0) -> bool:
    """Neither the target's nor the draft's KV cache holds a block for anyone.

    NOTE: a request's result reaches its caller inside the step that finished it, before the
    engine records that step's metrics, so the gauges may lag by one loop iteration: polled.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = engine.metrics.snapshot()
        draft = engine.core.draft_proposer
        is_draft_idle = draft is None or (draft.kv_usage == 0 and not draft.states)
        if snapshot["kv_usage"] == 0 and snapshot["num_running"] == 0 and is_draft_idle:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def varied_prompt(seed: int) -> list[int]:
    return [3 + (seed * 7 + i * i) % 29 for i in range(4 + 2 * seed)]


# ---- fake runners ----


def test_a_draft_of_the_same_model_is_always_accepted_through_tiny_kv_caches():
    # Self-drafting: every draft is what the target picks, unless a KV block on either side
    # was lost, stale or shared by mistake. Both caches are small enough to preempt and to run
    # out of draft blocks.
    target = FakeRunner(num_kv_blocks=14, max_model_len=40)
    draft = FakeRunner(num_kv_blocks=12, max_model_len=40)
    engine = make_fake_engine(target, draft, num_speculative_tokens=4, speculative_max_num_seqs=8)
    try:
        prompts = [varied_prompt(i) for i in range(6)]
        results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
        for prompt, result in zip(prompts, results, strict=True):
            assert result.token_ids == reference_completion(prompt, 24)
        snapshot = engine.metrics.snapshot()
        assert snapshot["spec_draft_tokens"] > 0
        assert snapshot["spec_acceptance_rate"] == 1.0
        assert snapshot["num_preemptions"] > 0
        assert engine.core.draft_proposer.num_out_of_blocks > 0
        assert is_idle(engine)
    finally:
        engine.shutdown()


def test_a_failing_draft_model_never_fails_a_request():
    draft = FakeRunner()
    draft.num_failures_left = 1
    engine = make_fake_engine(FakeRunner(), draft, num_speculative_tokens=3)
    try:
        prompts = [varied_prompt(i) for i in range(3)]
        results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
        assert [r.token_ids for r in results] == [reference_completion(p, 12) for p in prompts]
        assert [r.finish_reason for r in results] == ["length"] * 3
        assert not engine.core.draft_proposer.is_enabled
        assert is_idle(engine)
    finally:
        engine.shutdown()


def test_drafting_stops_when_more_sequences_decode_than_the_limit():
    draft = FakeRunner()
    engine = make_fake_engine(
        FakeRunner(), draft, num_speculative_tokens=4, speculative_max_num_seqs=2
    )
    try:
        prompts = [varied_prompt(i) for i in range(6)]
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
        assert engine.metrics.snapshot()["spec_draft_tokens"] == 0
        assert draft.num_steps == 0
        engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=6))
        assert engine.metrics.snapshot()["spec_draft_tokens"] > 0
    finally:
        engine.shutdown()


QUOTED = "abcdefghij"


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
def test_stops_inside_an_accepted_draft_run_end_where_plain_decoding_ends(params):
    tokenizer = FakeTokenizer()
    prompt = tokenizer.encode("xy" + QUOTED + "z")
    script = [*tokenizer.encode(QUOTED + QUOTED), EOS_TOKEN_ID]

    def scripted():
        return ScriptedRunner(script, len(prompt), 32, max_model_len=32)

    plain = make_fake_engine(scripted())
    speculative = make_fake_engine(scripted(), scripted(), num_speculative_tokens=5)
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
        assert speculative.runner.num_steps < plain.runner.num_steps
        assert is_idle(speculative)
    finally:
        plain.shutdown()
        speculative.shutdown()


def test_the_draft_method_needs_a_draft_model():
    with pytest.raises(ConfigError, match="speculative_method 'draft' needs draft_model_dir"):
        EngineConfig("unused", num_speculative_tokens=3, speculative_method="draft")


# ---- the real model drafting for itself (float32, so equality is exact) ----

REAL_MAX_MODEL_LEN = 512
PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin "
    "encompasses seven million square kilometres, of which five and a half million square "
    "kilometres are covered by the rainforest."
)
QUESTIONS = [
    f"Here is a passage:\n\n{PASSAGE}\n\nRepeat the passage word for word.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France?",
]


@pytest.fixture(scope="module")
def real_runners(chat_model_dir):
    """The target and, with a KV cache of its own, the same model as its draft."""
    return tuple(
        float32_runner(chat_model_dir, kv_cache_mb=64, max_model_len=REAL_MAX_MODEL_LEN)
        for _ in range(2)
    )


@pytest.fixture
def make_real_engine(real_runners, real_tokenizer, chat_model_dir):
    engines: list[Engine] = []
    target, draft = real_runners

    def make(num_speculative_tokens: int, *, num_kv_blocks=None, **config) -> Engine:
        settings = {"dtype": "float32", "max_model_len": REAL_MAX_MODEL_LEN, "block_size": 16}
        if num_speculative_tokens:
            settings |= {"speculative_method": "draft", "draft_model_dir": chat_model_dir}
        runner = target if num_kv_blocks is None else SmallCache(target, num_kv_blocks)
        engine_config = EngineConfig(
            chat_model_dir,
            num_speculative_tokens=num_speculative_tokens,
            **(settings | config),
        )
        engines.append(
            Engine(
                engine_config,
                runner=runner,
                tokenizer=real_tokenizer,
                draft_runner=draft,
                draft_tokenizer=real_tokenizer,
            )
        )
        return engines[-1]

    yield make
    for engine in engines:
        engine.shutdown()


def plain_and_drafted(make_real_engine, prompts, params, **config):
    expected = make_real_engine(0).generate(prompts, params)
    engine = make_real_engine(4, **config)
    return expected, engine.generate(prompts, params), engine


@pytest.mark.real_weights
def test_real_greedy_output_with_a_draft_is_identical_for_concurrent_sequences(
    make_real_engine, real_tokenizer
):
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == 3
    params = SamplingParams(temperature=0, max_tokens=40)
    expected, got, engine = plain_and_drafted(make_real_engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    snapshot = engine.metrics.snapshot()
    assert snapshot["spec_acceptance_rate"] > 0.95
    assert snapshot["spec_tokens_per_verification"] > 4
    assert is_idle(engine)


@pytest.mark.real_weights
def test_real_seeded_sampling_with_a_draft_is_identical(make_real_engine, real_tokenizer):
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS[:2]]
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=32),
        SamplingParams(temperature=1.0, seed=11, max_tokens=32, presence_penalty=0.5),
    ]
    expected, got, engine = plain_and_drafted(make_real_engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert engine.metrics.snapshot()["spec_accepted_tokens"] > 0


@pytest.mark.real_weights
def test_real_stops_and_max_tokens_inside_an_accepted_draft_run_end_like_plain_decoding(
    make_real_engine, real_tokenizer
):
    prompt = chat(real_tokenizer, QUESTIONS[0])
    full = make_real_engine(0).generate([prompt], SamplingParams(temperature=0, max_tokens=40))
    text = full[0].text
    cases = [
        SamplingParams(temperature=0, max_tokens=40, stop=text[20:24]),
        SamplingParams(temperature=0, max_tokens=23),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[full[0].token_ids[17]]),
    ]
    for params in cases:
        expected, got, engine = plain_and_drafted(make_real_engine, [prompt], params)
        assert (got[0].token_ids, got[0].text, got[0].finish_reason) == (
            expected[0].token_ids,
            expected[0].text,
            expected[0].finish_reason,
        )
        assert is_idle(engine)


@pytest.mark.real_weights
def test_real_preemption_with_a_draft_keeps_outputs_identical_and_frees_its_blocks(
    make_real_engine, real_tokenizer
):
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS[:2]]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = make_real_engine(0).generate(prompts, params)
    # 8 target blocks (128 tokens) cannot hold both answers at once: one is preempted.
    small = make_real_engine(4, num_kv_blocks=8, max_model_len=128)
    squeezed = small.generate(prompts, params)
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in reference]
    snapshot = small.metrics.snapshot()
    assert snapshot["num_preemptions"] > 0
    assert snapshot["spec_accepted_tokens"] > 0
    assert is_idle(small)


@pytest.mark.real_weights
@pytest.mark.skipif(
    native_kernels.load_kernel("decode_layers") is None,
    reason="the fused decode needs a CPU with AVX2, AVX-512 or NEON, and a compiler",
)
def test_real_greedy_output_with_a_draft_is_identical_on_the_fused_path(
    chat_model_dir, real_tokenizer
):
    # In this CPU's dtype (bf16 where it is native). Verifications run as decodes of their
    # tokens there (ModelRunner._runs_as_decodes), so bf16 needs no float32 to stay exact.
    # NOTE: contexts stay under 8 blocks (82 + 24 tokens), where the decode attention kernel
    # never splits a context: beyond that its partitions depend on the batch's size, in plain
    # decoding too, and bf16 rounds them differently.
    # NOTE: int4 weights, which run fused on every CPU with the kernel (bf16 ones need AMX),
    # and no dense copies: with them the verifications of several sequences (more tokens than
    # the kernels' limit) would run layer by layer on the copies, whose GEMM rounds otherwise.
    target, draft = (
        native_dtype_runner(
            chat_model_dir,
            kv_cache_mb=32,
            max_model_len=REAL_MAX_MODEL_LEN,
            quantization="int4",
            prefill_weights="quantized",
        )
        for _ in range(2)
    )
    assert target.model.fused_decode is not None
    prompts = [chat(real_tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=24)
    settings = {"dtype": target.dtype, "max_model_len": REAL_MAX_MODEL_LEN}
    plain = Engine(
        EngineConfig(chat_model_dir, **settings), runner=target, tokenizer=real_tokenizer
    )
    expected = plain.generate(prompts, params)
    plain.shutdown()
    drafted = Engine(
        EngineConfig(
            chat_model_dir,
            **settings,
            num_speculative_tokens=4,
            speculative_method="draft",
            draft_model_dir=chat_model_dir,
        ),
        runner=target,
        tokenizer=real_tokenizer,
        draft_runner=draft,
        draft_tokenizer=real_tokenizer,
    )
    try:
        got = drafted.generate(prompts, params)
        assert [r.token_ids for r in got] == [r.token_ids for r in expected]
        assert drafted.metrics.snapshot()["spec_acceptance_rate"] > 0.9
    finally:
        drafted.shutdown()


# ---- drafts of another vocabulary, refused at load ----


def save_random_draft(directory, tokenizer, vocab_size: int):
    """A 1-layer random Llama of `vocab_size` tokens with `tokenizer`'s files beside it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=REAL_MAX_MODEL_LEN,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_with_draft(target_dir, target_runner, tokenizer, draft_dir) -> Engine:
    """An engine that loads `draft_dir` itself, as the app does."""
    config = EngineConfig(
        target_dir,
        dtype="float32",
        max_model_len=REAL_MAX_MODEL_LEN,
        num_speculative_tokens=3,
        speculative_method="draft",
        draft_model_dir=draft_dir,
        draft_kv_cache_mb=8,
    )
    return Engine(config, runner=target_runner, tokenizer=tokenizer)


@pytest.mark.real_weights
def test_a_draft_with_a_truncated_vocabulary_is_refused_naming_both_models(
    real_runners, real_tokenizer, chat_model_dir, tmp_path
):
    draft_dir = save_random_draft(tmp_path / "truncated", real_tokenizer, vocab_size=256)
    with pytest.raises(ConfigError) as error:
        load_with_draft(chat_model_dir, real_runners[0], real_tokenizer, draft_dir)
    message = str(error.value)
    assert f"draft_model_dir {draft_dir} cannot draft for {chat_model_dir}" in message
    assert "vocabulary sizes differ (49152 vs 256)" in message


@pytest.mark.real_weights
def test_a_draft_with_another_models_tokenizer_is_refused(
    real_runners, real_tokenizer, chat_model_dir, prepared_catalogue_model, tmp_path
):
    from transformers import AutoTokenizer

    qwen_tokenizer = AutoTokenizer.from_pretrained(
        str(prepared_catalogue_model("qwen2.5-coder-0.5b-instruct"))
    )
    # The target's vocabulary size, so only the token ids tell them apart.
    draft_dir = save_random_draft(tmp_path / "qwen-tokens", qwen_tokenizer, vocab_size=49152)
    with pytest.raises(ConfigError, match="is tokenized differently"):
        load_with_draft(chat_model_dir, real_runners[0], real_tokenizer, draft_dir)


def test_a_draft_directory_that_is_no_model_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"the draft model \S+ could not be loaded: .*config"):
        load_with_draft("unused", FakeRunner(max_model_len=64), VocabularyTokenizer(), tmp_path)

"""Chunk-KV reuse on the real model: passages computed once, moved to where a prompt holds them.

Reused keys/values are approximate past the first layer by design (a passage computed on its own
never saw the passages before it), so the checks are the parts that are exact: the first layer's
keys and values (a function of the token and its position only) equal a full prefill's at every
position of a blended prompt, which holds only if the copies land in the right slots, the keys
are re-rotated by the right shift and the recomputed tokens run at their own positions; and
whatever is not reused is computed exactly as a full prefill would.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

from inference.engine import BatchEntry, ReusableSpans
from inference.engine.core.block_manager import hash_blocks, root_hash
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.model_runner import KV_PROBE_LAYERS
from tests.engine.real_model import RealEngines, float32_runner

pytestmark = pytest.mark.real_weights

MAX_MODEL_LEN = 512
BLOCK_SIZE = 16
GREEDY = SamplingParams(temperature=0, max_tokens=6)
PREFIX = (
    "<|im_start|>system\nAnswer the question from the passages below.<|im_end|>\n<|im_start|>user\n"
)
PASSAGES = (
    "[1] The lighthouse on Skerry Point was built in 1871 from granite quarried on the island. "
    "Its lamp burned paraffin until 1932, when the keepers installed an electric light, and "
    "its beam reaches twenty nautical miles on a clear night.\n",
    "[2] Tidal mills use the difference between high and low water: a pond fills through a "
    "gate as the tide rises and drains through a waterwheel as it falls, so the mill can grind "
    "for a few hours around each low tide, twice a day.\n",
)
TAIL = "Question: When did the lighthouse get an electric light?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def runner(chat_model_dir):
    return float32_runner(chat_model_dir, kv_cache_mb=48, max_model_len=MAX_MODEL_LEN)


@pytest.fixture
def engines(runner, real_tokenizer, chat_model_dir):
    engines = RealEngines(runner, real_tokenizer, chat_model_dir, MAX_MODEL_LEN)
    yield engines
    engines.shutdown()


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def blended_prompt(tokenizer, passages) -> tuple[list[int], ReusableSpans]:
    """PREFIX, the passages in the given order, TAIL: tokens and where the passages are."""
    tokens = encode(tokenizer, PREFIX)
    spans = []
    for passage in passages:
        passage_tokens = encode(tokenizer, passage)
        spans.append((len(tokens), len(tokens) + len(passage_tokens)))
        tokens += passage_tokens
    return tokens + encode(tokenizer, TAIL), ReusableSpans(spans[0][0], tuple(spans))


def compute_passages_alone(engine, tokenizer) -> None:
    prefix = encode(tokenizer, PREFIX)
    engine.generate([prefix + encode(tokenizer, p) for p in PASSAGES], GREEDY)


def wait_idle(engine, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.core.has_work:
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.01)


def prompt_kv(engine, tokens: list[int]) -> torch.Tensor:
    """The cached keys/values of the prompt's full blocks [2, layers, positions, heads, dim]."""
    manager = engine.core.block_manager
    num_full = (len(tokens) - 1) // BLOCK_SIZE
    block_ids = [
        manager.hash_to_block[h].block_id
        for h in hash_blocks(root_hash(None), tokens, BLOCK_SIZE)[:num_full]
    ]
    storage = engine.core.runner.kv_cache.storage[0]  # [2, L, blocks, heads, block, dim]
    blocks = storage[:, :, block_ids]  # [2, L, n, heads, block, dim]
    two, num_layers, _, num_heads, _, head_dim = blocks.shape
    return blocks.permute(0, 1, 2, 4, 3, 5).reshape(two, num_layers, -1, num_heads, head_dim)


def zero_kv(engines) -> None:
    for tensor in engines.runner.kv_cache.storage:
        tensor.zero_()


def test_a_blended_prompt_has_a_full_prefills_first_layer_keys_and_values_everywhere(
    engines, real_tokenizer
) -> None:
    # Passage 2 first: passage 1 is reused 80-odd positions later than it was computed.
    tokens, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    engine = engines.make(chunk_kv_reuse=True)
    compute_passages_alone(engine, real_tokenizer)
    blended = engine.generate([tokens], GREEDY, reusable=[reusable])[0]
    wait_idle(engine)
    blended_kv = prompt_kv(engine, tokens)
    engines.shutdown()

    zero_kv(engines)
    full = engines.make().generate([tokens], GREEDY)[0]
    full_kv = prompt_kv(engines.engines[-1], tokens)

    assert blended.usage.reused_tokens > 0 and full.usage.reused_tokens == 0
    # Passage 2 leads the prompt, so its blocks computed alone are this prompt's prefix.
    assert blended.usage.cached_tokens > 0 and full.usage.cached_tokens == 0
    # First layer: keys and values depend on the token and its position only.
    torch.testing.assert_close(blended_kv[:, 0], full_kv[:, 0], rtol=1e-4, atol=1e-4)
    # Later layers of the reused passage differ (it never saw passage 2): the blend is real.
    start, end = reusable.spans[1]
    assert not torch.allclose(blended_kv[:, -1, start:end], full_kv[:, -1, start:end], atol=1e-3)
    assert blended.token_ids[0] == full.token_ids[0]  # the same first word


def test_recomputing_every_passage_token_is_a_full_prefill(engines, real_tokenizer) -> None:
    tokens, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    engine = engines.make(chunk_kv_reuse=True, chunk_kv_recompute_tokens=MAX_MODEL_LEN)
    compute_passages_alone(engine, real_tokenizer)
    blended = engine.generate([tokens], GREEDY, reusable=[reusable])[0]
    engines.shutdown()
    zero_kv(engines)
    full = engines.make().generate([tokens], GREEDY)[0]
    assert blended.usage.reused_tokens == 0
    assert blended.token_ids == full.token_ids


def test_a_passage_first_seen_in_a_prompt_is_computed_on_its_own_for_the_next_one(
    engines, real_tokenizer
) -> None:
    engine = engines.make(chunk_kv_reuse=True)
    first, reusable = blended_prompt(real_tokenizer, PASSAGES)
    first_usage = engine.generate([first], GREEDY, reusable=[reusable])[0].usage
    assert first_usage.reused_tokens == 0
    wait_idle(engine)  # the passages, computed alone in the background

    second, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    usage = engine.generate([second], GREEDY, reusable=[reusable])[0].usage
    # Passage 2 leads this prompt: computed alone, it is the prefix cache's already. Passage 1
    # is reused but for its first recomputed tokens and its tail after its last full block.
    (start, end) = reusable.spans[1]
    prefix_len = reusable.prefix_len
    num_full_source = (prefix_len + end - start - 1) // BLOCK_SIZE * BLOCK_SIZE - prefix_len
    assert usage.reused_tokens == num_full_source - 16 > 0
    # The passages computed in the background are the engine's own work, not requests.
    snapshot = engine.metrics.snapshot()
    assert snapshot["num_requests"] == 2
    generated = first_usage.completion_tokens + usage.completion_tokens
    assert snapshot["generation_tokens"] == generated
    assert snapshot["reused_prompt_tokens"] == usage.reused_tokens


def test_spans_outside_the_prompt_are_refused_before_queueing(engines, real_tokenizer) -> None:
    engine = engines.make(chunk_kv_reuse=True)
    tokens, _ = blended_prompt(real_tokenizer, PASSAGES)
    for bad in (
        ReusableSpans(4, ((2, 10),)),  # before the prefix ends
        ReusableSpans(0, ((10, len(tokens) + 1),)),  # past the end
        ReusableSpans(0, ((10, 30), (20, 40))),  # overlapping
        ReusableSpans(0, ((10, 10),)),  # empty
    ):
        with pytest.raises(ValueError, match="reusable"):
            engine.generate([tokens], GREEDY, reusable=[bad])
    with pytest.raises(TypeError, match="ReusableSpans"):
        engine.submit(tokens, GREEDY, reusable=[(10, 20)])  # type: ignore[arg-type]


def test_an_int8_kv_cache_turns_chunk_reuse_off_with_a_warning(
    chat_model_dir, real_tokenizer, caplog
) -> None:
    from inference.engine import Engine, EngineConfig

    config = EngineConfig(
        chat_model_dir,
        dtype="float32",
        quantization="none",
        kv_cache_mb=16,
        kv_cache_dtype="int8",
        max_model_len=MAX_MODEL_LEN,
        chunk_kv_reuse=True,
    )
    with caplog.at_level(logging.WARNING), Engine(config, tokenizer=real_tokenizer) as engine:
        tokens, reusable = blended_prompt(real_tokenizer, PASSAGES)
        result = engine.generate([tokens], GREEDY, reusable=[reusable])[0]
    assert engine.core.scheduler.chunk_reuse_recompute_tokens is None
    assert result.usage.reused_tokens == 0 and result.token_ids
    assert "chunk-KV reuse is off: the KV cache is int8" in caplog.text


def test_passages_reused_once_are_on_disk_and_reused_after_a_restart(
    engines, real_tokenizer, tmp_path
) -> None:
    engine = engines.make(chunk_kv_reuse=True, kv_disk_cache_dir=tmp_path)
    compute_passages_alone(engine, real_tokenizer)
    tokens, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    before = engine.generate([tokens], GREEDY, reusable=[reusable])[0]
    engines.shutdown()  # writes what the disk tier queued
    zero_kv(engines)

    engine = engines.make(chunk_kv_reuse=True, kv_disk_cache_dir=tmp_path)
    wait_idle(engine)
    # Another question over the same passages: nothing of it is cached but the passages.
    other = encode(real_tokenizer, PREFIX) + encode(real_tokenizer, "Two passages follow.\n")
    spans = []
    for passage in PASSAGES[::-1]:
        passage_tokens = encode(real_tokenizer, passage)
        spans.append((len(other), len(other) + len(passage_tokens)))
        other += passage_tokens
    other += encode(real_tokenizer, TAIL)
    prefix_len = len(encode(real_tokenizer, PREFIX))
    after = engine.generate([other], GREEDY, reusable=[ReusableSpans(prefix_len, tuple(spans))])[0]

    assert before.usage.reused_tokens > 0
    assert after.usage.reused_tokens >= before.usage.reused_tokens
    assert engine.core.disk_cache.num_loaded > 0


def wait_warm(engine, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.core.is_warming_up:
        assert time.monotonic() < deadline, "the engine did not finish warming up"
        time.sleep(0.01)


def test_an_engine_without_chunk_reuse_never_reads_blended_blocks_from_disk(
    engines, real_tokenizer, tmp_path
) -> None:
    tokens, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    engine = engines.make(chunk_kv_reuse=True, kv_disk_cache_dir=tmp_path)
    compute_passages_alone(engine, real_tokenizer)
    blended = engine.generate([tokens], GREEDY, reusable=[reusable])[0]
    wait_idle(engine)
    # Asked again: the blended prompt's blocks are reused, so the disk tier keeps them.
    engine.generate([tokens], GREEDY, reusable=[reusable])
    engines.shutdown()  # writes what the disk tier queued
    zero_kv(engines)

    exact = engines.make(kv_disk_cache_dir=tmp_path)  # chunk reuse off: exact prefill
    wait_warm(exact)
    usage = exact.generate([tokens], GREEDY)[0].usage

    assert blended.usage.reused_tokens > 0
    # Its blocks hold copied passages' keys/values (which never saw the text before them):
    # a prompt of an engine that does not blend computes them.
    assert usage.cached_tokens == 0


def test_the_layer_probe_sees_no_change_where_the_cache_holds_a_full_prefills_keys(
    runner, real_tokenizer
) -> None:
    tokens, _ = blended_prompt(real_tokenizer, PASSAGES)
    block_table = list(range(-(-len(tokens) // BLOCK_SIZE)))
    runner.execute([BatchEntry(tokens, 0, block_table)])
    positions = list(range(len(tokens)))
    unchanged = runner.kv_deviation(block_table, positions, tokens)
    assert unchanged.shape == (len(tokens),) and float(unchanged.max()) < 1e-5

    # Keys of the probe's last layer moved at two positions: the probe finds those two.
    storage = runner.kv_cache.storage[0]  # [2, layers, blocks, heads, block, dim]
    moved = [7, 40]
    for position in moved:
        block, offset = block_table[position // BLOCK_SIZE], position % BLOCK_SIZE
        storage[0, KV_PROBE_LAYERS - 1, block, :, offset, :] += 1.0
    deviation = runner.kv_deviation(block_table, positions, tokens)
    assert sorted(torch.topk(deviation, 2).indices.tolist()) == moved
    # ...and put back what a full prefill holds there.
    assert float(runner.kv_deviation(block_table, positions, tokens).max()) < 1e-5


def test_recomputing_by_deviation_reuses_as_much_and_leaves_the_probed_layers_exact(
    engines, real_tokenizer
) -> None:
    tokens, reusable = blended_prompt(real_tokenizer, PASSAGES[::-1])
    blends = {}
    for selection in ("leading", "deviation"):
        zero_kv(engines)
        engine = engines.make(
            chunk_kv_reuse=True, chunk_kv_recompute_tokens=8, chunk_kv_selection=selection
        )
        assert engine.core.scheduler.chunk_reuse_by_deviation == (selection == "deviation")
        compute_passages_alone(engine, real_tokenizer)
        usage = engine.generate([tokens], GREEDY, reusable=[reusable])[0].usage
        wait_idle(engine)
        blends[selection] = (usage, prompt_kv(engine, tokens))
        engines.shutdown()
    zero_kv(engines)
    engines.make().generate([tokens], GREEDY)
    full_kv = prompt_kv(engines.engines[-1], tokens)

    leading, deviation = blends["leading"], blends["deviation"]
    assert leading[0].reused_tokens == deviation[0].reused_tokens > 0
    # The probe's layers hold a full prefill's keys/values at every position; the leading
    # choice leaves the reused passage's second layer as it was computed alone.
    start, end = reusable.spans[1]
    probed = KV_PROBE_LAYERS - 1
    torch.testing.assert_close(deviation[1][:, probed], full_kv[:, probed], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(leading[1][:, probed, start:end], full_kv[:, probed, start:end])
    # Above them, reused positions the probe did not choose keep their copies.
    assert not torch.allclose(deviation[1][:, -1, start:end], full_kv[:, -1, start:end], atol=1e-3)

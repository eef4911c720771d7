"""All decoder layers of a decode step in one native call, against the layer-by-layer path on
the real model (SmolLM2-135M in int4, and bf16 weights with AMX), in this CPU's dtype (bf16
where it is native, float32 elsewhere)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine import kernels as native_kernels
from inference.engine.config import resolve_auto_dtype
from inference.engine.layers.attention import CASCADE_MIN_SHARED_TOKENS, build_attention_metadata

DTYPE = resolve_auto_dtype()
pytestmark = pytest.mark.skipif(
    native_kernels.load_kernel("decode_layers", native_kernels.ACTIVATIONS[DTYPE]) is None,
    reason="the fused decode needs a CPU with AVX2, AVX-512 or NEON, and a compiler",
)
# NOTE: bf16 layers run fused only on the AMX matmul; int4 ones on the int4 kernel everywhere.
HAS_AMX = native_kernels.load_kernel("linear_bf16") is not None
FUSED_QUANTIZATION = "none" if HAS_AMX else "int4"  # what a tiny model runs fused in

BLOCKS_PER_SEQ = 40  # 640 tokens


def runner(model_dir, quantization: str, dtype: torch.dtype = DTYPE, **options) -> ModelRunner:
    config = EngineConfig(
        model_dir,
        dtype=dtype,
        kv_cache_mb=32 * dtype.itemsize,  # 128 blocks of 16 tokens in bf16 and in float32
        block_size=16,
        max_model_len=1024,
        quantization=quantization,
        **options,
    )
    return ModelRunner(config)


@pytest.fixture(scope="module", params=["none", "int4", "int8"] if HAS_AMX else ["int4", "int8"])
def fused_runner(request, chat_model_dir) -> ModelRunner:
    return runner(chat_model_dir, request.param)


def prefill(model_runner: ModelRunner, lengths: list[int]) -> list[tuple[list[int], list[int]]]:
    """Random prompts of `lengths` prefilled in their own blocks: [(token ids, block table)]."""
    generator = torch.Generator().manual_seed(sum(lengths))
    sequences = []
    for index, length in enumerate(lengths):
        tokens = torch.randint(100, 20_000, (length,), generator=generator).tolist()
        table = list(range(index * BLOCKS_PER_SEQ, (index + 1) * BLOCKS_PER_SEQ))
        for start in range(0, length, 256):
            model_runner.execute([BatchEntry(tokens[start : start + 256], start, table)])
        sequences.append((tokens, table))
    return sequences


def decode(model_runner: ModelRunner, sequences, num_steps: int, fused: bool) -> list[torch.Tensor]:
    """Greedy decode steps of all `sequences` together; the logits of each step."""
    saved = model_runner.model.fused_decode
    model_runner.model.fused_decode = saved if fused else None
    try:
        tokens = [list(seq) for seq, _ in sequences]
        next_ids = [42 + i for i in range(len(sequences))]
        steps = []
        for _ in range(num_steps):
            entries = [
                BatchEntry([next_id], len(seq), table)
                for next_id, seq, (_, table) in zip(next_ids, tokens, sequences, strict=True)
            ]
            logits = model_runner.execute(entries)
            steps.append(logits)
            for seq, next_id in zip(tokens, next_ids, strict=True):
                seq.append(next_id)
            next_ids = logits.argmax(-1).tolist()
        return steps
    finally:
        model_runner.model.fused_decode = saved


def test_bf16_and_native_int4_and_int8_models_get_the_fused_path(fused_runner):
    assert fused_runner.model.fused_decode is not None


@pytest.mark.real_weights
def test_a_gguf_mixing_4_and_8_bit_tensors_runs_fused_with_the_layer_paths_logits(
    prepared_catalogue_model,
):
    # Qwen2.5-Coder-0.5B's Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 tensors, served as int4 and int8.
    mixed = runner(prepared_catalogue_model("qwen2.5-coder-0.5b-instruct"), "auto")
    assert set(mixed.load_report.formats) >= {"int4", "int8"}
    assert mixed.model.fused_decode is not None
    layer_by_layer = decode(mixed, prefill(mixed, [90, 200]), 6, fused=False)
    fused = decode(mixed, prefill(mixed, [90, 200]), 6, fused=True)
    for expected, actual in zip(layer_by_layer, fused, strict=True):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("lengths", [[600], [300, 517, 64]])
def test_fused_steps_give_the_layer_by_layer_logits_bit_for_bit(fused_runner, lengths):
    # NOTE: each path decodes from its own prefill, so later steps read the keys and values
    # that path wrote to the cache.
    layer_by_layer = decode(fused_runner, prefill(fused_runner, lengths), 12, fused=False)
    fused = decode(fused_runner, prefill(fused_runner, lengths), 12, fused=True)
    for expected, actual in zip(layer_by_layer, fused, strict=True):
        assert torch.equal(actual, expected)


def test_steps_with_a_prefill_take_the_layer_by_layer_path_and_a_shared_prefix_unless_it_cascades(
    fused_runner,
):
    fused = fused_runner.model.fused_decode
    caches = fused_runner.kv_cache.layers

    def metadata(query_lens, computed, tables):
        return build_attention_metadata(
            query_lens,
            computed,
            tables,
            block_size=16,
            num_kv_heads=3,
            decode_kernel=True,
            prefill_kernel=fused_runner.uses_prefill_kernel,  # as the runner builds it
        )

    decodes = metadata([1, 1], [40, 70], [[0, 1, 2], [5, 6, 7, 8, 9]])
    assert fused.applies_to(decodes, caches, 2)
    mixed = metadata([1, 30], [40, 0], [[0, 1, 2], [5, 6]])
    assert not fused.applies_to(mixed, caches, 31)
    shared = list(range(CASCADE_MIN_SHARED_TOKENS // 16))
    context = len(shared) * 16 + 20
    shared_prefix = metadata([1, 1], [context] * 2, [[*shared, 90, 91], [*shared, 92, 93]])
    assert shared_prefix.decode_shared_gather_index is not None
    # the shared-prefix kernel serves it where the runner's prefill attention is native
    assert fused.cascades == fused_runner.uses_prefill_kernel
    assert (shared_prefix.decode_shared_block_table is not None) == fused.cascades
    assert fused.applies_to(shared_prefix, caches, 2) == fused.cascades
    assert not fused.applies_to(decodes, [tuple(c.clone() for c in layer) for layer in caches], 2)


@pytest.mark.skipif(HAS_AMX, reason="with AMX, bf16 layers run fused on the AMX matmul")
def test_without_amx_a_bf16_model_keeps_the_layer_by_layer_path(chat_model_dir):
    assert runner(chat_model_dir, "none").model.fused_decode is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int4_models_run_fused_in_bf16_and_in_float32(chat_model_dir, dtype):
    config = EngineConfig(
        chat_model_dir, dtype=dtype, kv_cache_mb=16, max_model_len=256, quantization="int4"
    )
    assert ModelRunner(config).model.fused_decode is not None


def test_decodes_sharing_a_prefix_run_fused_and_agree_with_the_cascade(fused_runner):
    generator = torch.Generator().manual_seed(5)
    shared = torch.randint(100, 20_000, (160,), generator=generator).tolist()
    sequences = []
    for index in range(3):
        own = torch.randint(100, 20_000, (90 + 40 * index,), generator=generator).tolist()
        table = list(range(10)) + list(range(100 + 12 * index, 112 + 12 * index))
        fused_runner.execute([BatchEntry(shared + own if index == 0 else own, 0 if index == 0
                                         else 160, table)])  # fmt: skip
        sequences.append((shared + own, table))
    entries = [BatchEntry([7], len(tokens), table) for tokens, table in sequences]
    for cascade in (True, False):
        metadata = build_attention_metadata(
            [1] * 3,
            [len(tokens) for tokens, _ in sequences],
            [table for _, table in sequences],
            block_size=16,
            num_kv_heads=3,
            decode_kernel=True,
            cascade=cascade,
        )
        assert (metadata.decode_shared_gather_index is not None) == cascade
    fused = fused_runner.execute(entries)
    saved, fused_runner.model.fused_decode = fused_runner.model.fused_decode, None
    try:
        cascade = fused_runner.execute(entries)  # the layer-by-layer path attends in cascade
    finally:
        fused_runner.model.fused_decode = saved
    assert torch.equal(fused.argmax(-1), cascade.argmax(-1))
    assert (fused - cascade).abs().max() < 0.05 * cascade.abs().max()


def test_a_fused_step_attending_a_shared_prefix_apart_agrees_with_the_layer_path(fused_runner):
    assert_the_cascade_agrees_with_the_layer_path(fused_runner)


def test_a_float32_fused_step_attends_a_shared_prefix_apart_as_the_layer_path_does(chat_model_dir):
    # CPUs without native bf16 run float32 models; the shared-prefix kernel serves them too.
    assert_the_cascade_agrees_with_the_layer_path(runner(chat_model_dir, "int4", torch.float32))


def assert_the_cascade_agrees_with_the_layer_path(fused_runner: ModelRunner) -> None:
    """4 decodes over one 768-token prefix (a RAG system prompt) and their own tokens, 4 steps:
    the fused call with the shared-prefix kernel (cascade) against the layer-by-layer path
    (which attends the shared part through PyTorch's flash attention)."""
    fused = fused_runner.model.fused_decode
    if not fused.cascades:
        pytest.skip("the shared-prefix kernel does not serve this runner here")
    generator = torch.Generator().manual_seed(6)
    shared = torch.randint(100, 20_000, (768,), generator=generator).tolist()
    shared_blocks = list(range(48))
    fused_runner.execute([BatchEntry(shared[:512], 0, shared_blocks)])
    fused_runner.execute([BatchEntry(shared[512:], 512, shared_blocks)])
    sequences = []
    for index in range(4):
        own = torch.randint(100, 20_000, (20 + 13 * index,), generator=generator).tolist()
        table = [*shared_blocks, *range(48 + 4 * index, 52 + 4 * index)]
        fused_runner.execute([BatchEntry(own, 768, table)])
        sequences.append((shared + own, table))
    step_metadata = build_attention_metadata(
        [1] * 4,
        [len(tokens) for tokens, _ in sequences],
        [table for _, table in sequences],
        block_size=16,
        num_kv_heads=fused_runner.model.args.num_kv_heads,
        decode_kernel=True,
        prefill_kernel=True,  # the cascade's table, as the runner builds it here
    )
    assert step_metadata.decode_shared_block_table.tolist() == shared_blocks
    assert fused.applies_to(step_metadata, fused_runner.kv_cache.layers, 4)  # the cascade runs
    # teacher-forced: both ways decode the same tokens, so each step compares like with like
    forced = torch.randint(100, 20_000, (4, len(sequences)), generator=generator).tolist()
    logits = {}
    saved = fused_runner.model.fused_decode
    for way in ("fused", "layers"):
        fused_runner.model.fused_decode = saved if way == "fused" else None
        try:
            logits[way] = torch.stack(
                [
                    fused_runner.execute(
                        [
                            BatchEntry([token], len(tokens) + step, table)
                            for token, (tokens, table) in zip(step_ids, sequences, strict=True)
                        ]
                    )
                    for step, step_ids in enumerate(forced)
                ]
            )
        finally:
            fused_runner.model.fused_decode = saved
    fused_logits, layer_logits = logits["fused"], logits["layers"]
    # bf16 rounding moves logits by ~0.1-0.5 (float32: the int4 kernel's activation codes
    # against the layer path's). Random tokens also make positions where the model amplifies a
    # last-bit difference in one layer's attention: with SmolLM2's prefix prefilled on int8
    # codes, one of these 16 moved 2.9 logits when the layer path attended through the cascade's
    # two kernels instead of the whole-context one, though both matched a float64 softmax over
    # the same cache to their bf16 rounding at every layer, and every other position stayed
    # within 0.6. So one position may stray; a wrong cascade (a missed block, a bad merge) moves
    # them all. And near-ties make a top-1 flip.
    deviation = (fused_logits - layer_logits).abs().amax(-1).flatten()  # per (step, sequence)
    bound = 0.05 * layer_logits.abs().max()
    assert int((deviation >= bound).sum()) <= 1, deviation
    assert deviation.median() < bound / 2, deviation
    assert (fused_logits.argmax(-1) == layer_logits.argmax(-1)).float().mean() >= 0.75


def test_the_engine_config_can_turn_the_fused_path_off(chat_model_dir):
    assert runner(chat_model_dir, "none", fused_decode=False).model.fused_decode is None


def test_a_dropped_runner_frees_its_model_without_waiting_for_the_garbage_collector(
    chat_model_dir,
):
    dropped = runner(chat_model_dir, "int4")
    assert dropped.model.fused_decode is not None
    model = weakref.ref(dropped.model)
    gc.disable()
    try:
        del dropped
        assert model() is None
    finally:
        gc.enable()


def tiny_runner(directory) -> ModelRunner:
    config = EngineConfig(
        directory,
        dtype=DTYPE,
        quantization=FUSED_QUANTIZATION,
        kv_cache_mb=4,
        block_size=16,
        max_model_len=256,
    )
    return ModelRunner(config)


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_q_k_norms_and_gemma_layers_keep_the_layer_by_layer_path(tiny_model_dir, kind):
    plain = tiny_runner(tiny_model_dir("llama"))  # the same shapes, fused
    assert plain.model.fused_decode is not None
    subject = tiny_runner(tiny_model_dir(kind))
    assert subject.uses_decode_kernel  # so only the layers' features rule the fused path out
    assert subject.model.fused_decode is None


def test_sliding_window_layers_keep_the_layer_by_layer_path(tiny_model_dir):
    from inference.engine.kernels import decode_layers

    model_runner = tiny_runner(tiny_model_dir("llama"))
    model, caches = model_runner.model, model_runner.kv_cache.layers
    assert decode_layers.is_supported(model, caches, 16)
    model.args.sliding_windows = (None, 64)
    assert not decode_layers.is_supported(model, caches, 16)

"""ModelRunner: runs one scheduled step (prefill chunks and decode tokens) through the model.

The scheduler hands over a list of `BatchEntry`; the runner lays them out as one flat token batch
(single-token entries first, which lets attention batch all decodes), builds the index tensors once
for all layers, and returns the logits of each entry's last token in the order given (of its last
`num_logits` tokens for a speculative verification entry).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch
from torch import nn

from inference.engine import kernels
from inference.engine.config import ConfigError, EngineConfig
from inference.engine.core.reusable_spans import BlendRun
from inference.engine.kernels import int4_linear, paged_decode_attention, paged_prefill_attention
from inference.engine.kernels.decode_layers import FusedDecode
from inference.engine.kv_cache import KVCacheSpec, allocate_kv_cache
from inference.engine.layers.attention import build_attention_metadata
from inference.engine.layers.int8_gemm import packed_int8_gemm_available
from inference.engine.layers.linear import can_pack, pack_linear_layers, pack_model_for_amx
from inference.engine.layers.quantization import (
    Int4Linear,
    QuantizedEmbedding,
    QuantizedLinear,
    dense_weight_layers,
    keep_dense_weights,
    model_weight_bytes,
)
from inference.engine.layers.rotary import RotaryEmbedding, apply_rotary
from inference.engine.loader import load_model
from inference.engine.models.causal_lm import CausalLM
from inference.engine.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# Entries of at most this many tokens may run as decodes (see `ModelRunner._runs_as_decodes`):
# verifications of up to 7 drafts; longer prompt chunks are left to the prefill path, which
# reads the context's keys/values once for all its tokens.
MAX_DECODE_SPLIT_TOKENS = 8
# With dense prefill weights, steps above this many tokens run the dense GEMM instead of the
# quantized kernel: on AMX the dense bf16 GEMM wins from a few tokens on; without it (Zen 4,
# bench.quantized_matmul) the int4 kernel still won at 32 tokens and lost from ~128.
DENSE_AMX_KERNEL_TOKENS = 8
DENSE_KERNEL_TOKENS = 64
# Chunk-KV reuse by deviation (`ModelRunner.kv_deviation`): layers run over a blended prompt to
# see which reused keys/values its context changes (the last one's are compared). CacheBlend
# compares at its second layer: the first layer's keys/values do not depend on the context.
KV_PROBE_LAYERS = 2


# With int8 GEMM codes (layers/int8_gemm.py) kept, steps above this many tokens run the integer
# GEMM: on Zen 5 it beat the 1.5B's int4 / int8 kernels by 1.5x at 16 tokens and 2-2.9x from 64
# (at 8 about even). Pure decode steps keep the fused native call, which beat the layer-by-layer
# path with int8 codes at 32 sequences (0.27 against 0.36 s a step).
INT8_GEMM_KERNEL_TOKENS = 8
# With the codes made for each step (the native kernels'), above this many: making them costs
# about what the 1.5B's int4 kernel takes for ~15 tokens, so from 64 tokens the two ways were
# even on its gate_up (Zen 4: kernel 150 GMAC/s; codes 4.7 ms + integer GEMM 6.1 ms at 64).
INT8_CODES_PER_STEP_KERNEL_TOKENS = 64
# With AMX, `auto` packs int8 codes for models at least this wide, and keeps dense copies for
# narrower ones (see `auto_prefill_weights`).
PACKED_INT8_MIN_HIDDEN_SIZE = 1024


def dense_kernel_token_limit() -> int:
    """The quantized kernel's token limit for layers that keep dense weights, on this CPU."""
    return DENSE_AMX_KERNEL_TOKENS if kernels.has_amx() else DENSE_KERNEL_TOKENS


def auto_prefill_weights(dtype: torch.dtype, hidden_size: int) -> str:
    """What `prefill_weights="auto"` keeps on this CPU for a model in `dtype`: with AMX in bf16,
    "int8" (codes kept, packed) for models at least `PACKED_INT8_MIN_HIDDEN_SIZE` wide, else
    "dense"; "int8" on other CPUs with int8 dot products (VNNI): codes kept and packed in bf16
    (`packs_int8_gemm_weights`), made per step in float32 or where packed ones would not fit
    (`ModelRunner._keep_prefill_weights`; with AMX such a machine stays quantized); else
    "quantized".

    NOTE: with AMX, packed int8 codes run oneDNN's int8 tiles, and a decode step of many
    sequences reads half the bytes of dense copies: via the API on a 2-vCPU AMX Xeon
    (bench.serving_sweep, 32 concurrent RAG chats, two runs of each alternated) the 1.5B ran
    1.19x the dense copies' speed (78.8 -> 94.0 tok/s); SmolLM2 (576 wide), whose layers are
    too narrow for the GEMM to outweigh the activations' coding around it, 0.93x. Without AMX
    the int8 GEMM runs at about twice the bf16 one on VNNI, and the codes made per step cost no
    memory; SmolLM2 gains too since the GEMM runs in blocks of 512 tokens
    (layers/int8_gemm.ROWS_PER_GEMM): via the API on Zen 4 (five runs of each alternated)
    1.06x quantized's speed (147.5 -> 155.9 tok/s), where blocks of 128 had made it 0.84x.
    Packed for oneDNN's VNNI GEMM (activations as uint8) the codes ran the 1.5B's 512-token
    prefill steps 1.53x, its 32-sequence decodes 2.26x and SmolLM2's prefills 1.46x as fast
    as codes made per step (Zen 4, in process, steps interleaved)."""
    if kernels.has_amx() and dtype == torch.bfloat16:
        packs = packs_int8_gemm_weights(dtype) and hidden_size >= PACKED_INT8_MIN_HIDDEN_SIZE
        return "int8" if packs else "dense"
    if kernels.has_int8_dot_products():
        return "int8"
    return "quantized"


def packs_int8_gemm_weights(dtype: torch.dtype) -> bool:
    """Whether `prefill_weights="int8"` keeps every quantized layer's codes packed for oneDNN's
    int8 GEMM (layers/int8_gemm.py) instead of making them per step, for a model in `dtype`: on
    CPUs with AMX, whose int8 tiles multiply packed codes faster than the packed bf16 GEMM
    multiplies dense copies, and a decode step of many sequences reads half the bytes; with
    VNNI, where `torch._int_mm` on plain codes reorders the weight every call (the 1.5B's
    layers at 512 tokens: 178 -> 122 ms, at 32: the int4 / int8 kernels' 26 -> 10 ms, Zen 4);
    in bf16, where it was measured (float32 models keep the codes made per step)."""
    has_int8_gemm = kernels.has_amx() or kernels.has_int8_dot_products()
    return has_int8_gemm and dtype == torch.bfloat16 and packed_int8_gemm_available()


def packed_int8_kernel_tokens(hidden_size: int) -> int:
    """Steps of more tokens than this run on packed int8 codes (`packs_int8_gemm_weights`), for
    a model `hidden_size` wide; smaller ones, decodes of as many sequences included, keep the
    quantized kernels and the fused decode call.

    NOTE: the packed GEMM pays a fixed cost per layer (the activations' coding, oneDNN's call)
    that narrow layers feel: without AMX SmolLM2's (576 wide) kernels beat it up to ~24 tokens
    (two layers at 16 tokens 0.94 against 1.22 ms, Zen 4) and its 16-sequence decode steps ran
    0.85x on packed codes, while the 1.5B's layers ran 2.2x faster packed already at 8."""
    if kernels.has_amx() or hidden_size >= PACKED_INT8_MIN_HIDDEN_SIZE:
        return INT8_GEMM_KERNEL_TOKENS
    return INT8_CODES_PER_STEP_KERNEL_TOKENS


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(slots=True)
class BatchEntry:
    """One sequence's share of a step."""

    # tokens to run this step (a prompt chunk, or 1 decode token)
    token_ids: list[int]
    # tokens of this sequence already in the KV cache (their positions come first)
    num_computed_tokens: int
    # physical block ids covering >= num_computed_tokens + len(token_ids) tokens
    block_table: list[int]
    # logits are returned for the last num_logits tokens (> 1: verifying speculative drafts)
    num_logits: int = 1
    # Positions of token_ids, ascending, when they are not the run after num_computed_tokens (a
    # blended prefill, core/chunk_reuse.py: the tokens recomputed among reused keys/values);
    # each token attends every position up to its own, whatever the cache holds there.
    positions: list[int] | None = None


class ModelRunner:
    """The model, its KV cache and the fast paths chosen for them, from one `EngineConfig`.

    The runner reads the config's model, dtype, device, weight and KV formats, KV budget, block
    size, max_model_len and native-kernel switches; the scheduling fields are the engine core's.
    `num_kv_blocks`, when given, sizes the KV cache instead of `kv_cache_mb` (a draft model's
    cache holding as many tokens as its target's). `is_draft`: the model only proposes
    speculative drafts, which the target checks, so its logits table may be int4 (see
    `use_int4_logits`).
    """

    def __init__(
        self, config: EngineConfig, *, num_kv_blocks: int | None = None, is_draft: bool = False
    ) -> None:
        dtype = config.dtype
        if not isinstance(dtype, torch.dtype):  # NOTE: EngineConfig.__post_init__ parsed it
            raise ConfigError(f"dtype {dtype!r} was not resolved to a torch dtype")
        device = torch.device(config.device)
        native_kernels = config.native_kernels and device.type == "cpu"
        self.native_kernels = native_kernels  # whether the native kernels may run at all
        if native_kernels and dtype in kernels.ACTIVATIONS:
            # a first build happens now, not in the first request
            kernels.preload(kernels.ACTIVATIONS[dtype])
        loaded = load_model(
            config.model_dir,
            dtype=dtype,
            device=device,
            native_kernels=native_kernels,
            quantization=config.quantization,
            quantization_group_size=config.quantization_group_size,
        )
        self.model = loaded.model
        if is_draft and native_kernels:
            use_int4_logits(self.model, config.quantization_group_size)
        # NOTE: the float layers left, if any (quantization "none", or a GGUF's float tensors
        # under "auto"); quantized ones are not nn.Linear and are left alone.
        if native_kernels:
            pack_model_for_amx(self.model)  # the layers AMX takes (none without AMX)
        if can_pack(dtype, device):
            pack_linear_layers(self.model)  # oneDNN: what AMX does not take (or no AMX)
        self.config = config
        self.quantization = config.quantization
        self.weight_bytes = model_weight_bytes(self.model)
        self.load_report = loaded.report  # time, peak memory, weights vs checkpoint bytes
        self.hf_config = loaded.hf_config
        args = self.model.args
        self.device = device
        self.dtype = dtype
        # whether every quantized layer's prefill-sized steps run on packed int8 codes
        self.int8_codes_are_packed = False
        self.prefill_weights, self.prefill_weight_bytes = self._keep_prefill_weights(
            config.prefill_weights
        )
        self.block_size = config.block_size
        self.vocab_size = args.vocab_size
        self.max_model_len = min(config.max_model_len, args.max_position_embeddings)
        spec = KVCacheSpec(
            num_layers=args.num_layers,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            block_size=config.block_size,
            dtype=dtype,
            cache_dtype=config.kv_cache_dtype,
        )
        budget_bytes = config.kv_cache_bytes
        if num_kv_blocks is not None:
            budget_bytes = num_kv_blocks * spec.bytes_per_block
        self.kv_cache = allocate_kv_cache(
            spec,
            budget_bytes=budget_bytes,
            max_model_len=self.max_model_len,
            device=device,
        )
        self.num_kv_blocks = self.kv_cache.num_blocks
        # Decode attention straight from the paged cache (bf16 or float32, on CPUs the kernels
        # run on).
        # NOTE: sliding-window layers never reach it where a context is longer than their
        # window: their metadata views gather the window (layers/attention/metadata.py).
        self.uses_decode_kernel = (
            native_kernels
            and not spec.is_quantized
            and paged_decode_attention.is_supported(
                dtype, device, args.num_heads, args.num_kv_heads, args.head_dim, config.block_size
            )
        )
        logger.info(
            "decode attention: %s",
            "native paged kernel" if self.uses_decode_kernel else "PyTorch gather + SDPA",
        )
        self.uses_prefill_kernel = self._uses_prefill_kernel(
            config.prefill_attention,
            dtype,
            can_run=native_kernels
            and not spec.is_quantized
            and paged_prefill_attention.is_supported(
                dtype, device, args.num_heads, args.num_kv_heads, args.head_dim
            ),
        )
        logger.info(
            "prefill attention: %s",
            "native paged kernel" if self.uses_prefill_kernel else "PyTorch gather + SDPA",
        )
        if self.uses_decode_kernel and config.fused_decode:
            fused = FusedDecode.build(self.model, self.kv_cache.layers, config.block_size)
            if fused is not None:
                # NOTE: a shared prefix attended once by the decodes' query rows together runs
                # as a prefill-like product (the prefill kernel's), 2-4x the decode kernel's
                # rate on it (Zen 4: 32 decodes at 1,300 tokens, 1,008 shared: a layer 1.09
                # -> 0.79 ms for SmolLM2's heads, 2.80 -> 1.64 ms for the 1.5B's).
                fused.cascades = self.uses_prefill_kernel
            if fused is not None and self.int8_codes_are_packed:
                # NOTE: decodes of more sequences run on the packed codes, layer by layer
                # (their GEMM beat the int4 / int8 kernels 2.2x at 8 tokens and 2.7x at 32 on
                # the 1.5B's layers on Zen 4; see also the dense copies' NOTE)
                fused.max_tokens = packed_int8_kernel_tokens(args.hidden_size)
            elif fused is not None and self.prefill_weights == "dense":
                # NOTE: decodes of more sequences than the quantized kernels' limit run on the
                # dense copies, layer by layer (packed bf16 on a 2-vCPU AMX Xeon, 1,264-token
                # contexts: 32 decodes 602 -> 315 ms a step, 16 343 -> 235; at 8 about even,
                # 200 against 198 with a shared prefix; at 4 the fused call wins, 145 to 190).
                fused.max_tokens = dense_kernel_token_limit()
            self.model.fused_decode = fused

    def execute(self, entries: list[BatchEntry]) -> torch.Tensor:
        """float32 logits [sum of num_logits, vocab_size]: each entry's last token(s), in order."""
        if not entries:
            raise ValueError("execute() needs at least one entry")
        self._check(entries)
        logit_rows = None
        if self._runs_as_decodes(entries):
            entries, logit_rows = split_into_decodes(entries)
        # NOTE: attention batches single-token entries only when they come first; the logits
        # are put back into the caller's order at the end.
        order = sorted(range(len(entries)), key=lambda i: len(entries[i].token_ids) > 1)
        is_reordered = order != list(range(len(entries)))
        ordered = [entries[i] for i in order] if is_reordered else entries

        with torch.inference_mode():
            query_lens = [len(e.token_ids) for e in ordered]
            # NOTE: a pure decode step on the fused path attends each context whole unless the
            # fused call `cascades` (the shared-prefix kernel): with the layers' Python gone,
            # whole contexts beat the cascade through PyTorch's attention (measured on an AMX
            # Xeon, 28 decodes: 320 shared + 600 own tokens 65 -> 51 ms a step; 1,008 + 256,
            # 52 -> 51).
            fused = self.model.fused_decode
            is_fused_step = (
                fused is not None and max(query_lens) == 1 and fused.takes(len(query_lens))
            )
            cascade = not is_fused_step or (fused is not None and fused.cascades)
            metadata = build_attention_metadata(
                query_lens,
                [e.num_computed_tokens for e in ordered],
                [e.block_table for e in ordered],
                block_size=self.block_size,
                num_kv_heads=self.model.args.num_kv_heads,
                device=self.device,
                decode_kernel=self.uses_decode_kernel,
                prefill_kernel=self.uses_prefill_kernel,
                cascade=cascade,
                sliding_windows=self.model.args.distinct_sliding_windows,
                query_positions=[e.positions for e in ordered],
            )
            input_ids = torch.tensor(
                list(itertools.chain.from_iterable(e.token_ids for e in ordered)),
                dtype=torch.int64,
                device=self.device,
            )
            hidden = self.model(input_ids, metadata.positions, metadata, self.kv_cache.layers)
            has_multi_logits = any(e.num_logits > 1 for e in entries)
            if logit_rows is not None:
                hidden = hidden[torch.tensor(logit_rows, device=self.device)]
            elif has_multi_logits:
                rows = _logit_token_indices(entries, order)
                hidden = hidden[torch.tensor(rows, device=self.device)]
            elif len(input_ids) != len(ordered):
                last_token = torch.tensor(query_lens, device=self.device).cumsum(0) - 1
                hidden = hidden[last_token]
            logits = self.model.compute_logits(hidden).float()
            if is_reordered and not has_multi_logits:
                logits = logits[torch.tensor(order).argsort().to(self.device)]
        return logits

    def _runs_as_decodes(self, entries: list[BatchEntry]) -> bool:
        """Whether this step's few-token entries (speculative verifications, a draft model's
        catch-ups) run as single-token decodes, on the fused path.

        NOTE: token j of an entry becomes a decode at position num_computed_tokens + j over the
        same blocks: every layer writes all the step's keys/values before it attends, so each
        token attends exactly what a decode of it would, and the step runs all layers natively
        with each weight tile read once for all tokens, instead of layer by layer.
        """
        if self.model.fused_decode is None:
            return False
        num_tokens = [len(e.token_ids) for e in entries]
        return max(num_tokens) > 1 and max(num_tokens) <= MAX_DECODE_SPLIT_TOKENS

    def _check(self, entries: list[BatchEntry]) -> None:
        """Reject entries that would read or write outside their sequence's blocks."""
        max_block_id = self.num_kv_blocks - 1
        for entry in entries:
            num_tokens = entry.num_computed_tokens + len(entry.token_ids)
            if not entry.token_ids:
                raise ValueError("a batch entry has no tokens to run")
            if entry.positions is not None:
                positions = entry.positions
                if len(positions) != len(entry.token_ids) or any(
                    a >= b for a, b in itertools.pairwise(positions)
                ):
                    raise ValueError("an entry's positions must ascend, one per token")
                if positions[0] < 0:
                    raise ValueError(f"positions must be >= 0, got {positions[0]}")
                num_tokens = positions[-1] + 1
            if not 1 <= entry.num_logits <= len(entry.token_ids):
                raise ValueError(
                    f"num_logits must be in [1, {len(entry.token_ids)}], got {entry.num_logits}"
                )
            if entry.num_computed_tokens < 0:
                raise ValueError(
                    f"num_computed_tokens must be >= 0, got {entry.num_computed_tokens}"
                )
            if num_tokens > self.max_model_len:
                raise ValueError(
                    f"a sequence of {num_tokens} tokens exceeds max_model_len={self.max_model_len}"
                )
            if len(entry.block_table) * self.block_size < num_tokens:
                raise ValueError(
                    f"block table of {len(entry.block_table)} blocks cannot hold {num_tokens} "
                    f"tokens with block_size={self.block_size}"
                )
            if min(entry.block_table) < 0 or max(entry.block_table) > max_block_id:
                raise ValueError(f"block ids must be in [0, {max_block_id}]")

    @staticmethod
    def _uses_prefill_kernel(setting: str, dtype: torch.dtype, *, can_run: bool) -> bool:
        """Whether prefill chunks attend through the native kernel (`prefill_attention`):
        "auto" where it runs and beats PyTorch's flash attention (bf16 on AVX-512 BF16 without
        AMX, where PyTorch's runs at a third of the GEMM rate; float32 on AVX-512: the kernel's
        `is_preferred`), "native" wherever it runs."""
        if setting == "pytorch":
            return False
        if setting == "native" and not can_run:
            logger.warning(
                "prefill_attention 'native': the kernel does not serve this model here (it needs "
                "an unquantized KV cache, a CPU the kernels build for and, in bf16, AVX-512 "
                "BF16); PyTorch's path runs"
            )
        return can_run and (setting == "native" or paged_prefill_attention.is_preferred(dtype))

    def _keep_prefill_weights(self, setting: str) -> tuple[str, int]:
        """Copies of the quantized layers' weights for prefill-sized steps, as
        `EngineConfig.prefill_weights` asks: ("dense" | "int8" | "quantized", the bytes they take).

        NOTE: on CPUs with AMX, dense bf16 copies run several times faster than unpacking the
        weight every step or the int4 kernel past a few tokens (a 200-token step of the 1.5B
        9.6 -> 3.3 s, a 768-token one 15.6 -> 4.5 s, measured side by side), and int8 codes
        kept in oneDNN's packed layout faster still for wide models (`auto_prefill_weights`);
        without AMX the dense gain was 1.1-1.4x (Zen 4), not worth 3x the weight memory.
        "int8" runs them on int8 codes (layers/int8_gemm.py) for the CPU's int8 dot products:
        kept and packed for every layer where oneDNN's int8 GEMM takes them
        (`packs_int8_gemm_weights`: AMX or VNNI, bf16), unless "auto" finds too little memory
        for them; else made for each such step where the layer's native kernel makes them, else
        kept (a byte a weight; never under "auto", where such layers stay quantized). Dense
        copies and packed codes cover the logits table too, since decode steps of many sequences
        run on them (see `__init__`; its 32-row step on the 1.5B's quantized table took 86 ms on
        an AMX Xeon); codes made per step leave it quantized: decodes keep the fused call there,
        and prefill steps need a few rows of logits."""
        is_auto = setting == "auto"
        if is_auto:
            setting = auto_prefill_weights(self.dtype, self.model.args.hidden_size)
        if setting == "quantized" or self.device.type != "cpu":
            return "quantized", 0
        packs_int8_codes = setting == "int8" and packs_int8_gemm_weights(self.dtype)
        skip = (self.model.lm_head,) if setting == "int8" and not packs_int8_codes else ()
        layers = dense_weight_layers(self.model, skip=skip)
        if not layers:
            return "quantized", 0
        if setting == "int8" and not packs_int8_codes:
            return self._use_int8_codes(layers, is_auto)
        # NOTE: packed int8 codes keep the plain ones beside them (int8_gemm.py): two bytes a
        # weight, as a bf16 copy takes
        bytes_per_weight = 2 if packs_int8_codes else self.dtype.itemsize
        if is_auto:  # what was not asked for must leave room
            num_bytes = bytes_per_weight * sum(m.in_features * m.out_features for m in layers)
            available = available_memory_bytes()
            if available is not None and num_bytes > available // 2:
                # NOTE: without AMX the codes made per step were "auto"'s choice before packing
                # (measured); with AMX that fallback was never measured: such a machine stays
                # quantized, as before
                if packs_int8_codes and not kernels.has_amx():
                    logger.info(
                        "prefill weights: int8 codes made per step: packed ones would take "
                        "%.1f GiB of the %.1f GiB available",
                        num_bytes / 2**30,
                        available / 2**30,
                    )
                    per_step_layers = dense_weight_layers(self.model, skip=(self.model.lm_head,))
                    return self._use_int8_codes(per_step_layers, is_auto)
                logger.info(
                    "prefill weights stay quantized: %s copies would take %.1f GiB of the "
                    "%.1f GiB available",
                    setting,
                    num_bytes / 2**30,
                    available / 2**30,
                )
                return "quantized", 0
        if packs_int8_codes:
            return self._keep_packed_int8_codes(layers)
        max_kernel_tokens = dense_kernel_token_limit()
        kept = keep_dense_weights(layers, max_kernel_tokens)
        logger.info(
            "prefill weights: %s copies of %d quantized layers (%.2f GiB), used for steps "
            "of more than %d tokens",
            setting,
            len(layers),
            kept / 2**30,
            max_kernel_tokens,
        )
        return setting, kept

    def _keep_packed_int8_codes(self, layers: list[QuantizedLinear]) -> tuple[str, int]:
        """int8 codes of every one of `layers` (the logits table's too), kept and packed for
        oneDNN's int8 GEMM, for steps of more than `packed_int8_kernel_tokens` tokens, decodes
        of that many sequences included (`__init__` caps the fused call there, as for dense
        copies). ("int8", the bytes kept.)"""
        max_kernel_tokens = packed_int8_kernel_tokens(self.model.args.hidden_size)
        kept = sum(
            layer.keep_int8_gemm_weight(
                max_kernel_tokens, packed=True, native_passes=self.native_kernels
            )
            for layer in layers
        )
        num_packed = sum(
            layer.int8_gemm_weight is not None and layer.int8_gemm_weight.packed is not None
            for layer in layers
        )
        logger.info(
            "prefill weights: int8 codes of %d quantized layers kept, %d packed for oneDNN's "
            "int8 GEMM (%.2f GiB), used for steps of more than %d tokens",
            len(layers),
            num_packed,
            kept / 2**30,
            max_kernel_tokens,
        )
        self.int8_codes_are_packed = num_packed == len(layers)
        return "int8", kept

    def _use_int8_codes(self, layers: list[QuantizedLinear], is_auto: bool) -> tuple[str, int]:
        """int8 codes for `layers`' prefill-sized steps: made per step where the layer's native
        kernel makes them, else kept (a byte a weight), but not under "auto": memory that was
        not asked for. ("int8" | "quantized", the bytes kept.)"""
        per_step = [layer for layer in layers if layer.makes_int8_codes_natively]
        kept_layers = [layer for layer in layers if not layer.makes_int8_codes_natively]
        if is_auto:
            kept_layers = []
        if not per_step and not kept_layers:
            return "quantized", 0
        for layer in per_step:
            layer.make_int8_codes_per_step(INT8_CODES_PER_STEP_KERNEL_TOKENS)
        kept = sum(
            layer.keep_int8_gemm_weight(INT8_GEMM_KERNEL_TOKENS, native_passes=self.native_kernels)
            for layer in kept_layers
        )
        logger.info(
            "prefill weights: int8 codes for %d quantized layers, made per step for %d (steps "
            "of more than %d tokens), kept for %d (%.2f GiB, steps of more than %d tokens)",
            len(per_step) + len(kept_layers),
            len(per_step),
            INT8_CODES_PER_STEP_KERNEL_TOKENS,
            len(kept_layers),
            kept / 2**30,
            INT8_GEMM_KERNEL_TOKENS,
        )
        return "int8", kept

    def cannot_reuse_kv_reason(self) -> str | None:
        """Why passages' keys/values cannot be moved to other positions here (chunk-KV reuse,
        `copy_reused_kv`), or None when they can."""
        if self.kv_cache.spec is not None and self.kv_cache.spec.is_quantized:
            return "the KV cache is int8 (reused keys would be re-rotated from their codes)"
        if self.model.args.distinct_sliding_windows:
            return "the model has sliding-window layers"
        if not isinstance(getattr(self.model, "rotary_emb", None), RotaryEmbedding):
            return f"{type(self.model).__name__} has no single rotary embedding"
        return None

    def can_probe_kv(self) -> bool:
        """Whether `kv_deviation` runs for this model (the Llama family's plain layer stack)."""
        return isinstance(self.model, LlamaForCausalLM) and self.model.args.num_layers > 1

    def kv_deviation(
        self, block_table: list[int], positions: list[int], token_ids: list[int]
    ) -> torch.Tensor:
        """How far the prompt's context moves each position's keys/values: float32 [positions].

        Runs the first KV_PROBE_LAYERS layers over `positions` (ascending, everything after
        the prefix-cache hit), which overwrites their keys/values there, and returns, per
        position, the relative change of the last probed layer's keys plus that of its values.
        A reused passage's copied keys/values never saw the passages before it: the positions
        they move most are where that shows (CacheBlend, "Fast Large Language Model Serving for
        RAG with Cached Knowledge Fusion", selects the same way at an early layer). The
        probed layers keep the recomputed keys/values, which are the exact ones.
        """
        model = self.model
        if not isinstance(model, LlamaForCausalLM):
            raise ValueError(f"{type(model).__name__} has no layer probe")
        block_size = self.block_size
        storage = self.kv_cache.storage[0]  # [2, layers, blocks, kv heads, block size, dim]
        layer = KV_PROBE_LAYERS - 1
        table = torch.tensor(block_table, dtype=torch.int64)
        where = torch.tensor(positions, dtype=torch.int64)
        blocks, offsets = table[where // block_size], where % block_size
        with torch.inference_mode():
            before = storage[:, layer][:, blocks, :, offsets, :].float()  # [n, 2, H, D]
            metadata = build_attention_metadata(
                [len(positions)],
                [positions[0]],
                [block_table],
                block_size=block_size,
                num_kv_heads=model.args.num_kv_heads,
                device=self.device,
                decode_kernel=self.uses_decode_kernel,
                prefill_kernel=self.uses_prefill_kernel,
                query_positions=[positions],
            )
            model.run_first_layers(
                torch.tensor(token_ids, dtype=torch.int64, device=self.device),
                metadata.positions,
                metadata,
                self.kv_cache.layers[:KV_PROBE_LAYERS],
                KV_PROBE_LAYERS,
            )
            after = storage[:, layer][:, blocks, :, offsets, :].float()
            change = (after - before).flatten(2).norm(dim=2)  # [n, 2]: keys, values
            size = after.flatten(2).norm(dim=2).clamp_min(1e-6)
            deviation: torch.Tensor = (change / size).sum(dim=1)
            return deviation

    def copy_reused_kv(self, block_table: list[int], runs: list[BlendRun]) -> None:
        """Copy each run's keys/values from its source slots to its positions in `block_table`,
        the keys rotated by the run's position shift (RoPE rotations compose: a key rotated for
        position p and then by d is the key for p + d), in float32, then rounded once."""
        storage = self.kv_cache.storage[0]  # [2, layers, blocks, kv heads, block size, dim]
        rotary = self.model.rotary_emb
        assert isinstance(rotary, RotaryEmbedding)
        block_size = self.block_size
        table = torch.tensor(block_table, dtype=torch.int64)
        with torch.inference_mode():
            for run in runs:
                source = torch.tensor(run.source_slots, dtype=torch.int64)
                positions = torch.tensor(run.target_positions, dtype=torch.int64)
                target = table[positions // block_size] * block_size + positions % block_size
                source_blocks, source_offsets = source // block_size, source % block_size
                target_blocks, target_offsets = target // block_size, target % block_size
                # NOTE: advanced indices around a slice put the token axis first: [n, L, H, D]
                keys = storage[0][:, source_blocks, :, source_offsets, :].float()
                values = storage[1][:, source_blocks, :, source_offsets, :]
                shift = torch.tensor([run.position_shift], dtype=torch.int64)
                cos, sin = rotary(shift, torch.float32)
                num_tokens = keys.shape[0]
                rotated = apply_rotary(keys.reshape(num_tokens, -1, keys.shape[-1]), cos, sin)
                storage[0][:, target_blocks, :, target_offsets, :] = rotated.view(keys.shape).to(
                    storage.dtype
                )
                storage[1][:, target_blocks, :, target_offsets, :] = values


def use_int4_logits(model: CausalLM, group_size: int) -> bool:
    """Compute `model`'s logits from an int4 copy of its logits table, on the native kernel.

    For a draft model: the table is a large share of a small model's weights, and its int8
    kernel (PyTorch's) streams it several times slower than the native int4 one streams the
    layers. Measured on Qwen2.5-Coder-0.5B drafting for the 1.5B (int4, 1 thread): a draft
    decode step 129 -> 72 ms, the drafts accepted unchanged (87% on code); the price is ~76 MB
    and the fit at load (15-40 s for its 136M-entry table on 2 busy cores). A tied model's
    embedding keeps its own table. Returns whether the table was swapped (False where the int4
    kernel cannot serve it, or the logits are int4 already).
    """
    head, embedding = model.lm_head, model.embed_tokens
    if isinstance(head, Int4Linear):
        return False
    if isinstance(head, QuantizedLinear):
        dtype = embedding.dtype if isinstance(embedding, QuantizedEmbedding) else torch.bfloat16
        table = head.dequantize_rows(0, head.out_features, dtype)
    elif isinstance(head, nn.Linear) and head.bias is None:
        table = head.weight.detach()
    elif head is None and isinstance(embedding, nn.Embedding):
        table = embedding.weight.detach()
    else:
        return False
    if not int4_linear.is_supported(table.shape[1], group_size, table.dtype, table.device):
        return False
    with torch.no_grad():
        model.lm_head = Int4Linear(table, None, group_size, dtype=table.dtype)
    logger.info("draft logits from an int4 table (groups of %d)", group_size)
    return True


def split_into_decodes(entries: list[BatchEntry]) -> tuple[list[BatchEntry], list[int]]:
    """One single-token entry per token of `entries`, and the indices among them of the
    tokens whose logits the entries want (in the order `execute` returns them)."""
    decodes: list[BatchEntry] = []
    logit_rows: list[int] = []
    for entry in entries:
        first_logit = len(decodes) + len(entry.token_ids) - entry.num_logits
        logit_rows.extend(range(first_logit, first_logit + entry.num_logits))
        start = entry.num_computed_tokens
        positions = entry.positions or range(start, start + len(entry.token_ids))
        decodes.extend(
            BatchEntry([token_id], position, entry.block_table)
            for token_id, position in zip(entry.token_ids, positions, strict=True)
        )
    return decodes, logit_rows


def _logit_token_indices(entries: list[BatchEntry], order: list[int]) -> list[int]:
    """Indices in the flat batch (laid out in `order`) of the tokens each entry wants logits of."""
    starts = [0] * len(entries)
    offset = 0
    for index in order:
        starts[index] = offset
        offset += len(entries[index].token_ids)
    return [
        starts[i] + len(entry.token_ids) - entry.num_logits + j
        for i, entry in enumerate(entries)
        for j in range(entry.num_logits)
    ]

/*
 * Paged decode attention for bf16 or float32 KV caches (`act_t`) on CPUs.
 *
 * Each decode query attends its sequence's keys/values where they lie in the paged cache
 * ([num_blocks, num_kv_heads, block_size, head_dim]): no gathered copy of the context, which the
 * PyTorch path writes and SDPA then reads again, in every layer. Work items are (sequence, KV
 * head, context partition); the query heads sharing a KV head (grouped-query attention) are
 * processed together, so each key/value row is read once for all of them. Partitions
 * (flash-decoding) keep both cores busy when a step has few sequences; their partial softmax
 * results are merged by log-sum-exp at the end.
 *
 * Keys and values are consumed 16 tokens (a "tile") at a time. Two implementations of a tile:
 * - bf16 caches on AVX-512 BF16 (`DPBF16`):
 *   - scores: vdpbf16ps gives 16 partial sums per token; a transpose-and-add tree turns the 16
 *     tokens' partial sums into one vector of 16 scores (~3 instructions a token instead of a
 *     horizontal reduction each);
 *   - values: two tokens' rows are interleaved (vpunpck*wd) so that vdpbf16ps multiplies them by
 *     the pair of their probabilities and adds both into float32 accumulators in one
 *     instruction. The interleave permutes head_dim within each 128-bit lane; the accumulators
 *     stay permuted until the end of the work item.
 * - every other build (simd.h's vectors): a float32 dot product and one reduction per token,
 *   and one multiply-add per token and 16 dimensions for the values.
 *
 * Numerics, as PyTorch's CPU flash-attention kernel: q.k and the softmax in float32, the
 * probabilities rounded to the cache's type for the weighted value sum, accumulated in float32.
 * The output is float32 (with the log-sum-exp when asked, for cascade merging).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
#define TILE 16

#if defined(__AVX512BF16__) && !defined(CACHET_ACTIVATION_FLOAT32)
#define DPBF16 1
#endif

/* NOTE: the next tile usually lies in another block, where the hardware prefetcher cannot
 * follow: its keys and values are asked for while the current tile computes. */
static inline void prefetch_tile(const act_t *k_cache, const act_t *v_cache,
                                 const int32_t *block_table, int64_t kv_head,
                                 int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                 int64_t tile_start, int64_t token_end) {
    if (tile_start >= token_end) return;
    const int64_t offset =
        (block_table[tile_start / block_size] * num_kv_heads + kv_head) * block_size * head_dim +
        (tile_start % block_size) * head_dim;
    const char *keys = (const char *)(k_cache + offset), *values = (const char *)(v_cache + offset);
    for (int64_t line = 0; line < TILE * head_dim * (int64_t)sizeof(act_t); line += 64) {
        __builtin_prefetch(keys + line);
        __builtin_prefetch(values + line);
    }
}

#if DPBF16

static inline __m512 add_pairs_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}

static inline __m512 add_quads_ps(__m512 a, __m512 b) {
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b));
    return _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
}

static inline __m512 add_lanes_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* v[t] holds 16 partial sums of token t's score; returns the 16 scores, lane t = token t. */
static inline __m512 sum_each_of_16(const __m512 *v) {
    __m512 q0 = add_quads_ps(add_pairs_ps(v[0], v[1]), add_pairs_ps(v[2], v[3]));
    __m512 q1 = add_quads_ps(add_pairs_ps(v[4], v[5]), add_pairs_ps(v[6], v[7]));
    __m512 q2 = add_quads_ps(add_pairs_ps(v[8], v[9]), add_pairs_ps(v[10], v[11]));
    __m512 q3 = add_quads_ps(add_pairs_ps(v[12], v[13]), add_pairs_ps(v[14], v[15]));
    return add_lanes_ps(add_lanes_ps(q0, q1), add_lanes_ps(q2, q3));
}

/* One work item: `group` query heads against context tokens [token_begin, token_end) of one
 * sequence and KV head (token_begin a multiple of block_size). Writes the running max, the
 * exp-sum and the unnormalised weighted value sum [group, head_dim] (in head_dim order).
 * always_inline: called with constant group/head_dim, the accumulators live in registers. */
static inline __attribute__((always_inline)) void attend_partition(
    const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
    const int32_t *block_table, int64_t kv_head, int64_t num_kv_heads, const int64_t group,
    const int64_t head_dim, int64_t block_size, int64_t token_begin, int64_t token_end,
    float scale, float *max_out, float *sum_out, float *acc_out) {
    const int64_t num_chunks = head_dim / 32; /* 32 bf16 per vector */
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    __m512 acc_lo[MAX_GROUP][MAX_HEAD_DIM / 32], acc_hi[MAX_GROUP][MAX_HEAD_DIM / 32];
    __m512i query[MAX_GROUP][MAX_HEAD_DIM / 32];
    for (int64_t g = 0; g < group; ++g) {
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
        for (int64_t c = 0; c < num_chunks; ++c) {
            acc_lo[g][c] = _mm512_setzero_ps();
            acc_hi[g][c] = _mm512_setzero_ps();
            query[g][c] = _mm512_loadu_si512((const void *)(q + g * head_dim + c * 32));
        }
    }
    const int64_t row_stride = block_size * head_dim;

    for (int64_t tile_start = token_begin; tile_start < token_end; tile_start += TILE) {
        const int64_t block_id = block_table[tile_start / block_size];
        const int64_t offset = (block_id * num_kv_heads + kv_head) * row_stride +
                               (tile_start % block_size) * head_dim;
        const uint16_t *keys = k_cache + offset;
        const uint16_t *values = v_cache + offset;
        const int64_t num_valid = token_end - tile_start < TILE ? token_end - tile_start : TILE;
        const __mmask16 valid = (__mmask16)((1u << num_valid) - 1u);
        prefetch_tile(k_cache, v_cache, block_table, kv_head, num_kv_heads, head_dim, block_size,
                      tile_start + 2 * TILE, token_end);

        uint32_t prob_pairs[MAX_GROUP][TILE / 2];
        for (int64_t g = 0; g < group; ++g) {
            __m512 partial[TILE];
            for (int64_t t = 0; t < TILE; ++t) {
                __m512 dot = _mm512_setzero_ps();
                if (t < num_valid) {
                    for (int64_t c = 0; c < num_chunks; ++c)
                        dot = _mm512_dpbf16_ps(
                            dot, (__m512bh)query[g][c],
                            (__m512bh)_mm512_loadu_si512(
                                (const void *)(keys + t * head_dim + c * 32)));
                }
                partial[t] = dot;
            }
            const __m512 scores = _mm512_mul_ps(sum_each_of_16(partial), _mm512_set1_ps(scale));
            const float tile_max = _mm512_mask_reduce_max_ps(valid, scores);
            const float new_max = tile_max > running_max[g] ? tile_max : running_max[g];
            const __m512 probs = _mm512_maskz_mov_ps(
                valid, vf_exp(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
            if (new_max != running_max[g]) {
                const float correction =
                    running_max[g] == -INFINITY ? 0.0f : expf(running_max[g] - new_max);
                const __m512 c = _mm512_set1_ps(correction);
                running_sum[g] *= correction;
                for (int64_t k = 0; k < num_chunks; ++k) {
                    acc_lo[g][k] = _mm512_mul_ps(acc_lo[g][k], c);
                    acc_hi[g][k] = _mm512_mul_ps(acc_hi[g][k], c);
                }
                running_max[g] = new_max;
            }
            running_sum[g] += _mm512_reduce_add_ps(probs);
            _mm256_storeu_si256((__m256i *)prob_pairs[g], (__m256i)_mm512_cvtneps_pbh(probs));
        }
        for (int64_t pair = 0; 2 * pair < num_valid; ++pair) {
            const uint16_t *first = values + 2 * pair * head_dim;
            const int has_second = 2 * pair + 1 < num_valid;
            for (int64_t c = 0; c < num_chunks; ++c) {
                const __m512i v0 = _mm512_loadu_si512((const void *)(first + c * 32));
                /* NOTE: rows past the context may hold anything (NaN bits): use zeros. */
                const __m512i v1 = has_second
                                       ? _mm512_loadu_si512((const void *)(first + head_dim + c * 32))
                                       : _mm512_setzero_si512();
                const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(v0, v1);
                const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(v0, v1);
                for (int64_t g = 0; g < group; ++g) {
                    const __m512bh p = (__m512bh)_mm512_set1_epi32((int)prob_pairs[g][pair]);
                    acc_lo[g][c] = _mm512_dpbf16_ps(acc_lo[g][c], p, lo);
                    acc_hi[g][c] = _mm512_dpbf16_ps(acc_hi[g][c], p, hi);
                }
            }
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        max_out[g] = running_max[g];
        sum_out[g] = running_sum[g];
        for (int64_t c = 0; c < num_chunks; ++c) {
            /* lane 4*L + i of lo holds dim 8*L + i, of hi dim 8*L + 4 + i (L: 128-bit lane) */
            float lo[16], hi[16];
            _mm512_storeu_ps(lo, acc_lo[g][c]);
            _mm512_storeu_ps(hi, acc_hi[g][c]);
            float *out = acc_out + g * head_dim + c * 32;
            for (int lane = 0; lane < 4; ++lane)
                for (int i = 0; i < 4; ++i) {
                    out[8 * lane + i] = lo[4 * lane + i];
                    out[8 * lane + 4 + i] = hi[4 * lane + i];
                }
        }
    }
}

#else /* simd.h's vectors */

/* One work item: `group` query heads against context tokens [token_begin, token_end) of one
 * sequence and KV head (token_begin a multiple of block_size). Writes the running max, the
 * exp-sum and the unnormalised weighted value sum [group, head_dim].
 * always_inline: called with constant group/head_dim, the loops unroll. */
static inline __attribute__((always_inline)) void attend_partition(
    const act_t *q, const act_t *k_cache, const act_t *v_cache, const int32_t *block_table,
    int64_t kv_head, int64_t num_kv_heads, const int64_t group, const int64_t head_dim,
    int64_t block_size, int64_t token_begin, int64_t token_end, float scale, float *max_out,
    float *sum_out, float *acc_out) {
    const int64_t num_vectors = head_dim / VF_LANES;
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    vf acc[MAX_GROUP][MAX_HEAD_DIM / VF_LANES], query[MAX_GROUP][MAX_HEAD_DIM / VF_LANES];
    for (int64_t g = 0; g < group; ++g) {
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
        for (int64_t c = 0; c < num_vectors; ++c) {
            acc[g][c] = vf_zero();
            query[g][c] = load_act(q + g * head_dim + c * VF_LANES);
        }
    }
    const int64_t row_stride = block_size * head_dim;

    for (int64_t tile_start = token_begin; tile_start < token_end; tile_start += TILE) {
        const int64_t block_id = block_table[tile_start / block_size];
        const int64_t offset = (block_id * num_kv_heads + kv_head) * row_stride +
                               (tile_start % block_size) * head_dim;
        const act_t *keys = k_cache + offset;
        const act_t *values = v_cache + offset;
        const int64_t num_valid = token_end - tile_start < TILE ? token_end - tile_start : TILE;
        prefetch_tile(k_cache, v_cache, block_table, kv_head, num_kv_heads, head_dim, block_size,
                      tile_start + 2 * TILE, token_end);

        float scores[MAX_GROUP][TILE];
        for (int64_t t = 0; t < TILE; ++t) {
            if (t >= num_valid) {
                for (int64_t g = 0; g < group; ++g) scores[g][t] = -INFINITY;
                continue;
            }
            vf dots[MAX_GROUP];
            for (int64_t g = 0; g < group; ++g) dots[g] = vf_zero();
            for (int64_t c = 0; c < num_vectors; ++c) {
                const vf key = load_act(keys + t * head_dim + c * VF_LANES);
                for (int64_t g = 0; g < group; ++g) dots[g] = vf_fmadd(query[g][c], key, dots[g]);
            }
            for (int64_t g = 0; g < group; ++g) scores[g][t] = vf_reduce_add(dots[g]) * scale;
        }
        float probs[MAX_GROUP][TILE];
        for (int64_t g = 0; g < group; ++g) {
            float tile_max = -INFINITY;
            for (int64_t t = 0; t < num_valid; ++t)
                tile_max = scores[g][t] > tile_max ? scores[g][t] : tile_max;
            const float new_max = tile_max > running_max[g] ? tile_max : running_max[g];
            vf p = vf_exp(vf_sub(vf_load(scores[g]), vf_set1(new_max)));
            vf_store(probs[g], p);
            for (int64_t t = num_valid; t < TILE; ++t) probs[g][t] = 0.0f;
            p = vf_load(probs[g]);
            if (new_max != running_max[g]) {
                const float correction =
                    running_max[g] == -INFINITY ? 0.0f : expf(running_max[g] - new_max);
                const vf c = vf_set1(correction);
                running_sum[g] *= correction;
                for (int64_t k = 0; k < num_vectors; ++k) acc[g][k] = vf_mul(acc[g][k], c);
                running_max[g] = new_max;
            }
            running_sum[g] += vf_reduce_add(p);
            vf_store(probs[g], round_act(p));
        }
        for (int64_t c = 0; c < num_vectors; ++c)
            for (int64_t t = 0; t < num_valid; ++t) {
                /* NOTE: rows past the context may hold anything (NaN bits): never read */
                const vf value = load_act(values + t * head_dim + c * VF_LANES);
                for (int64_t g = 0; g < group; ++g)
                    acc[g][c] = vf_fmadd(vf_set1(probs[g][t]), value, acc[g][c]);
            }
    }
    for (int64_t g = 0; g < group; ++g) {
        max_out[g] = running_max[g];
        sum_out[g] = running_sum[g];
        for (int64_t c = 0; c < num_vectors; ++c)
            vf_store(acc_out + g * head_dim + c * VF_LANES, acc[g][c]);
    }
}
#endif

typedef void (*attend_fn)(const act_t *, const act_t *, const act_t *, const int32_t *,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                          float *, float *, float *);

/* Instances with constant sizes for the common shapes, one generic for the rest. */
#define ATTEND_INSTANCE(GROUP, HEAD_DIM)                                                        \
    static void attend_##GROUP##_##HEAD_DIM(                                                    \
        const act_t *q, const act_t *k, const act_t *v, const int32_t *table,                   \
        int64_t head, int64_t num_kv_heads, int64_t group, int64_t head_dim, int64_t block_size, \
        int64_t begin, int64_t end, float scale, float *m, float *s, float *acc) {              \
        (void)group;                                                                            \
        (void)head_dim;                                                                         \
        attend_partition(q, k, v, table, head, num_kv_heads, GROUP, HEAD_DIM, block_size, begin, \
                         end, scale, m, s, acc);                                                \
    }
ATTEND_INSTANCE(1, 64)
ATTEND_INSTANCE(2, 64)
ATTEND_INSTANCE(3, 64)
ATTEND_INSTANCE(4, 64)
ATTEND_INSTANCE(5, 64)
ATTEND_INSTANCE(6, 64)
ATTEND_INSTANCE(7, 64)
ATTEND_INSTANCE(8, 64)
ATTEND_INSTANCE(1, 128)
ATTEND_INSTANCE(2, 128)
ATTEND_INSTANCE(3, 128)
ATTEND_INSTANCE(4, 128)
ATTEND_INSTANCE(5, 128)
ATTEND_INSTANCE(6, 128)
ATTEND_INSTANCE(7, 128)
ATTEND_INSTANCE(8, 128)

static void attend_generic(const act_t *q, const act_t *k, const act_t *v,
                           const int32_t *table, int64_t head, int64_t num_kv_heads, int64_t group,
                           int64_t head_dim, int64_t block_size, int64_t begin, int64_t end,
                           float scale, float *m, float *s, float *acc) {
    attend_partition(q, k, v, table, head, num_kv_heads, group, head_dim, block_size, begin, end,
                     scale, m, s, acc);
}

static attend_fn select_attend(int64_t group, int64_t head_dim) {
    static const attend_fn by_group_64[8] = {attend_1_64, attend_2_64, attend_3_64, attend_4_64,
                                             attend_5_64, attend_6_64, attend_7_64, attend_8_64};
    static const attend_fn by_group_128[8] = {attend_1_128, attend_2_128, attend_3_128,
                                              attend_4_128, attend_5_128, attend_6_128,
                                              attend_7_128, attend_8_128};
    if (group <= 8 && head_dim == 64) return by_group_64[group - 1];
    if (group <= 8 && head_dim == 128) return by_group_128[group - 1];
    return attend_generic;
}

/*
 * q:            [num_seqs, num_kv_heads, group, head_dim], contiguous
 * k/v_cache:    [num_blocks, num_kv_heads, block_size, head_dim], contiguous
 * block_tables: [num_seqs, table_stride] int32; context_lens: [num_seqs] int32 (>= 1)
 * Each sequence's context is split in num_parts partitions of tokens_per_part tokens.
 * out:          [num_seqs, num_kv_heads, group, head_dim] float32
 * lse:          [num_seqs, num_kv_heads, group] float32 log-sum-exp of the scaled scores, or NULL
 * scratch:      num_seqs * num_kv_heads * num_parts * group * (head_dim + 2) floats
 * Returns 0, or -1 when a size is outside what the kernel supports (nothing is written).
 */
int paged_decode_attention(const act_t *q, const act_t *k_cache, const act_t *v_cache,
                           const int32_t *block_tables, int64_t table_stride,
                           const int32_t *context_lens, int64_t num_seqs, int64_t num_kv_heads,
                           int64_t group, int64_t head_dim, int64_t block_size, float scale,
                           int64_t tokens_per_part, int64_t num_parts, float *out, float *lse,
                           float *scratch, int num_threads) {
    if (group < 1 || group > MAX_GROUP || head_dim < 32 || head_dim % 32 ||
        head_dim > MAX_HEAD_DIM || block_size % TILE || tokens_per_part < block_size ||
        tokens_per_part % block_size || num_parts < 1)
        return -1;
    const attend_fn attend = select_attend(group, head_dim);
    const int64_t part_floats = group * (head_dim + 2);
    const int64_t num_items = num_seqs * num_kv_heads * num_parts;

#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; ++item) {
        const int64_t part = item % num_parts;
        const int64_t head = (item / num_parts) % num_kv_heads;
        const int64_t seq = item / (num_parts * num_kv_heads);
        float *partial = scratch + item * part_floats;
        const int64_t begin = part * tokens_per_part;
        int64_t end = begin + tokens_per_part;
        if (end > context_lens[seq]) end = context_lens[seq];
        if (begin >= end) {
            for (int64_t g = 0; g < group; ++g) {
                partial[g] = -INFINITY;
                partial[group + g] = 0.0f;
            }
            continue;
        }
        attend(q + (seq * num_kv_heads + head) * group * head_dim, k_cache, v_cache,
               block_tables + seq * table_stride, head, num_kv_heads, group, head_dim,
               block_size, begin, end, scale, partial, partial + group, partial + 2 * group);
    }

#pragma omp parallel for num_threads(num_threads)
    for (int64_t row = 0; row < num_seqs * num_kv_heads; ++row) {
        const float *parts = scratch + row * num_parts * part_floats;
        for (int64_t g = 0; g < group; ++g) {
            float global_max = -INFINITY;
            for (int64_t p = 0; p < num_parts; ++p)
                if (parts[p * part_floats + g] > global_max) global_max = parts[p * part_floats + g];
            float total = 0.0f;
            float *o = out + (row * group + g) * head_dim;
            memset(o, 0, (size_t)head_dim * sizeof(float));
            for (int64_t p = 0; p < num_parts; ++p) {
                const float *partial = parts + p * part_floats;
                if (partial[group + g] == 0.0f) continue;
                const float weight = expf(partial[g] - global_max);
                total += partial[group + g] * weight;
                const float *acc = partial + 2 * group + g * head_dim;
                for (int64_t d = 0; d < head_dim; ++d) o[d] += acc[d] * weight;
            }
            const float inverse = 1.0f / total;
            for (int64_t d = 0; d < head_dim; ++d) o[d] *= inverse;
            if (lse) lse[row * group + g] = global_max + logf(total);
        }
    }
    return 0;
}

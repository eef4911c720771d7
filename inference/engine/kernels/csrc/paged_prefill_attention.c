/*
 * Paged prefill attention: the queries of one sequence's prefill chunk attend its keys/values
 * where they lie in the paged cache ([num_blocks, num_kv_heads, block_size, head_dim]), each up
 * to its own position: no gathered copy of the context and no mask tensor. Two builds:
 * - bf16 caches on CPUs with AVX-512 BF16 (Zen 4 and later, Cooper Lake, Sapphire Rapids):
 *   PyTorch's CPU flash attention, which the engine calls otherwise, multiplies its small tiles
 *   at ~110-140 GFLOP/s on a 2-vCPU Zen 4, a quarter to a third of the machine's bf16 GEMM
 *   rate; here the two products of each tile are register-blocked vdpbf16ps loops;
 * - float32 caches on every level (AVX-512, AVX2, NEON: simd.h's vectors), for the CPUs that
 *   run models in float32 (no native bf16): the same work items with float32 multiply-adds,
 *   register-blocked per level. There PyTorch's path also gathers the context into a copy
 *   every layer (measured on a Xeon without BF16, the 1.5B's 512-token steps: 0.67 s of flash
 *   attention and 0.25 s of gathering in 3.6 s).
 *
 * A work item is (KV head, run of query tokens). Its rows are the run's tokens times the query
 * heads sharing the KV head (grouped-query attention: each key/value row is read once for all
 * of them). The keys are taken KEY_GROUP at a time (flash attention's online softmax):
 * - scores: the group's keys are transposed (bf16: into dim pairs x 16 keys, so that vdpbf16ps
 *   multiplies a broadcast pair of a query's dims by 16 keys' pairs at once; float32: dims x 16
 *   keys, one multiply-add of a broadcast dim by 16 keys); rows x tiles of 16 keys are
 *   accumulated in registers;
 * - softmax: per row, the keys past its position masked out (and with them whatever the cache
 *   holds past the context), the running max and sum updated;
 * - values: bf16: two keys' rows are interleaved (vpunpck*wd) so that vdpbf16ps multiplies them
 *   by the pair of their probabilities, the float32 accumulators, kept in a per-thread buffer
 *   between groups, lane-permuted until the end of the item; float32: each key's row read from
 *   the cache, multiplied by a broadcast probability into rows x 32 dims of accumulators.
 *
 * Numerics, as PyTorch's CPU flash-attention kernel: q.k and the softmax in float32, the
 * probabilities rounded to the cache's type for the weighted value sum (bf16; float32: none),
 * accumulated in float32; the output rounded to the cache's type once.
 *
 * bf16 builds without AVX-512 BF16 have the entry point but serve nothing
 * (`paged_prefill_attention_is_built` says so): the engine keeps PyTorch's attention there
 * (bf16 models run only on CPUs with native bf16 arithmetic anyway).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#if defined(__AVX512BF16__) && !defined(CACHET_ACTIVATION_FLOAT32)
#define PREFILL_DPBF16 1
#else
#define PREFILL_DPBF16 0
#endif
#if defined(CACHET_ACTIVATION_FLOAT32)
#define PREFILL_FLOAT32 1
#else
#define PREFILL_FLOAT32 0
#endif
#define PREFILL_BUILT (PREFILL_DPBF16 || PREFILL_FLOAT32)

#define KEY_TILE 16
#define TILES_PER_GROUP 4
#define KEY_GROUP (KEY_TILE * TILES_PER_GROUP)
#define ROW_BLOCK 4
#define MAX_HEAD_DIM 256
/* Decodes per work item of a shared prefix: few enough that a step's decodes make several items
 * per thread, enough that each group of keys transposed serves a few row blocks. */
#define SHARED_PREFIX_SEQS_PER_ITEM 16

int paged_prefill_attention_is_built(void) { return PREFILL_BUILT; }

#if PREFILL_BUILT
static inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* Where key `position` of KV head `kv_head` lies in a cache. */
static inline int64_t cache_row(const int32_t *block_table, int64_t position, int64_t kv_head,
                                int64_t num_kv_heads, int64_t block_size, int64_t head_dim) {
    return ((block_table[position / block_size] * num_kv_heads + kv_head) * block_size +
            position % block_size) *
           head_dim;
}

/* One aligned allocation cut into `count` buffers of the given sizes (each 64-byte aligned);
 * the block to free, or NULL without memory. */
static void *alloc_buffers(const size_t *sizes, void ***fields, size_t count) {
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) total += (size_t)round_up((int64_t)sizes[i], 64);
    char *p = aligned_alloc(64, total);
    if (!p) return NULL;
    char *next = p;
    for (size_t i = 0; i < count; ++i) {
        *fields[i] = next;
        next += round_up((int64_t)sizes[i], 64);
    }
    return p;
}

/* An item's rows before its first group of keys: row r (token first_token + r / group, query
 * head kv_head * group + r % group) gets its query copied into `queries` (head_dim values of
 * act_t a row; zeros for the padding rows past num_rows), the last key position it attends
 * (-1 for padding) and a fresh online softmax (max, sum, correction, zeroed accumulators).
 * Returns one past the last key any row attends. */
static int64_t start_rows(const act_t *q, int64_t q_stride, const int32_t *positions,
                          int64_t first_token, int64_t num_rows, int64_t padded_rows,
                          int64_t group, int64_t kv_head, int64_t head_dim, act_t *queries,
                          int64_t *last_key, float *running_max, float *running_sum,
                          float *correction, float *acc) {
    int64_t key_end = 0;
    for (int64_t r = 0; r < padded_rows; ++r) {
        act_t *row = queries + r * head_dim;
        if (r < num_rows) {
            const int64_t token = first_token + r / group, head = kv_head * group + r % group;
            memcpy(row, q + token * q_stride + head * head_dim, sizeof(act_t) * head_dim);
            last_key[r] = positions[token];
            if (positions[token] + 1 > key_end) key_end = positions[token] + 1;
        } else {
            memset(row, 0, sizeof(act_t) * head_dim);
            last_key[r] = -1;
        }
        running_max[r] = -INFINITY;
        running_sum[r] = 0.0f;
        correction[r] = 1.0f;
        memset(acc + r * head_dim, 0, sizeof(float) * head_dim);
    }
    return key_end;
}
#endif

#if PREFILL_DPBF16
#define ROW_PAD ROW_BLOCK

/* One thread's buffers, sized for items of up to `max_rows` rows. */
typedef struct {
    uint32_t *query_pairs; /* [rows][head_dim / 2] */
    float *scores;         /* [rows][KEY_GROUP] */
    uint32_t *prob_pairs;  /* [rows][KEY_GROUP / 2] */
    float *acc;            /* [rows][head_dim], lane-permuted */
    uint32_t *key_pairs;   /* [TILES_PER_GROUP][head_dim / 2][KEY_TILE] */
    uint32_t *value_pairs; /* [KEY_GROUP / 2][head_dim] (bf16 pairs of two keys) */
    float *running_max, *running_sum, *correction;
    int64_t *last_key; /* [rows]: the last key position each row attends; -1 for padding */
    void *block;
} Scratch;

static int scratch_alloc(Scratch *s, int64_t max_rows, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    const size_t sizes[] = {
        (size_t)(max_rows * half) * 4,         (size_t)(max_rows * KEY_GROUP) * 4,
        (size_t)(max_rows * KEY_GROUP / 2) * 4, (size_t)(max_rows * head_dim) * 4,
        (size_t)(TILES_PER_GROUP * half * KEY_TILE) * 4, (size_t)(KEY_GROUP / 2 * head_dim) * 4,
        (size_t)max_rows * 4, (size_t)max_rows * 4, (size_t)max_rows * 4, (size_t)max_rows * 8,
    };
    void **fields[] = {(void **)&s->query_pairs, (void **)&s->scores,      (void **)&s->prob_pairs,
                       (void **)&s->acc,         (void **)&s->key_pairs,   (void **)&s->value_pairs,
                       (void **)&s->running_max, (void **)&s->running_sum, (void **)&s->correction,
                       (void **)&s->last_key};
    s->block = alloc_buffers(sizes, fields, sizeof(sizes) / sizeof(sizes[0]));
    return s->block ? 0 : -1;
}

/*
 * One work item: query tokens [first_token, first_token + num_tokens) of the span, the `group`
 * query heads of KV head `kv_head`. q/out rows: token t, head h at (t * stride + h * head_dim).
 * With `out_f32`, the rows are written there in float32 instead (same strides), and the
 * log-sum-exp of each row's scaled scores to lse[t * num_kv_heads * group + h].
 * always_inline: called with constant head_dim, the loops over it unroll.
 */
static inline __attribute__((always_inline)) void attend_item(
    const uint16_t *q, int64_t q_stride, const uint16_t *k_cache, const uint16_t *v_cache,
    const int32_t *block_table, const int32_t *positions, int64_t first_token, int64_t num_tokens,
    int64_t kv_head, int64_t num_kv_heads, int64_t group, const int64_t head_dim,
    int64_t block_size, float scale, uint16_t *out, float *out_f32, float *lse,
    int64_t out_stride, Scratch *s) {
    const int64_t half = head_dim / 2;
    const int64_t num_rows = num_tokens * group;
    const int64_t padded_rows = round_up(num_rows, ROW_BLOCK);
    const int64_t acc_vectors = head_dim / 16;
    /* Rows multiplied together in the value pass: 16 accumulators in registers. */
    const int64_t value_rows = head_dim <= 64 ? 4 : head_dim <= 128 ? 2 : 1;

    const int64_t key_end = start_rows(
        q, q_stride, positions, first_token, num_rows, padded_rows, group, kv_head, head_dim,
        (act_t *)s->query_pairs, s->last_key, s->running_max, s->running_sum, s->correction,
        s->acc);
    memset(s->prob_pairs, 0, sizeof(uint32_t) * padded_rows * (KEY_GROUP / 2));

    for (int64_t group_start = 0; group_start < key_end; group_start += KEY_GROUP) {
        const int64_t num_keys =
            key_end - group_start < KEY_GROUP ? key_end - group_start : KEY_GROUP;

        /* Keys as dim pairs: key_pairs[tile][pair][key]; keys past key_end are zeros. */
        for (int64_t tile = 0; tile < TILES_PER_GROUP; ++tile) {
            uint32_t *dst = s->key_pairs + tile * half * KEY_TILE;
            const int64_t tile_start = group_start + tile * KEY_TILE;
            for (int64_t t = 0; t < KEY_TILE; ++t) {
                if (tile_start + t >= key_end) {
                    for (int64_t p = 0; p < half; ++p) dst[p * KEY_TILE + t] = 0;
                    continue;
                }
                const uint32_t *row = (const uint32_t *)(k_cache + cache_row(block_table,
                                                                             tile_start + t, kv_head,
                                                                             num_kv_heads,
                                                                             block_size, head_dim));
                for (int64_t p = 0; p < half; ++p) dst[p * KEY_TILE + t] = row[p];
            }
        }

        /* Values as pairs of keys interleaved; a key past key_end is zeros (the cache may hold
         * NaN bits there, and 0 x NaN is NaN). */
        const int64_t num_pairs = (num_keys + 1) / 2;
        for (int64_t pair = 0; pair < num_pairs; ++pair) {
            const int64_t first = group_start + 2 * pair;
            const uint16_t *v0 =
                v_cache + cache_row(block_table, first, kv_head, num_kv_heads, block_size, head_dim);
            const uint16_t *v1 = first + 1 < key_end
                                     ? v_cache + cache_row(block_table, first + 1, kv_head,
                                                           num_kv_heads, block_size, head_dim)
                                     : NULL;
            uint32_t *dst = s->value_pairs + pair * head_dim;
            for (int64_t c = 0; c < head_dim / 32; ++c) {
                const __m512i a = _mm512_loadu_si512((const void *)(v0 + c * 32));
                const __m512i b =
                    v1 ? _mm512_loadu_si512((const void *)(v1 + c * 32)) : _mm512_setzero_si512();
                _mm512_store_si512((void *)(dst + c * 32), _mm512_unpacklo_epi16(a, b));
                _mm512_store_si512((void *)(dst + c * 32 + 16), _mm512_unpackhi_epi16(a, b));
            }
        }

        /* Scores: ROW_BLOCK rows x 4 tiles of 16 keys at a time. */
        for (int64_t r = 0; r < padded_rows; r += ROW_BLOCK) {
            __m512 acc[ROW_BLOCK][TILES_PER_GROUP];
            for (int64_t i = 0; i < ROW_BLOCK; ++i)
                for (int64_t j = 0; j < TILES_PER_GROUP; ++j) acc[i][j] = _mm512_setzero_ps();
            const uint32_t *rows = s->query_pairs + r * half;
            for (int64_t p = 0; p < half; ++p) {
                __m512bh keys[TILES_PER_GROUP];
                for (int64_t j = 0; j < TILES_PER_GROUP; ++j)
                    keys[j] = (__m512bh)_mm512_load_si512(
                        (const void *)(s->key_pairs + (j * half + p) * KEY_TILE));
                for (int64_t i = 0; i < ROW_BLOCK; ++i) {
                    const __m512bh query = (__m512bh)_mm512_set1_epi32((int)rows[i * half + p]);
                    for (int64_t j = 0; j < TILES_PER_GROUP; ++j)
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], query, keys[j]);
                }
            }
            for (int64_t i = 0; i < ROW_BLOCK; ++i)
                for (int64_t j = 0; j < TILES_PER_GROUP; ++j)
                    _mm512_store_ps(s->scores + (r + i) * KEY_GROUP + j * KEY_TILE, acc[i][j]);
        }

        /* Online softmax, row by row. */
        const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        for (int64_t r = 0; r < num_rows; ++r) {
            const int64_t last = s->last_key[r] - group_start; /* keys [0, last] of the group */
            uint32_t *probs_out = s->prob_pairs + r * (KEY_GROUP / 2);
            if (last < 0) { /* the row's queries end before this group */
                memset(probs_out, 0, KEY_GROUP / 2 * 4);
                s->correction[r] = 1.0f;
                continue;
            }
            __m512 scores[TILES_PER_GROUP];
            __mmask16 valid[TILES_PER_GROUP];
            float group_max = -INFINITY;
            for (int64_t j = 0; j < TILES_PER_GROUP; ++j) {
                valid[j] = _mm512_cmple_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32((int)(j * KEY_TILE))),
                                                   _mm512_set1_epi32((int)(last < KEY_GROUP ? last : KEY_GROUP - 1)));
                scores[j] = _mm512_mul_ps(_mm512_load_ps(s->scores + r * KEY_GROUP + j * KEY_TILE),
                                          _mm512_set1_ps(scale));
                if (valid[j]) {
                    const float tile_max = _mm512_mask_reduce_max_ps(valid[j], scores[j]);
                    if (tile_max > group_max) group_max = tile_max;
                }
            }
            const float old_max = s->running_max[r];
            const float new_max = group_max > old_max ? group_max : old_max;
            const float correction = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
            __m512 sum = _mm512_setzero_ps();
            for (int64_t j = 0; j < TILES_PER_GROUP; ++j) {
                const __m512 p = _mm512_maskz_mov_ps(
                    valid[j], vf_exp(_mm512_sub_ps(scores[j], _mm512_set1_ps(new_max))));
                sum = _mm512_add_ps(sum, p);
                _mm256_store_si256((__m256i *)(probs_out + j * KEY_TILE / 2),
                                   (__m256i)_mm512_cvtneps_pbh(p));
            }
            s->running_sum[r] = s->running_sum[r] * correction + _mm512_reduce_add_ps(sum);
            s->running_max[r] = new_max;
            s->correction[r] = correction;
        }

        /* Weighted values: value_rows rows at a time, their accumulators in registers. */
        for (int64_t r = 0; r < padded_rows; r += value_rows) {
            __m512 acc[4][MAX_HEAD_DIM / 16];
            for (int64_t i = 0; i < value_rows; ++i) {
                const __m512 c = _mm512_set1_ps(s->correction[r + i]);
                for (int64_t v = 0; v < acc_vectors; ++v)
                    acc[i][v] = _mm512_mul_ps(
                        _mm512_load_ps(s->acc + (r + i) * head_dim + v * 16), c);
            }
            for (int64_t pair = 0; pair < num_pairs; ++pair) {
                __m512bh probs[4];
                for (int64_t i = 0; i < value_rows; ++i)
                    probs[i] = (__m512bh)_mm512_set1_epi32(
                        (int)s->prob_pairs[(r + i) * (KEY_GROUP / 2) + pair]);
                const uint32_t *values = s->value_pairs + pair * head_dim;
                for (int64_t v = 0; v < acc_vectors; ++v) {
                    const __m512bh value =
                        (__m512bh)_mm512_load_si512((const void *)(values + v * 16));
                    for (int64_t i = 0; i < value_rows; ++i)
                        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], probs[i], value);
                }
            }
            for (int64_t i = 0; i < value_rows; ++i)
                for (int64_t v = 0; v < acc_vectors; ++v)
                    _mm512_store_ps(s->acc + (r + i) * head_dim + v * 16, acc[i][v]);
        }
    }

    /* Normalise, undo the lane permutation (vector 2c: lane 4L + i holds dim 32c + 8L + i;
     * vector 2c + 1: dim 32c + 8L + 4 + i), round to bf16. */
    for (int64_t r = 0; r < num_rows; ++r) {
        const int64_t token = first_token + r / group, head = kv_head * group + r % group;
        const float inverse = 1.0f / s->running_sum[r];
        const float *acc = s->acc + r * head_dim;
        float ordered[MAX_HEAD_DIM];
        for (int64_t c = 0; c < head_dim / 32; ++c)
            for (int lane_group = 0; lane_group < 4; ++lane_group)
                for (int i = 0; i < 4; ++i) {
                    ordered[c * 32 + 8 * lane_group + i] = acc[c * 32 + 4 * lane_group + i];
                    ordered[c * 32 + 8 * lane_group + 4 + i] = acc[c * 32 + 16 + 4 * lane_group + i];
                }
        if (out_f32) {
            float *dst = out_f32 + token * out_stride + head * head_dim;
            for (int64_t d = 0; d < head_dim; d += 16)
                _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(ordered + d),
                                                        _mm512_set1_ps(inverse)));
            lse[token * num_kv_heads * group + head] =
                s->running_max[r] + logf(s->running_sum[r]);
            continue;
        }
        uint16_t *dst = out + token * out_stride + head * head_dim;
        for (int64_t d = 0; d < head_dim; d += 16)
            _mm256_storeu_si256(
                (__m256i *)(dst + d),
                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(ordered + d),
                                                          _mm512_set1_ps(inverse))));
    }
}

#elif PREFILL_FLOAT32
/* Register blocking per level: score rows x tiles of 16 keys, and value rows (x 32 dims), in
 * accumulators that fit the level's registers (a vf is one AVX-512 register, two AVX2 ones,
 * four NEON ones). */
#if CACHET_SIMD_AVX512
#define SCORE_ROWS 4
#define SCORE_TILES 4
#define VALUE_ROWS 8
#else
#define SCORE_ROWS 2
#define SCORE_TILES 2
#define VALUE_ROWS 2
#endif
#define VALUE_VECTORS 2 /* 32 dims: head_dim is a multiple of 32 */
#define ROW_PAD 8       /* a multiple of SCORE_ROWS and VALUE_ROWS */

/* One thread's buffers, sized for items of up to `max_rows` rows. */
typedef struct {
    float *queries;   /* [rows][head_dim] */
    float *scores;    /* [rows][KEY_GROUP]: scaled, then the probabilities */
    float *acc;       /* [rows][head_dim] */
    float *key_t;     /* [TILES_PER_GROUP][head_dim][KEY_TILE] */
    float *running_max, *running_sum, *correction;
    int64_t *last_key;      /* [rows]: the last key position each row attends; -1 for padding */
    int64_t *value_offset;  /* [KEY_GROUP]: where each key of the group lies in the cache */
    void *block;
} Scratch;

static int scratch_alloc(Scratch *s, int64_t max_rows, int64_t head_dim) {
    const size_t sizes[] = {
        (size_t)(max_rows * head_dim) * 4, (size_t)(max_rows * KEY_GROUP) * 4,
        (size_t)(max_rows * head_dim) * 4, (size_t)(TILES_PER_GROUP * head_dim * KEY_TILE) * 4,
        (size_t)max_rows * 4,              (size_t)max_rows * 4,
        (size_t)max_rows * 4,              (size_t)max_rows * 8,
        (size_t)KEY_GROUP * 8,
    };
    void **fields[] = {(void **)&s->queries,     (void **)&s->scores,
                       (void **)&s->acc,         (void **)&s->key_t,
                       (void **)&s->running_max, (void **)&s->running_sum,
                       (void **)&s->correction,  (void **)&s->last_key,
                       (void **)&s->value_offset};
    s->block = alloc_buffers(sizes, fields, sizeof(sizes) / sizeof(sizes[0]));
    return s->block ? 0 : -1;
}

/* As the bf16 attend_item above, in float32 with simd.h's vectors. */
static inline __attribute__((always_inline)) void attend_item(
    const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
    const int32_t *block_table, const int32_t *positions, int64_t first_token, int64_t num_tokens,
    int64_t kv_head, int64_t num_kv_heads, int64_t group, const int64_t head_dim,
    int64_t block_size, float scale, float *out, float *out_f32, float *lse, int64_t out_stride,
    Scratch *s) {
    const int64_t num_rows = num_tokens * group;
    const int64_t padded_rows = round_up(num_rows, ROW_PAD);

    const int64_t key_end = start_rows(q, q_stride, positions, first_token, num_rows, padded_rows,
                                       group, kv_head, head_dim, s->queries, s->last_key,
                                       s->running_max, s->running_sum, s->correction, s->acc);
    /* NOTE: padding rows keep zero probabilities: the value pass multiplies them too */
    memset(s->scores, 0, sizeof(float) * padded_rows * KEY_GROUP);

    for (int64_t group_start = 0; group_start < key_end; group_start += KEY_GROUP) {
        const int64_t num_keys =
            key_end - group_start < KEY_GROUP ? key_end - group_start : KEY_GROUP;

        /* Keys transposed: key_t[tile][dim][key]; keys past key_end are zeros (the cache may
         * hold NaN bits there). */
        for (int64_t key = 0; key < KEY_GROUP; ++key) {
            float *dst = s->key_t + (key / KEY_TILE) * head_dim * KEY_TILE + key % KEY_TILE;
            if (key >= num_keys) {
                for (int64_t d = 0; d < head_dim; ++d) dst[d * KEY_TILE] = 0.0f;
                continue;
            }
            const int64_t offset = cache_row(block_table, group_start + key, kv_head,
                                             num_kv_heads, block_size, head_dim);
            s->value_offset[key] = offset;
            const float *row = k_cache + offset;
            for (int64_t d = 0; d < head_dim; ++d) dst[d * KEY_TILE] = row[d];
        }

        /* Scores: SCORE_ROWS rows x SCORE_TILES tiles of 16 keys at a time. */
        for (int64_t r = 0; r < padded_rows; r += SCORE_ROWS)
            for (int64_t tile = 0; tile < TILES_PER_GROUP; tile += SCORE_TILES) {
                vf acc[SCORE_ROWS][SCORE_TILES];
                for (int i = 0; i < SCORE_ROWS; ++i)
                    for (int j = 0; j < SCORE_TILES; ++j) acc[i][j] = vf_zero();
                const float *keys_of = s->key_t + tile * head_dim * KEY_TILE;
                for (int64_t d = 0; d < head_dim; ++d) {
                    vf keys[SCORE_TILES];
                    for (int j = 0; j < SCORE_TILES; ++j)
                        keys[j] = vf_load(keys_of + (j * head_dim + d) * KEY_TILE);
                    for (int i = 0; i < SCORE_ROWS; ++i) {
                        const vf query = vf_set1(s->queries[(r + i) * head_dim + d]);
                        for (int j = 0; j < SCORE_TILES; ++j)
                            acc[i][j] = vf_fmadd(query, keys[j], acc[i][j]);
                    }
                }
                for (int i = 0; i < SCORE_ROWS; ++i)
                    for (int j = 0; j < SCORE_TILES; ++j)
                        vf_store(s->scores + (r + i) * KEY_GROUP + (tile + j) * KEY_TILE,
                                 vf_mul(acc[i][j], vf_set1(scale)));
            }

        /* Online softmax, row by row: the scores become probabilities in place. */
        for (int64_t r = 0; r < num_rows; ++r) {
            const int64_t last = s->last_key[r] - group_start; /* keys [0, last] of the group */
            float *scores = s->scores + r * KEY_GROUP;
            if (last < 0) { /* the row's queries end before this group */
                memset(scores, 0, KEY_GROUP * 4);
                s->correction[r] = 1.0f;
                continue;
            }
            const int64_t num_valid = last + 1 < KEY_GROUP ? last + 1 : KEY_GROUP;
            for (int64_t key = num_valid; key < KEY_GROUP; ++key) scores[key] = -INFINITY;
            vf top = vf_load(scores);
            for (int64_t j = 1; j < TILES_PER_GROUP; ++j)
                top = vf_max(top, vf_load(scores + j * KEY_TILE));
            const float group_max = vf_reduce_max(top);
            const float old_max = s->running_max[r];
            const float new_max = group_max > old_max ? group_max : old_max;
            const float correction = old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
            for (int64_t j = 0; j < TILES_PER_GROUP; ++j)
                vf_store(scores + j * KEY_TILE,
                         vf_exp(vf_sub(vf_load(scores + j * KEY_TILE), vf_set1(new_max))));
            /* NOTE: vf_exp clamps its argument, so masked keys are zeroed, not exp(-inf) */
            for (int64_t key = num_valid; key < KEY_GROUP; ++key) scores[key] = 0.0f;
            vf sum = vf_zero();
            for (int64_t j = 0; j < TILES_PER_GROUP; ++j)
                sum = vf_add(sum, vf_load(scores + j * KEY_TILE));
            s->running_sum[r] = s->running_sum[r] * correction + vf_reduce_add(sum);
            s->running_max[r] = new_max;
            s->correction[r] = correction;
        }

        /* Weighted values: VALUE_ROWS rows x 32 dims at a time, over the group's keys (never
         * past key_end: 0 x a cache's NaN is NaN). */
        for (int64_t r = 0; r < padded_rows; r += VALUE_ROWS)
            for (int64_t d = 0; d < head_dim; d += VALUE_VECTORS * VF_LANES) {
                vf acc[VALUE_ROWS][VALUE_VECTORS];
                for (int i = 0; i < VALUE_ROWS; ++i) {
                    const vf c = vf_set1(s->correction[r + i]);
                    for (int v = 0; v < VALUE_VECTORS; ++v)
                        acc[i][v] =
                            vf_mul(vf_load(s->acc + (r + i) * head_dim + d + v * VF_LANES), c);
                }
                for (int64_t key = 0; key < num_keys; ++key) {
                    const float *values = v_cache + s->value_offset[key] + d;
                    vf value[VALUE_VECTORS];
                    for (int v = 0; v < VALUE_VECTORS; ++v)
                        value[v] = vf_load(values + v * VF_LANES);
                    for (int i = 0; i < VALUE_ROWS; ++i) {
                        const vf p = vf_set1(s->scores[(r + i) * KEY_GROUP + key]);
                        for (int v = 0; v < VALUE_VECTORS; ++v)
                            acc[i][v] = vf_fmadd(p, value[v], acc[i][v]);
                    }
                }
                for (int i = 0; i < VALUE_ROWS; ++i)
                    for (int v = 0; v < VALUE_VECTORS; ++v)
                        vf_store(s->acc + (r + i) * head_dim + d + v * VF_LANES, acc[i][v]);
            }
    }

    for (int64_t r = 0; r < num_rows; ++r) {
        const int64_t token = first_token + r / group, head = kv_head * group + r % group;
        const vf inverse = vf_set1(1.0f / s->running_sum[r]);
        const float *acc = s->acc + r * head_dim;
        float *dst = (out_f32 ? out_f32 : out) + token * out_stride + head * head_dim;
        for (int64_t d = 0; d < head_dim; d += VF_LANES)
            vf_store(dst + d, vf_mul(vf_load(acc + d), inverse));
        if (out_f32)
            lse[token * num_kv_heads * group + head] = s->running_max[r] + logf(s->running_sum[r]);
    }
}
#endif

#if PREFILL_BUILT
typedef void (*attend_item_fn)(const act_t *, int64_t, const act_t *, const act_t *,
                               const int32_t *, const int32_t *, int64_t, int64_t, int64_t,
                               int64_t, int64_t, int64_t, int64_t, float, act_t *, float *,
                               float *, int64_t, Scratch *);

#define ATTEND_ITEM_INSTANCE(NAME, HEAD_DIM)                                                    \
    static void NAME(const act_t *q, int64_t q_stride, const act_t *k, const act_t *v, \
                     const int32_t *table, const int32_t *positions, int64_t first,             \
                     int64_t count, int64_t kv_head, int64_t num_kv_heads, int64_t group,        \
                     int64_t head_dim, int64_t block_size, float scale, act_t *out,           \
                     float *out_f32, float *lse, int64_t out_stride, Scratch *s) {              \
        (void)head_dim;                                                                         \
        attend_item(q, q_stride, k, v, table, positions, first, count, kv_head, num_kv_heads,   \
                    group, HEAD_DIM, block_size, scale, out, out_f32, lse, out_stride, s);      \
    }
ATTEND_ITEM_INSTANCE(attend_item_64, 64)
ATTEND_ITEM_INSTANCE(attend_item_128, 128)

static void attend_item_generic(const act_t *q, int64_t q_stride, const act_t *k,
                                const act_t *v, const int32_t *table, const int32_t *positions,
                                int64_t first, int64_t count, int64_t kv_head, int64_t num_kv_heads,
                                int64_t group, int64_t head_dim, int64_t block_size, float scale,
                                act_t *out, float *out_f32, float *lse, int64_t out_stride,
                                Scratch *s) {
    attend_item(q, q_stride, k, v, table, positions, first, count, kv_head, num_kv_heads, group,
                head_dim, block_size, scale, out, out_f32, lse, out_stride, s);
}

/* The work items of one call, over the OpenMP threads: bf16 rows into `out`, or float32 rows
 * and their log-sum-exp into `out_f32` / `lse`. */
static int attend_items(const act_t *q, int64_t q_stride, const act_t *k_cache,
                        const act_t *v_cache, const int32_t *block_table,
                        const int32_t *positions, int64_t num_tokens, int64_t num_kv_heads,
                        int64_t group, int64_t head_dim, int64_t block_size, float scale,
                        int64_t tokens_per_item, act_t *out, float *out_f32, float *lse,
                        int64_t out_stride, int num_threads) {
    if (num_tokens < 1 || group < 1 || head_dim < 32 || head_dim % 32 || head_dim > MAX_HEAD_DIM ||
        block_size < 1 || tokens_per_item < 1)
        return -1;
    const attend_item_fn attend = head_dim == 64    ? attend_item_64
                                  : head_dim == 128 ? attend_item_128
                                                    : attend_item_generic;
    const int64_t num_runs = (num_tokens + tokens_per_item - 1) / tokens_per_item;
    const int64_t num_items = num_runs * num_kv_heads;
    const int64_t max_rows = round_up(tokens_per_item * group, ROW_PAD);
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        Scratch scratch;
        const int has_scratch = scratch_alloc(&scratch, max_rows, head_dim) == 0;
        /* The last runs attend the most keys: they go first, the short ones fill in. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            if (!has_scratch) { /* every thread takes part in the loop (OpenMP's rule) */
                failed = 1;
                continue;
            }
            const int64_t run = num_runs - 1 - item / num_kv_heads;
            const int64_t first = run * tokens_per_item;
            const int64_t count =
                num_tokens - first < tokens_per_item ? num_tokens - first : tokens_per_item;
            attend(q, q_stride, k_cache, v_cache, block_table, positions, first, count,
                   item % num_kv_heads, num_kv_heads, group, head_dim, block_size, scale, out,
                   out_f32, lse, out_stride, &scratch);
        }
        if (has_scratch) free(scratch.block);
    }
    return failed ? -2 : 0;
}
#endif

/*
 * q:           [num_tokens, num_kv_heads * group, head_dim] bf16, token t at q + t * q_stride
 * k/v_cache:   [num_blocks, num_kv_heads, block_size, head_dim] bf16, the chunk's own keys and
 *              values already written
 * block_table: the sequence's blocks, covering positions [0, positions[num_tokens - 1]]
 * positions:   [num_tokens] int32, ascending: each query attends the keys at positions up to
 *              its own
 * out:         like q, token t at out + t * out_stride
 * tokens_per_item: query tokens per work item
 * Returns 0; -1 when the build or a size is not served (nothing written); -2 when out of memory.
 */
int paged_prefill_attention(const act_t *q, int64_t q_stride, const act_t *k_cache,
                            const act_t *v_cache, const int32_t *block_table,
                            const int32_t *positions, int64_t num_tokens, int64_t num_kv_heads,
                            int64_t group, int64_t head_dim, int64_t block_size, float scale,
                            int64_t tokens_per_item, act_t *out, int64_t out_stride,
                            int num_threads) {
#if PREFILL_BUILT
    return attend_items(q, q_stride, k_cache, v_cache, block_table, positions, num_tokens,
                        num_kv_heads, group, head_dim, block_size, scale, tokens_per_item, out,
                        NULL, NULL, out_stride, num_threads);
#else
    (void)q, (void)q_stride, (void)k_cache, (void)v_cache, (void)block_table, (void)positions,
        (void)num_tokens, (void)num_kv_heads, (void)group, (void)head_dim, (void)block_size,
        (void)scale, (void)tokens_per_item, (void)out, (void)out_stride, (void)num_threads;
    return -1;
#endif
}

/*
 * A shared prefix attended once for many decodes (cascade): every query row of q [num_seqs,
 * num_kv_heads * group, head_dim] bf16 (token t at q + t * q_stride) attends all
 * `num_shared_tokens` positions of `shared_block_table`, unmasked. Writes float32 rows
 * out [num_seqs, num_kv_heads * group, head_dim] (contiguous) and the log-sum-exp of each row's
 * scaled scores lse [num_seqs, num_kv_heads * group], for merging with each decode's own part.
 * Returns as paged_prefill_attention.
 */
int paged_shared_prefix_attention(const act_t *q, int64_t q_stride, const act_t *k_cache,
                                  const act_t *v_cache, const int32_t *shared_block_table,
                                  int64_t num_shared_tokens, int64_t num_seqs,
                                  int64_t num_kv_heads, int64_t group, int64_t head_dim,
                                  int64_t block_size, float scale, float *out, float *lse,
                                  int num_threads) {
#if PREFILL_BUILT
    if (num_shared_tokens < 1 || num_seqs < 1) return -1;
    int32_t *positions = malloc(sizeof(int32_t) * (size_t)num_seqs);
    if (!positions) return -2;
    for (int64_t t = 0; t < num_seqs; ++t) positions[t] = (int32_t)(num_shared_tokens - 1);
    const int status = attend_items(q, q_stride, k_cache, v_cache, shared_block_table, positions,
                                    num_seqs, num_kv_heads, group, head_dim, block_size, scale,
                                    SHARED_PREFIX_SEQS_PER_ITEM, NULL, out, lse,
                                    num_kv_heads * group * head_dim, num_threads);
    free(positions);
    return status;
#else
    (void)q, (void)q_stride, (void)k_cache, (void)v_cache, (void)shared_block_table,
        (void)num_shared_tokens, (void)num_seqs, (void)num_kv_heads, (void)group, (void)head_dim,
        (void)block_size, (void)scale, (void)out, (void)lse, (void)num_threads;
    return -1;
#endif
}

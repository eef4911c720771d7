/*
 * Rotary position embedding of q and k, and the KV-cache write, in one pass (x86-64, AVX-512
 * BF16). In PyTorch this is a dozen small ops a layer (slices, a concatenation, products, the
 * copies that make k and v contiguous, two index_copy_) whose dispatch costs more than the work
 * at one token per sequence.
 *
 * Numerics follow transformers' apply_rotary_pos_emb in bf16 op by op: q*cos and
 * rotate_half(q)*sin are each rounded to bf16, then their sum is (nearest even): bitwise equal.
 * `sin` comes with its first half negated (RotaryEmbedding in models/llama.py), so the rotation
 * is x*cos + swap_halves(x)*sin.
 */
#include <immintrin.h>

#include "bf16.h"
#include "kernels.h"
#include <stdint.h>
#include <string.h>

static inline void rotate_head(const uint16_t *x, const uint16_t *cos, const uint16_t *sin,
                               uint16_t *out, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < head_dim; i += 16) {
        const int64_t partner = i < half ? i + half : i - half;
        const __m512 a = round_to_bf16(_mm512_mul_ps(load_bf16x16(x + i), load_bf16x16(cos + i)));
        const __m512 b =
            round_to_bf16(_mm512_mul_ps(load_bf16x16(x + partner), load_bf16x16(sin + i)));
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(a, b)));
    }
}

/*
 * qkv:   [tokens, (num_heads + 2 * num_kv_heads) * head_dim] bf16 rows (q heads, k heads, v heads)
 * cos, sin: [tokens, head_dim] bf16 (sin with its first half negated)
 * write_index: [tokens * num_kv_heads] rows of the caches viewed as [-1, head_dim]
 * q_out: [tokens, num_heads, head_dim]; k_out: [tokens, num_kv_heads, head_dim] (rotated keys)
 * Returns -1 (nothing written) unless head_dim is a multiple of 32.
 */
int rotary_store_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin,
                      uint16_t *k_cache, uint16_t *v_cache, const int64_t *write_index,
                      uint16_t *q_out, uint16_t *k_out, int64_t tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int num_threads) {
    if (head_dim % 32) return -1;
    const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
#pragma omp parallel for num_threads(tokens >= 32 ? num_threads : 1)
    for (int64_t t = 0; t < tokens; ++t) {
        const uint16_t *src = qkv + t * row;
        const uint16_t *c = cos + t * head_dim;
        const uint16_t *s = sin + t * head_dim;
        for (int64_t h = 0; h < num_heads; ++h)
            rotate_head(src + h * head_dim, c, s, q_out + (t * num_heads + h) * head_dim, head_dim);
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            uint16_t *key = k_out + (t * num_kv_heads + h) * head_dim;
            rotate_head(src + (num_heads + h) * head_dim, c, s, key, head_dim);
            const int64_t slot = write_index[t * num_kv_heads + h];
            memcpy(k_cache + slot * head_dim, key, (size_t)head_dim * 2);
            memcpy(v_cache + slot * head_dim, src + (num_heads + num_kv_heads + h) * head_dim,
                   (size_t)head_dim * 2);
        }
    }
    return 0;
}

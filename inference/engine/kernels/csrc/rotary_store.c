/*
 * Rotary position embedding of q and k, and the KV-cache write, in one pass. In PyTorch this is
 * a dozen small ops a layer (slices, a concatenation, products, the copies that make k and v
 * contiguous, two index_copy_) whose dispatch costs more than the work at one token per
 * sequence.
 *
 * Numerics follow transformers' apply_rotary_pos_emb op by op: q*cos and rotate_half(q)*sin are
 * each rounded to the activation type, then their sum is: bitwise equal. `sin` comes with its
 * first half negated (RotaryEmbedding in models/llama.py), so the rotation is
 * x*cos + swap_halves(x)*sin.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

static inline void rotate_head(const act_t *x, const act_t *cos, const act_t *sin, act_t *out,
                               int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < head_dim; i += VF_LANES) {
        const int64_t partner = i < half ? i + half : i - half;
        const vf a = round_act(vf_mul(load_act(x + i), load_act(cos + i)));
        const vf b = round_act(vf_mul(load_act(x + partner), load_act(sin + i)));
        store_act(out + i, vf_add(a, b));
    }
}

/*
 * qkv:   [tokens, (num_heads + 2 * num_kv_heads) * head_dim] rows (q heads, k heads, v heads)
 * cos, sin: [tokens, head_dim] (sin with its first half negated)
 * write_index: [tokens * num_kv_heads] rows of the caches viewed as [-1, head_dim]
 * q_out: [tokens, num_heads, head_dim]; k_out: [tokens, num_kv_heads, head_dim] (rotated keys)
 * Returns -1 (nothing written) unless head_dim is a multiple of 32.
 */
int rotary_store(const act_t *qkv, const act_t *cos, const act_t *sin, act_t *k_cache,
                 act_t *v_cache, const int64_t *write_index, act_t *q_out, act_t *k_out,
                 int64_t tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int num_threads) {
    if (head_dim % (2 * VF_LANES)) return -1;
    const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
#pragma omp parallel for num_threads(tokens >= 32 ? num_threads : 1)
    for (int64_t t = 0; t < tokens; ++t) {
        const act_t *src = qkv + t * row;
        const act_t *c = cos + t * head_dim;
        const act_t *s = sin + t * head_dim;
        for (int64_t h = 0; h < num_heads; ++h)
            rotate_head(src + h * head_dim, c, s, q_out + (t * num_heads + h) * head_dim, head_dim);
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            act_t *key = k_out + (t * num_kv_heads + h) * head_dim;
            rotate_head(src + (num_heads + h) * head_dim, c, s, key, head_dim);
            const int64_t slot = write_index[t * num_kv_heads + h];
            memcpy(k_cache + slot * head_dim, key, sizeof(act_t) * (size_t)head_dim);
            memcpy(v_cache + slot * head_dim, src + (num_heads + num_kv_heads + h) * head_dim,
                   sizeof(act_t) * (size_t)head_dim);
        }
    }
    return 0;
}

/*
 * Every decoder layer of a decode step in one native call (bf16 Llama-family models on CPU).
 *
 * A decode step runs ~10 kernels per layer (norm, projections, rotation + cache write,
 * attention, activation). Called one at a time from Python, each costs its arithmetic plus a
 * dispatch through the interpreter and PyTorch, and the weights streamed between two calls
 * have evicted the interpreter's own data from the caches: measured on SmolLM2-135M int4 at
 * 1,300 tokens of context, ~14 ms of layers a step of which the kernels themselves took ~6.
 * Here the same kernels (linked from their own sources: rms_norm.c, int4_linear.c, ...) run in
 * sequence from C, with scratch buffers allocated once per step.
 *
 * Linked with linear_bf16.c (AMX, -DCACHET_WITH_LINEAR_BF16_AMX) where the CPU has AMX; without
 * it, only models whose linear layers are all int4 (int4_linear.c, AVX-512 VNNI) run here.
 *
 * Each layer computes exactly what models/llama.py's DecoderLayer does on the native path:
 *   hidden, residual = norm1(x, residual)   (layer 0: hidden = norm1(x), residual = x)
 *   qkv = qkv_proj(hidden); q, k rotated, k and v written to the paged cache
 *   attn = paged decode attention (float32, rounded to bf16); x = o_proj(attn)
 *   hidden, residual = norm2(x, residual); x = down_proj(silu(gate) * up)
 * The caller applies the final norm to (x, residual).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

enum { LINEAR_BF16_AMX = 0, LINEAR_INT4 = 1 };

/* Keep in step with decode_layers.py (ctypes Structures). */
typedef struct {
    int64_t kind;
    int64_t out_features, padded_out_features, in_features, group_size;
    const void *weight;           /* AMX-packed bf16, or int4 codes */
    const uint16_t *scales;       /* int4 only: bf16 [groups][padded_out_features] */
    const uint8_t *zero_points;   /* int4 only: uint8 [groups][padded_out_features] */
    const uint16_t *bias;         /* bf16 [out_features], or NULL */
} linear_desc;

typedef struct {
    const uint16_t *input_norm, *post_norm;
    linear_desc qkv, o, gate_up, down;
    uint16_t *k_cache, *v_cache;
} layer_desc;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
} model_desc;

static void to_bf16(const float *src, uint16_t *dst, int64_t count) {
    for (int64_t i = 0; i < count; i += 16) store_bf16x16(dst + i, _mm512_loadu_ps(src + i));
}

static int linear(const linear_desc *layer, const uint16_t *x, uint16_t *out, int64_t m,
                  int num_threads) {
    if (layer->kind == LINEAR_BF16_AMX)
#ifdef CACHET_WITH_LINEAR_BF16_AMX
        return linear_bf16_amx(x, layer->weight, layer->bias, out, m, layer->out_features,
                               layer->in_features, num_threads);
#else
        return -2; /* built without AMX: decode_layers.py describes no AMX layer then */
#endif
    const int status = int4_linear_vnni(x, layer->weight, layer->scales, layer->zero_points, out, m,
                                        layer->out_features, layer->padded_out_features,
                                        layer->in_features, layer->group_size, num_threads);
    if (status || !layer->bias) return status;
    for (int64_t row = 0; row < m; ++row) /* y + b in bf16, as y.add_(bias) */
        for (int64_t i = 0; i < layer->out_features; i += 16) {
            uint16_t *y = out + row * layer->out_features + i;
            store_bf16x16(y, _mm512_add_ps(load_bf16x16(y), load_bf16x16(layer->bias + i)));
        }
    return 0;
}

/*
 * x:            [m, hidden] bf16: the embeddings in, the last layer's MLP output out
 * residual:     [m, hidden] bf16, written: the residual stream before that output is added
 * cos, sin:     [m, head_dim] bf16 (RotaryEmbedding); write_index: [m * num_kv_heads] int64
 * block_tables: [m, table_stride] int32; context_lens: [m] int32 (this token included)
 * tokens_per_part, num_parts: the attention's context partitions (paged_decode_attention.py)
 * Returns 0, or the first failing kernel's status (negative), or -100 without memory.
 */
int decode_layers_bf16(const model_desc *model, const layer_desc *layers, uint16_t *x,
                       uint16_t *residual, const uint16_t *cos, const uint16_t *sin,
                       const int64_t *write_index, const int32_t *block_tables,
                       int64_t table_stride, const int32_t *context_lens, int64_t m,
                       int64_t tokens_per_part, int64_t num_parts, int num_threads) {
    const int64_t hidden = model->hidden, head_dim = model->head_dim;
    const int64_t q_size = model->num_heads * head_dim, kv_size = model->num_kv_heads * head_dim;
    const int64_t group = model->num_heads / model->num_kv_heads;
    const int64_t qkv_size = q_size + 2 * kv_size;
    if (hidden % 16 || model->intermediate % 16 || q_size % 16) return -1;
    uint16_t *normed = malloc(sizeof(uint16_t) * m * hidden);
    uint16_t *qkv = malloc(sizeof(uint16_t) * m * qkv_size);
    uint16_t *q = malloc(sizeof(uint16_t) * m * q_size);
    uint16_t *k = malloc(sizeof(uint16_t) * m * kv_size);
    float *attention = malloc(sizeof(float) * m * q_size);
    uint16_t *attention_bf16 = malloc(sizeof(uint16_t) * m * q_size);
    uint16_t *gate_up = malloc(sizeof(uint16_t) * m * 2 * model->intermediate);
    uint16_t *activation = malloc(sizeof(uint16_t) * m * model->intermediate);
    float *scratch =
        malloc(sizeof(float) * m * model->num_kv_heads * num_parts * group * (head_dim + 2));
    int status = -100;
    if (!normed || !qkv || !q || !k || !attention || !attention_bf16 || !gate_up ||
        !activation || !scratch)
        goto done;
    memcpy(residual, x, sizeof(uint16_t) * m * hidden);
    for (int64_t l = 0; l < model->num_layers; ++l) {
        const layer_desc *layer = layers + l;
        /* layer 0: residual = x, so norm(x) without the add */
        status = add_rms_norm_bf16(l ? x : residual, l ? residual : NULL, layer->input_norm,
                                   normed, m, hidden, model->eps, num_threads);
        if (status) goto done;
        if ((status = linear(&layer->qkv, normed, qkv, m, num_threads))) goto done;
        status = rotary_store_bf16(qkv, cos, sin, layer->k_cache, layer->v_cache, write_index, q,
                                   k, m, model->num_heads, model->num_kv_heads, head_dim,
                                   num_threads);
        if (status) goto done;
        status = paged_decode_attention_bf16(
            q, layer->k_cache, layer->v_cache, block_tables, table_stride, context_lens, m,
            model->num_kv_heads, group, head_dim, model->block_size, model->scale,
            tokens_per_part, num_parts, attention, NULL, scratch, num_threads);
        if (status) goto done;
        to_bf16(attention, attention_bf16, m * q_size);
        if ((status = linear(&layer->o, attention_bf16, x, m, num_threads))) goto done;
        status = add_rms_norm_bf16(x, residual, layer->post_norm, normed, m, hidden, model->eps,
                                   num_threads);
        if (status) goto done;
        if ((status = linear(&layer->gate_up, normed, gate_up, m, num_threads))) goto done;
        status = silu_and_mul_bf16(gate_up, activation, m, model->intermediate, num_threads);
        if (status) goto done;
        if ((status = linear(&layer->down, activation, x, m, num_threads))) goto done;
    }
    status = 0;
done:
    free(normed), free(qkv), free(q), free(k), free(attention), free(attention_bf16);
    free(gate_up), free(activation), free(scratch);
    return status;
}

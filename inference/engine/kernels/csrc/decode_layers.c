/*
 * Every decoder layer of a decode step in one native call (Llama-family models on CPU, bf16 or
 * float32 activations: `act_t`).
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
 * it, only models whose linear layers are all int4 or int8 (int4_linear.c, int8_linear.c) run
 * here.
 *
 * Each layer computes exactly what models/llama.py's DecoderLayer does on the native path:
 *   hidden, residual = norm1(x, residual)   (layer 0: hidden = norm1(x), residual = x)
 *   qkv = qkv_proj(hidden); q, k rotated, k and v written to the paged cache
 *   attn = paged decode attention (float32, rounded to act_t); x = o_proj(attn)
 *   hidden, residual = norm2(x, residual); x = down_proj(silu(gate) * up)
 * The caller applies the final norm to (x, residual).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

enum { LINEAR_BF16_AMX = 0, LINEAR_INT4 = 1, LINEAR_INT8 = 2 };

/* Keep in step with decode_layers.py (ctypes Structures). */
typedef struct {
    int64_t kind;
    int64_t out_features, padded_out_features, in_features, group_size;
    const void *weight;           /* AMX-packed bf16, int4 or int8 codes */
    const void *scales;           /* int4: bf16 [groups][padded_out]; int8: act_t [padded_out] */
    const uint8_t *zero_points;   /* int4 only: uint8 [groups][padded_out_features] */
    const act_t *bias;            /* [out_features], or NULL */
} linear_desc;

typedef struct {
    const act_t *input_norm, *post_norm;
    linear_desc qkv, o, gate_up, down;
    act_t *k_cache, *v_cache;
} layer_desc;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
} model_desc;

static void to_act(const float *src, act_t *dst, int64_t count) {
    for (int64_t i = 0; i < count; i += VF_LANES) store_act(dst + i, vf_load(src + i));
}

static int linear(const linear_desc *layer, const act_t *x, act_t *out, int64_t m,
                  int num_threads) {
    if (layer->kind == LINEAR_BF16_AMX)
#if defined(CACHET_WITH_LINEAR_BF16_AMX) && !defined(CACHET_ACTIVATION_FLOAT32)
        return linear_bf16_amx(x, layer->weight, layer->bias, out, m, layer->out_features,
                               layer->in_features, num_threads);
#else
        return -2; /* built without AMX: decode_layers.py describes no AMX layer then */
#endif
    const int status =
        layer->kind == LINEAR_INT8
            ? int8_linear(x, layer->weight, layer->scales, out, m, layer->out_features,
                          layer->padded_out_features, layer->in_features, num_threads)
            : int4_linear(x, layer->weight, layer->scales, layer->zero_points, out, m,
                          layer->out_features, layer->padded_out_features, layer->in_features,
                          layer->group_size, num_threads);
    if (status || !layer->bias) return status;
    if (layer->out_features % VF_LANES) return -1; /* decode_layers.py describes none such */
    for (int64_t row = 0; row < m; ++row) /* y + b rounded, as y.add_(bias) */
        for (int64_t i = 0; i < layer->out_features; i += VF_LANES) {
            act_t *y = out + row * layer->out_features + i;
            store_act(y, vf_add(load_act(y), load_act(layer->bias + i)));
        }
    return 0;
}

/* out = the softmax-weighted merge of two attentions over disjoint keys, each normalised over
 * its own: out [rows, head_dim] and lse [rows] hold the first (and receive the result), other /
 * other_lse the second. */
static void merge_attention(float *out, const float *lse, const float *other,
                            const float *other_lse, int64_t rows, int64_t head_dim) {
    for (int64_t r = 0; r < rows; ++r) {
        const float top = lse[r] > other_lse[r] ? lse[r] : other_lse[r];
        const float w = expf(lse[r] - top), w_other = expf(other_lse[r] - top);
        const float inverse = 1.0f / (w + w_other);
        float *o = out + r * head_dim;
        const float *p = other + r * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = (o[d] * w + p[d] * w_other) * inverse;
    }
}

/*
 * x:            [m, hidden]: the embeddings in, the last layer's MLP output out
 * residual:     [m, hidden], written: the residual stream before that output is added
 * cos, sin:     [m, head_dim] (RotaryEmbedding); write_index: [m * num_kv_heads] int64
 * block_tables: [m, table_stride] int32; context_lens: [m] int32 (this token included)
 * shared_block_table, num_shared_tokens: with num_shared_tokens > 0 (cascade; AVX-512 BF16
 *   builds only), every decode's context starts with these full blocks, attended once for all
 *   decodes (paged_shared_prefix_attention) and merged by log-sum-exp with each decode's own
 *   part, which block_tables / context_lens then describe; else NULL and 0
 * tokens_per_part, num_parts: the attention's context partitions (paged_decode_attention.py)
 * Returns 0, or the first failing kernel's status (negative), or -100 without memory.
 */
int decode_layers(const model_desc *model, const layer_desc *layers, act_t *x, act_t *residual,
                  const act_t *cos, const act_t *sin, const int64_t *write_index,
                  const int32_t *block_tables, int64_t table_stride, const int32_t *context_lens,
                  const int32_t *shared_block_table, int64_t num_shared_tokens, int64_t m,
                  int64_t tokens_per_part, int64_t num_parts, int num_threads) {
    const int64_t hidden = model->hidden, head_dim = model->head_dim;
    const int64_t q_size = model->num_heads * head_dim, kv_size = model->num_kv_heads * head_dim;
    const int64_t group = model->num_heads / model->num_kv_heads;
    const int64_t qkv_size = q_size + 2 * kv_size;
    if (hidden % VF_LANES || model->intermediate % VF_LANES || q_size % VF_LANES) return -1;
    act_t *normed = malloc(sizeof(act_t) * m * hidden);
    act_t *qkv = malloc(sizeof(act_t) * m * qkv_size);
    act_t *q = malloc(sizeof(act_t) * m * q_size);
    act_t *k = malloc(sizeof(act_t) * m * kv_size);
    float *attention = malloc(sizeof(float) * m * q_size);
    act_t *attention_act = malloc(sizeof(act_t) * m * q_size);
    act_t *gate_up = malloc(sizeof(act_t) * m * 2 * model->intermediate);
    act_t *activation = malloc(sizeof(act_t) * m * model->intermediate);
    float *scratch =
        malloc(sizeof(float) * m * model->num_kv_heads * num_parts * group * (head_dim + 2));
    /* cascade: the shared prefix's output and both parts' log-sum-exp */
    const int64_t num_rows = m * model->num_heads;
    float *shared = num_shared_tokens ? malloc(sizeof(float) * m * q_size) : NULL;
    float *lse = num_shared_tokens ? malloc(sizeof(float) * 2 * num_rows) : NULL;
    int status = -100;
    if (!normed || !qkv || !q || !k || !attention || !attention_act || !gate_up ||
        !activation || !scratch || (num_shared_tokens && (!shared || !lse)))
        goto done;
    memcpy(residual, x, sizeof(act_t) * m * hidden);
    for (int64_t l = 0; l < model->num_layers; ++l) {
        const layer_desc *layer = layers + l;
        /* layer 0: residual = x, so norm(x) without the add */
        status = add_rms_norm(l ? x : residual, l ? residual : NULL, layer->input_norm,
                                   normed, m, hidden, model->eps, num_threads);
        if (status) goto done;
        if ((status = linear(&layer->qkv, normed, qkv, m, num_threads))) goto done;
        status = rotary_store(qkv, cos, sin, layer->k_cache, layer->v_cache, write_index, q,
                                   k, m, model->num_heads, model->num_kv_heads, head_dim,
                                   num_threads);
        if (status) goto done;
        status = paged_decode_attention(
            q, layer->k_cache, layer->v_cache, block_tables, table_stride, context_lens, m,
            model->num_kv_heads, group, head_dim, model->block_size, model->scale,
            tokens_per_part, num_parts, attention, lse, scratch, num_threads);
        if (status) goto done;
        if (num_shared_tokens) {
            status = paged_shared_prefix_attention(
                q, q_size, layer->k_cache, layer->v_cache, shared_block_table, num_shared_tokens,
                m, model->num_kv_heads, group, head_dim, model->block_size, model->scale, shared,
                lse + num_rows, num_threads);
            if (status) goto done;
            merge_attention(attention, lse, shared, lse + num_rows, num_rows, head_dim);
        }
        to_act(attention, attention_act, m * q_size);
        if ((status = linear(&layer->o, attention_act, x, m, num_threads))) goto done;
        status = add_rms_norm(x, residual, layer->post_norm, normed, m, hidden, model->eps,
                                   num_threads);
        if (status) goto done;
        if ((status = linear(&layer->gate_up, normed, gate_up, m, num_threads))) goto done;
        status = silu_and_mul(gate_up, activation, m, model->intermediate, num_threads);
        if (status) goto done;
        if ((status = linear(&layer->down, activation, x, m, num_threads))) goto done;
    }
    status = 0;
done:
    free(normed), free(qkv), free(q), free(k), free(attention), free(attention_act);
    free(gate_up), free(activation), free(scratch), free(shared), free(lse);
    return status;
}

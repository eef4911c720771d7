/*
 * The kernels' exported functions (what kernels/__init__.py loads and decode_layers.c calls).
 * Each source includes this header, so a signature that drifts fails to compile. `act_t` is the
 * activation type the library is built for (simd.h: bf16 bits, or float32).
 */
#ifndef CACHET_KERNELS_H
#define CACHET_KERNELS_H

#include <stdint.h>

#include "simd.h"

int add_rms_norm(const act_t *x, act_t *residual, const act_t *weight, act_t *out, int64_t rows,
                 int64_t hidden, float eps, int num_threads);
int rotary_store(const act_t *qkv, const act_t *cos, const act_t *sin, act_t *k_cache,
                 act_t *v_cache, const int64_t *write_index, act_t *q_out, act_t *k_out,
                 int64_t tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int num_threads);
int paged_decode_attention(const act_t *q, const act_t *k_cache, const act_t *v_cache,
                           const int32_t *block_tables, int64_t table_stride,
                           const int32_t *context_lens, int64_t num_seqs, int64_t num_kv_heads,
                           int64_t group, int64_t head_dim, int64_t block_size, float scale,
                           int64_t tokens_per_part, int64_t num_parts, float *out, float *lse,
                           float *scratch, int num_threads);
int paged_prefill_attention_is_built(void);
int paged_prefill_attention(const act_t *q, int64_t q_stride, const act_t *k_cache,
                            const act_t *v_cache, const int32_t *block_table,
                            const int32_t *positions, int64_t num_tokens, int64_t num_kv_heads,
                            int64_t group, int64_t head_dim, int64_t block_size, float scale,
                            int64_t tokens_per_item, act_t *out, int64_t out_stride,
                            int num_threads);
int paged_shared_prefix_attention(const act_t *q, int64_t q_stride, const act_t *k_cache,
                                  const act_t *v_cache, const int32_t *shared_block_table,
                                  int64_t num_shared_tokens, int64_t num_seqs,
                                  int64_t num_kv_heads, int64_t group, int64_t head_dim,
                                  int64_t block_size, float scale, float *out, float *lse,
                                  int num_threads);
int int4_linear(const act_t *x, const uint8_t *codes, const uint16_t *scales,
                const uint8_t *zero_points, act_t *out, int64_t m, int64_t n, int64_t padded_n,
                int64_t k, int64_t group_size, int num_threads);
int int4_dequantize(const uint8_t *codes, const uint16_t *scales, const uint8_t *zero_points,
                    act_t *out, int64_t row0, int64_t num_rows, int64_t padded_n, int64_t k,
                    int64_t group_size, int num_threads);
int int8_linear(const act_t *x, const int8_t *codes, const act_t *scales, act_t *out, int64_t m,
                int64_t n, int64_t padded_n, int64_t k, int num_threads);
int int8_dequantize(const int8_t *codes, const act_t *scales, act_t *out, int64_t row0,
                    int64_t num_rows, int64_t padded_n, int64_t k, int num_threads);
int silu_and_mul(const act_t *gate_up, act_t *out, int64_t rows, int64_t width, int num_threads);

/* bf16 only, with AMX (linear_bf16.c) */
int amx_request_permission(void);
void pack_bf16_vnni(const uint16_t *weight, uint16_t *packed, int64_t n, int64_t k);
int linear_bf16_amx(const uint16_t *x, const uint16_t *packed, const uint16_t *bias,
                    uint16_t *out, int64_t m, int64_t n, int64_t k, int num_threads);

#endif

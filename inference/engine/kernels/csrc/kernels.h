/*
 * The kernels' exported functions (what kernels/__init__.py loads and decode_layers.c calls).
 * Each source includes this header, so a signature that drifts fails to compile.
 */
#ifndef CACHET_KERNELS_H
#define CACHET_KERNELS_H

#include <stdint.h>

int add_rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *weight, uint16_t *out,
                      int64_t rows, int64_t hidden, float eps, int num_threads);
int rotary_store_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin,
                      uint16_t *k_cache, uint16_t *v_cache, const int64_t *write_index,
                      uint16_t *q_out, uint16_t *k_out, int64_t tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, int num_threads);
int paged_decode_attention_bf16(const uint16_t *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, const int32_t *block_tables,
                                int64_t table_stride, const int32_t *context_lens,
                                int64_t num_seqs, int64_t num_kv_heads, int64_t group,
                                int64_t head_dim, int64_t block_size, float scale,
                                int64_t tokens_per_part, int64_t num_parts, float *out,
                                float *lse, float *scratch, int num_threads);
int amx_request_permission(void);
void pack_bf16_vnni(const uint16_t *weight, uint16_t *packed, int64_t n, int64_t k);
int linear_bf16_amx(const uint16_t *x, const uint16_t *packed, const uint16_t *bias,
                    uint16_t *out, int64_t m, int64_t n, int64_t k, int num_threads);
int int4_linear_vnni(const uint16_t *x, const uint8_t *codes, const uint16_t *scales,
                     const uint8_t *zero_points, uint16_t *out, int64_t m, int64_t n, int64_t padded_n, int64_t k,
                     int64_t group_size, int num_threads);
int silu_and_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t width,
                      int num_threads);

#endif

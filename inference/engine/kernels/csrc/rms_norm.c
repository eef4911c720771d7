/*
 * RMSNorm of bf16 rows, optionally after adding the residual stream (x86-64, AVX-512 BF16).
 *
 * In a decode step the norm runs on one token per sequence: transformers' op-by-op version
 * (float32 cast, square, mean, add eps, rsqrt, multiply, cast back, scale) is ~10 PyTorch ops
 * of a few microseconds each, run 61 times a step for a 30-layer model. One call does it all.
 *
 * Numerics follow transformers' LlamaRMSNorm in bf16 step by step: the residual sum is rounded
 * to bf16 (it is the bf16 residual stream); the mean of squares and the normalisation are float32;
 * the normalised row is rounded to bf16 before it is multiplied by the bf16 weight, and the
 * product rounded again (round to nearest even, as PyTorch casts). Only the order of the float32
 * sum of squares may differ from PyTorch's.
 */
#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

/*
 * x, out: [rows, hidden] bf16; residual: [rows, hidden] bf16 or NULL; weight: [hidden] bf16.
 * With a residual: residual <- bf16(x + residual), then out <- norm(residual).
 * Without: out <- norm(x). hidden must be a multiple of 16 (returns -1 otherwise).
 * out may alias x.
 */
int add_rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *weight, uint16_t *out,
                      int64_t rows, int64_t hidden, float eps, int num_threads) {
    if (hidden % 16) return -1;
#pragma omp parallel for num_threads(rows >= 64 ? num_threads : 1)
    for (int64_t row = 0; row < rows; ++row) {
        const uint16_t *src = x + row * hidden;
        uint16_t *res = residual ? residual + row * hidden : 0;
        uint16_t *dst = out + row * hidden;
        __m512 sum_sq = _mm512_setzero_ps();
        for (int64_t i = 0; i < hidden; i += 16) {
            __m512 v = load_bf16x16(src + i);
            if (res) {
                v = round_to_bf16(_mm512_add_ps(v, load_bf16x16(res + i)));
                store_bf16x16(res + i, v);
            }
            sum_sq = _mm512_fmadd_ps(v, v, sum_sq);
        }
        const float variance = _mm512_reduce_add_ps(sum_sq) / (float)hidden;
        const __m512 inv_rms = _mm512_set1_ps(1.0f / __builtin_sqrtf(variance + eps));
        const uint16_t *normed_src = res ? res : src;
        for (int64_t i = 0; i < hidden; i += 16) {
            __m512 normed = round_to_bf16(_mm512_mul_ps(load_bf16x16(normed_src + i), inv_rms));
            store_bf16x16(dst + i, _mm512_mul_ps(normed, load_bf16x16(weight + i)));
        }
    }
    return 0;
}

/*
 * RMSNorm of activation rows, optionally after adding the residual stream.
 *
 * In a decode step the norm runs on one token per sequence: transformers' op-by-op version
 * (float32 cast, square, mean, add eps, rsqrt, multiply, cast back, scale) is ~10 PyTorch ops
 * of a few microseconds each, run 61 times a step for a 30-layer model. One call does it all.
 *
 * Numerics follow transformers' LlamaRMSNorm step by step: the residual sum is rounded to the
 * activation type (it is the residual stream); the mean of squares and the normalisation are
 * float32; the normalised row is rounded to the activation type before it is multiplied by the
 * weight, and the product rounded again (bf16: to nearest even, as PyTorch casts). Only the
 * order of the float32 sum of squares may differ from PyTorch's.
 */
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

/*
 * x, out: [rows, hidden]; residual: [rows, hidden] or NULL; weight: [hidden].
 * With a residual: residual <- round(x + residual), then out <- norm(residual).
 * Without: out <- norm(x). hidden must be a multiple of 16 (returns -1 otherwise).
 * out may alias x.
 */
int add_rms_norm(const act_t *x, act_t *residual, const act_t *weight, act_t *out, int64_t rows,
                 int64_t hidden, float eps, int num_threads) {
    if (hidden % VF_LANES) return -1;
#pragma omp parallel for num_threads(rows >= 64 ? num_threads : 1)
    for (int64_t row = 0; row < rows; ++row) {
        const act_t *src = x + row * hidden;
        act_t *res = residual ? residual + row * hidden : 0;
        act_t *dst = out + row * hidden;
        vf sum_sq = vf_zero();
        for (int64_t i = 0; i < hidden; i += VF_LANES) {
            vf v = load_act(src + i);
            if (res) {
                v = round_act(vf_add(v, load_act(res + i)));
                store_act(res + i, v);
            }
            sum_sq = vf_fmadd(v, v, sum_sq);
        }
        const float variance = vf_reduce_add(sum_sq) / (float)hidden;
        const vf inv_rms = vf_set1(1.0f / __builtin_sqrtf(variance + eps));
        const act_t *normed_src = res ? res : src;
        for (int64_t i = 0; i < hidden; i += VF_LANES) {
            const vf normed = round_act(vf_mul(load_act(normed_src + i), inv_rms));
            store_act(dst + i, vf_mul(normed, load_act(weight + i)));
        }
    }
    return 0;
}

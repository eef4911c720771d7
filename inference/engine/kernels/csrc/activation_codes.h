/*
 * Activations as int8 codes for the integer matmuls (int4_linear.c, int8_linear.c): per token and
 * block of 32 columns, two codes per value and their two scales, and the block's float sum.
 * Header-only (static): each kernel library is compiled on its own.
 */
#ifndef CACHET_ACTIVATION_CODES_H
#define CACHET_ACTIVATION_CODES_H

#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

#define BLOCK 32 /* activation columns per int8 block */

/*
 * One token's activations -> per block of 32 columns, two int8 codes per value and their two
 * scales, x ~ scale_hi * code_hi + scale_lo * code_lo (the second quantizes the first's
 * rounding error), and the exact sum of the block. Why two: one int8 code per value loses the
 * small values of a block that holds one of the model's outlier activations (measured on
 * SmolLM2-135M: perplexity +1.6% instead of +0.4%, half as many greedy answers identical to the
 * dequantized path's); with the second the error is ~absmax / 64,000, below bf16's own rounding
 * for all but the smallest values, for two more dot products per 64 bytes of weights.
 */
static inline void quantize_activations(const act_t *x, int64_t k, int8_t *codes, float *scales,
                                 float *sums) {
    for (int64_t block = 0; block < k / BLOCK; ++block) {
        vf rest[2] = {load_act(x + block * BLOCK), load_act(x + block * BLOCK + 16)};
        sums[block] = vf_reduce_add(vf_add(rest[0], rest[1]));
        for (int level = 0; level < 2; ++level) {
            const float absmax = vf_reduce_max(vf_max(vf_abs(rest[0]), vf_abs(rest[1])));
            const float scale = absmax / 127.0f;
            const vf inverse = vf_set1(absmax > 0.0f ? 127.0f / absmax : 0.0f);
            int8_t *level_codes = codes + level * k + block * BLOCK;
            for (int half = 0; half < 2; ++half) {
                /* rounds to nearest even; |x| / scale <= 127, so the bytes never saturate */
                const vi code = vf_to_vi(vf_mul(rest[half], inverse));
                vi_store_i8(level_codes + half * 16, code);
                rest[half] = vf_fnmadd(vi_to_vf(code), vf_set1(scale), rest[half]);
            }
            scales[2 * block + level] = scale;
        }
    }
}

/* Scratch for m tokens of k columns: their codes, scales and sums (activation_codes_free). */
typedef struct {
    int8_t *codes;  /* [m][2][k] */
    float *scales;  /* [m][k / BLOCK][2] */
    float *sums;    /* [m][k / BLOCK] */
} activation_codes;

/* Quantizes x [m, k] (k a multiple of BLOCK), tokens spread over `num_threads`; returns 0, or
 * -2 without memory. */
static inline int activation_codes_make(const act_t *x, int64_t m, int64_t k, int num_threads,
                                        activation_codes *out) {
    const int64_t blocks = k / BLOCK;
    out->codes = malloc((size_t)(2 * m * k));
    out->scales = malloc(sizeof(float) * (size_t)(2 * m * blocks));
    out->sums = malloc(sizeof(float) * (size_t)(m * blocks));
    if (!out->codes || !out->scales || !out->sums) {
        free(out->codes), free(out->scales), free(out->sums);
        return -2;
    }
    /* NOTE: a prefill step's thousands of tokens would otherwise quantize on one core */
#pragma omp parallel for schedule(static) num_threads(num_threads) if (m > 1)
    for (int64_t t = 0; t < m; ++t)
        quantize_activations(x + t * k, k, out->codes + 2 * t * k, out->scales + 2 * t * blocks,
                             out->sums + t * blocks);
    return 0;
}

static inline void activation_codes_free(activation_codes *codes) {
    free(codes->codes), free(codes->scales), free(codes->sums);
}

#endif

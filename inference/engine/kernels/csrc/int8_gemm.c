/*
 * The integer GEMM's work around torch._int_mm (layers/int8_gemm.py), one pass each:
 * - int8_gemm_code_tokens: activations x [m, k] -> int8 codes [m, k] and one float32 scale per
 *   token, the columns marked in `skip` (the step's outlier columns, multiplied in float
 *   instead) coded 0 and left out of the scale: scale = max(max |x|, tiny) / 127 over the kept
 *   columns, code = x / scale rounded to nearest even;
 * - int8_gemm_scale_sums: the int32 sums [m, n] -> y [m, n] of act_t, y = sum * token scale *
 *   row scale, rounded once to act_t.
 * The same float32 operations in the same order as int8_gemm.py's PyTorch path, so the same
 * values bit for bit. Why: done with PyTorch ops these took ~6 and 3 passes over the step's
 * activations and sums, ~35% of the GEMM's own time at 512 tokens on the 1.5B's down_proj
 * (Zen 4).
 */
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define TINY_FLOAT 1.17549435e-38f /* torch.finfo(torch.float32).tiny */

/* x [m, k] (k a multiple of 16), skip [k] (nonzero: a column left out) -> codes [m, k],
 * scales [m]. Returns 0, or -1 for a k the kernel does not take. */
int int8_gemm_code_tokens(const act_t *x, const uint8_t *skip, int8_t *codes, float *scales,
                          int64_t m, int64_t k, int num_threads) {
    if (k % VF_LANES) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (m > 1)
    for (int64_t t = 0; t < m; ++t) {
        const act_t *row = x + t * k;
        vf peak = vf_zero();
        for (int64_t c = 0; c < k; c += VF_LANES) {
            const vf keep = vf_sub(vf_set1(1.0f), vf_load_u8(skip + c)); /* skip is 0 or 1 */
            peak = vf_max(peak, vf_mul(vf_abs(load_act(row + c)), keep));
        }
        const float largest = vf_reduce_max(peak);
        const float scale = (largest > TINY_FLOAT ? largest : TINY_FLOAT) / 127.0f;
        scales[t] = scale;
        const vf divisor = vf_set1(scale);
        for (int64_t c = 0; c < k; c += VF_LANES) {
            const vf keep = vf_sub(vf_set1(1.0f), vf_load_u8(skip + c));
            /* |x| <= largest over the kept columns: no saturation */
            vi_store_i8(codes + t * k + c, vf_to_vi(vf_div(vf_mul(load_act(row + c), keep),
                                                          divisor)));
        }
    }
    return 0;
}

/* sums [m, n] int32 (n a multiple of 16), token_scales [m], row_scales [n] -> out [m, n].
 * Returns 0, or -1 for an n the kernel does not take. */
int int8_gemm_scale_sums(const int32_t *sums, const float *token_scales,
                         const float *row_scales, act_t *out, int64_t m, int64_t n,
                         int num_threads) {
    if (n % VF_LANES) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (m > 1)
    for (int64_t t = 0; t < m; ++t) {
        const vf token_scale = vf_set1(token_scales[t]);
        for (int64_t r = 0; r < n; r += VF_LANES) {
            vi sum;
            memcpy(&sum, sums + t * n + r, sizeof sum);
            store_act(out + t * n + r,
                      vf_mul(vf_mul(vi_to_vf(sum), token_scale), vf_load(row_scales + r)));
        }
    }
    return 0;
}

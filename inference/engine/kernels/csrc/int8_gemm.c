/*
 * The integer GEMM's work around torch._int_mm (layers/int8_gemm.py), one pass each:
 * - int8_gemm_code_tokens: activations x [m, k] -> int8 codes [m, k] and one float32 scale per
 *   token, the columns marked in `skip` (the step's outlier columns, multiplied in float
 *   instead) coded 0 and left out of the scale: scale = max(max |x|, tiny) / 127 over the kept
 *   columns, code = x / scale rounded to nearest even;
 * - int8_gemm_scale_sums: the int32 sums [m, n] -> y [m, n] of act_t, y = sum * token scale *
 *   row scale, rounded once to act_t.
 * - int8_gemm_column_peaks: each column's largest |x| over the step's tokens, which picks the
 *   outlier columns (PyTorch's abs and amax took two passes and a copy: 2.1 ms for the 1.5B's
 *   down_proj at 512 tokens on an AMX Xeon);
 * - int8_gemm_finish_rows: for oneDNN's packed GEMM, whose result comes already times the row
 *   scales (one scale per tensor of activations is all it takes): y * token scale plus the
 *   outlier columns' float product, in one pass over y (PyTorch's mul_ and a GEMM of a few
 *   columns each took a pass, the GEMM 0.2 ms for the 1.5B's gate_up at 32 tokens on an AMX
 *   Xeon, more than the multiply-adds need).
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

/* Columns of y per task: a decode step's few rows still spread over both threads. */
#define FINISH_COLUMNS 256
/* Rows of y finished together: each outlier code converted once serves them all. */
#define FINISH_ROWS 4

/* y [m, n] (n a multiple of 16) -> out [m, n] (may be y): out = y * token_scales[t] + row_scales
 * * sum over j of outlier_x[t, j] * codes_t[outlier_ids[j], :], with codes_t [k, n] the weight's
 * int8 codes, one row per input column, and outlier_x [m, num_outliers] float32. Returns 0, or
 * -1 for an n the kernel does not take. */
int int8_gemm_finish_rows(const act_t *y, const float *token_scales, const float *outlier_x,
                          const int64_t *outlier_ids, int64_t num_outliers, const int8_t *codes_t,
                          const float *row_scales, act_t *out, int64_t m, int64_t n,
                          int num_threads) {
    if (n % VF_LANES) return -1;
    const int64_t num_chunks = (n + FINISH_COLUMNS - 1) / FINISH_COLUMNS;
    const int64_t num_row_blocks = (m + FINISH_ROWS - 1) / FINISH_ROWS;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads) if (m * n > 4096)
    for (int64_t block = 0; block < num_row_blocks; ++block) {
        for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
            const int64_t first = block * FINISH_ROWS;
            const int64_t rows = m - first < FINISH_ROWS ? m - first : FINISH_ROWS;
            const float *xs = outlier_x + first * num_outliers;
            const int64_t end = (chunk + 1) * FINISH_COLUMNS < n ? (chunk + 1) * FINISH_COLUMNS : n;
            for (int64_t c = chunk * FINISH_COLUMNS; c < end; c += VF_LANES) {
                vf sums[FINISH_ROWS];
                for (int r = 0; r < FINISH_ROWS; ++r) sums[r] = vf_zero();
                for (int64_t j = 0; j < num_outliers; ++j) {
                    const vf codes = vf_load_i8(codes_t + outlier_ids[j] * n + c);
                    for (int r = 0; r < rows; ++r) {
                        sums[r] = vf_fmadd(vf_set1(xs[r * num_outliers + j]), codes, sums[r]);
                    }
                }
                const vf scales = vf_load(row_scales + c);
                for (int r = 0; r < rows; ++r) {
                    const int64_t at = (first + r) * n + c;
                    const vf scaled = vf_mul(load_act(y + at), vf_set1(token_scales[first + r]));
                    store_act(out + at, vf_fmadd(sums[r], scales, scaled));
                }
            }
        }
    }
    return 0;
}

/* Columns of x per task for the column peaks. */
#define PEAK_COLUMNS 256

/* x [m, k] (k a multiple of 16) -> peaks [k] float32: max over the rows of |x|. Returns 0, or
 * -1 for a k the kernel does not take. */
int int8_gemm_column_peaks(const act_t *x, float *peaks, int64_t m, int64_t k, int num_threads) {
    if (k % VF_LANES) return -1;
    const int64_t num_chunks = (k + PEAK_COLUMNS - 1) / PEAK_COLUMNS;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k > 4096)
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
        const int64_t begin = chunk * PEAK_COLUMNS;
        const int64_t end = begin + PEAK_COLUMNS < k ? begin + PEAK_COLUMNS : k;
        vf chunk_peaks[PEAK_COLUMNS / VF_LANES];
        for (int64_t v = 0; v < (end - begin) / VF_LANES; ++v) chunk_peaks[v] = vf_zero();
        for (int64_t t = 0; t < m; ++t) {
            const act_t *row = x + t * k + begin;
            for (int64_t v = 0; v < (end - begin) / VF_LANES; ++v) {
                chunk_peaks[v] = vf_max(chunk_peaks[v], vf_abs(load_act(row + v * VF_LANES)));
            }
        }
        for (int64_t v = 0; v < (end - begin) / VF_LANES; ++v) {
            vf_store(peaks + begin + v * VF_LANES, chunk_peaks[v]);
        }
    }
    return 0;
}

/*
 * The integer GEMM's work around torch._int_mm (layers/int8_gemm.py), one pass each:
 * - int8_gemm_code_tokens: activations x [m, k] -> int8 codes [m, k] and one float32 scale per
 *   token, the columns marked in `skip` (the step's outlier columns, multiplied in float
 *   instead) coded 0 and left out of the scale: scale = max(max |x|, tiny) / 127 over the kept
 *   columns, code = x / scale rounded to nearest even;
 * - int8_gemm_scale_sums: the int32 sums [m, n] -> y [m, n] of act_t, y = sum * token scale *
 *   row scale, rounded once to act_t.
 * - int8_gemm_code_tokens_outliers: the step's whole preparation in one call: each column's
 *   peak |x| (PyTorch's abs and amax took two passes and a copy, 2.1 ms for the 1.5B's
 *   down_proj at 512 tokens on an AMX Xeon), the outlier columns picked from them as
 *   layers/int8_gemm.py picks them, the tokens coded without them and the outlier columns
 *   gathered in float32 (a dozen PyTorch ops and native calls took ~60 us a layer at 32
 *   tokens whatever its size, more than SmolLM2's GEMMs);
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
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define TINY_FLOAT 1.17549435e-38f /* torch.finfo(torch.float32).tiny */

/* int8_gemm_code_tokens, each code's sign bit flipped where `unsigned_codes`: the code plus
 * 128 as a uint8, the form oneDNN's int8 GEMM multiplies natively with VNNI (vpdpbusd takes
 * unsigned by signed bytes; signed activations took it ~1,000x slower, a reference path). */
static void code_tokens(const act_t *x, const uint8_t *skip, int8_t *codes, float *scales,
                        int64_t m, int64_t k, int unsigned_codes, int num_threads) {
    const int8_t flip = unsigned_codes ? (int8_t)0x80 : 0;
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
        if (flip) {  /* the row is in L1 still; the compiler vectorizes this */
            for (int64_t c = 0; c < k; ++c) codes[t * k + c] ^= flip;
        }
    }
}

/* x [m, k] (k a multiple of 16), skip [k] (nonzero: a column left out) -> codes [m, k],
 * scales [m]. Returns 0, or -1 for a k the kernel does not take. */
int int8_gemm_code_tokens(const act_t *x, const uint8_t *skip, int8_t *codes, float *scales,
                          int64_t m, int64_t k, int num_threads) {
    if (k % VF_LANES) return -1;
    code_tokens(x, skip, codes, scales, m, k, 0, num_threads);
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

/* x [m, k] (k a multiple of 16, the caller's check) -> peaks [k] float32: max over the rows of
 * |x|. */
static void column_peaks(const act_t *x, float *peaks, int64_t m, int64_t k, int num_threads) {
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
}

/* A float32 value in the activation type and back (bf16: rounded to nearest even), as PyTorch
 * rounds a product of a bf16 tensor and a Python float. */
static float rounded_to_act(float value) {
    float lanes[VF_LANES];
    vf_store(lanes, round_act(vf_set1(value)));
    return lanes[0];
}

/* One activation as float32 (bf16: its bits are a float32's upper half). */
static float act_to_float(act_t value) {
#ifdef CACHET_ACTIVATION_FLOAT32
    return value;
#else
    const uint32_t bits = (uint32_t)value << 16;
    float converted;
    memcpy(&converted, &bits, sizeof converted);
    return converted;
#endif
}

/* The element that would be at `rank` of values[0..n) sorted ascending (values reordered). */
static float select_rank(float *values, int64_t n, int64_t rank) {
    int64_t low = 0, high = n - 1;
    while (low < high) {
        const float pivot = values[low + (high - low) / 2];
        int64_t i = low, j = high;
        while (i <= j) {
            while (values[i] < pivot) ++i;
            while (values[j] > pivot) --j;
            if (i <= j) {
                const float swap = values[i];
                values[i++] = values[j];
                values[j--] = swap;
            }
        }
        if (rank <= j) {
            high = j;
        } else if (rank >= i) {
            low = i;
        } else {
            return values[rank];
        }
    }
    return values[rank];
}

typedef struct {
    float peak;
    int64_t column;
} column_peak;

/* The larger peak first; the lower column among equal ones. */
static int larger_peak_first(const void *a, const void *b) {
    const column_peak *x = a, *y = b;
    if (x->peak != y->peak) return x->peak > y->peak ? -1 : 1;
    return (x->column > y->column) - (x->column < y->column);
}

static int ascending_columns(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* x [m, k] (k a multiple of 16) -> codes [m, k], token_scales [m], the outlier columns
 * outlier_ids [n] (ascending; n <= max_outliers) and outlier_x [m, n] float32 (x's values
 * there, rows of n): a column is an outlier when its peak |x| passes ratio times the median
 * column's peak (the lower middle one, that product rounded to the activation type); past
 * max_outliers the largest peaks are kept. The other columns are coded as int8_gemm_code_tokens
 * codes them, the outliers coded 0; `unsigned_codes`: each code plus 128, as uint8. Returns n,
 * or -1 for a k the kernel does not take, -2 where memory ran out. */
int64_t int8_gemm_code_tokens_outliers(const act_t *x, int64_t m, int64_t k, float ratio,
                                       int64_t max_outliers, int8_t *codes,
                                       float *token_scales, int64_t *outlier_ids,
                                       float *outlier_x, int unsigned_codes, int num_threads) {
    if (k % VF_LANES) return -1;
    float *peaks = malloc(sizeof(float) * (size_t)k);
    float *ordered = malloc(sizeof(float) * (size_t)k);
    column_peak *candidates = malloc(sizeof(column_peak) * (size_t)k);
    uint8_t *skip = calloc((size_t)k, 1);
    if (!peaks || !ordered || !candidates || !skip) {
        free(peaks), free(ordered), free(candidates), free(skip);
        return -2;
    }
    column_peaks(x, peaks, m, k, num_threads);
    memcpy(ordered, peaks, sizeof(float) * (size_t)k);
    const float threshold = rounded_to_act(ratio * select_rank(ordered, k, (k - 1) / 2));
    int64_t num_candidates = 0;
    for (int64_t c = 0; c < k; ++c) {
        if (peaks[c] > threshold) candidates[num_candidates++] = (column_peak){peaks[c], c};
    }
    if (num_candidates > max_outliers) {
        qsort(candidates, (size_t)num_candidates, sizeof(column_peak), larger_peak_first);
        num_candidates = max_outliers;
    }
    for (int64_t j = 0; j < num_candidates; ++j) outlier_ids[j] = candidates[j].column;
    qsort(outlier_ids, (size_t)num_candidates, sizeof(int64_t), ascending_columns);
    for (int64_t j = 0; j < num_candidates; ++j) skip[outlier_ids[j]] = 1;
    code_tokens(x, skip, codes, token_scales, m, k, unsigned_codes, num_threads);
    for (int64_t t = 0; t < m; ++t) {
        for (int64_t j = 0; j < num_candidates; ++j) {
            outlier_x[t * num_candidates + j] = act_to_float(x[t * k + outlier_ids[j]]);
        }
    }
    free(peaks), free(ordered), free(candidates), free(skip);
    return num_candidates;
}

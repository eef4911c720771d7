/*
 * A quantized weight's rows as int8 codes with one float32 scale per row, for the integer GEMM
 * of prefill-sized steps (layers/int8_gemm.py), made from the int4 or int8 kernel's layout when
 * a step needs them (int4_int8_codes, int8_int8_codes) instead of kept beside it.
 *
 * For each row: w its float32 values as the format's dequantize computes them before rounding
 * to the activation type, scale = max(max |w|, MIN_ROW_PEAK) / 127, code = w (1 / scale) rounded
 * to nearest even: the values of Int8GemmWeight.from_rows on the float32 rows, bit for bit. Out:
 * codes W^T [k][num_rows] (the GEMM reads either layout as fast; this one is the tiles' order)
 * and scales [num_rows].
 *
 * Why not keep them: the codes take a byte a weight (1.44 GiB beside the 1.5B's ~1 GB of
 * quantized weights), and making them reads the packed weight twice and writes a byte a
 * weight, a few percent of the GEMM they serve on a step of hundreds of tokens.
 *
 * Header-only (static): each kernel library is compiled on its own.
 */
#ifndef CACHET_INT8_ROW_CODES_H
#define CACHET_INT8_ROW_CODES_H

#include <stdint.h>
#include <string.h>

#include "simd.h"

#define ROW_CODES_TILE 64 /* rows a thread codes at a time: 4 vectors of 16, a cache line */
#define ROW_CODES_BLOCK 32 /* columns a format's function dequantizes at a time */
/* a row of zeros gets this peak, so its scale's reciprocal stays finite (int8_gemm.py) */
#define MIN_ROW_PEAK 1e-30f

/* float32 values of 16 rows (from `row`, a multiple of 16) at columns [column, column + 32)
 * of a weight, into w[32]; each format passes its own, which the compiler inlines. */
typedef void (*weight_block_fn)(const void *weight, int64_t row, int64_t column, vf *w);

static inline __attribute__((always_inline)) int int8_row_codes(
    const void *weight, weight_block_fn block_of, int8_t *codes_t, float *row_scales,
    int64_t row0, int64_t num_rows, int64_t padded_n, int64_t k, int num_threads) {
    if (row0 < 0 || row0 % ROW_CODES_TILE || num_rows < 0 || row0 + num_rows > padded_n ||
        k % ROW_CODES_BLOCK)
        return -1;
    const int64_t num_tiles = (num_rows + ROW_CODES_TILE - 1) / ROW_CODES_TILE;
    enum { VECTORS = ROW_CODES_TILE / VF_LANES };
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
        const int64_t out_row = tile * ROW_CODES_TILE; /* of the num_rows written */
        const int64_t rows = num_rows - out_row < ROW_CODES_TILE ? num_rows - out_row
                                                                 : ROW_CODES_TILE;
        vf w[ROW_CODES_BLOCK];
        vf inverse[VECTORS];
        float scales[ROW_CODES_TILE];
        for (int v = 0; v < VECTORS; ++v) {
            vf peak = vf_zero();
            for (int64_t column = 0; column < k; column += ROW_CODES_BLOCK) {
                block_of(weight, row0 + out_row + 16 * v, column, w);
                for (int c = 0; c < ROW_CODES_BLOCK; ++c) peak = vf_max(peak, vf_abs(w[c]));
            }
            const vf scale = vf_div(vf_max(peak, vf_set1(MIN_ROW_PEAK)), vf_set1(127.0f));
            vf_store(scales + 16 * v, scale);
            /* NOTE: codes are w times the scale's reciprocal, as Int8GemmWeight.from_rows */
            inverse[v] = vf_div(vf_set1(1.0f), scale);
        }
        memcpy(row_scales + out_row, scales, sizeof(float) * rows);
        for (int64_t column = 0; column < k; column += ROW_CODES_BLOCK) {
            int8_t lines[ROW_CODES_BLOCK][ROW_CODES_TILE];
            for (int v = 0; v < VECTORS; ++v) {
                block_of(weight, row0 + out_row + 16 * v, column, w);
                /* |w| <= peak, so |w / scale| <= 127 (to rounding): no saturation */
                for (int c = 0; c < ROW_CODES_BLOCK; ++c)
                    vi_store_i8(lines[c] + 16 * v, vf_to_vi(vf_mul(w[c], inverse[v])));
            }
            for (int c = 0; c < ROW_CODES_BLOCK; ++c)
                memcpy(codes_t + (column + c) * num_rows + out_row, lines[c], rows);
        }
    }
    return 0;
}

#endif

/*
 * y = x W^T for activations x (bf16 or float32) and group-wise int4 weights, with integer dot
 * products (AVX-512 VNNI's vpdpbusd, or their exact equivalents on other levels: simd.h).
 *
 * Weights: codes q in [0, 15] with, per group of `group_size` input columns and output row, a
 * bf16 scale s and a uint8 zero point z in sixteenths of s: w = s (q - z / 16) (the format of
 * int4_linear.py). The codes are packed by tiles of 64 output rows as [K/8][64][4]
 * bytes: the 4 bytes of row r at step j hold columns 8j..8j+3 in their low nibbles and
 * 8j+4..8j+7 in their high nibbles, so one 64-byte load gives 16 rows x 8 columns, ready for
 * vi_dot4_add (AVX2 takes it as two 32-byte halves of 8 rows, NEON as four of 4). Scales and zero points are [K/group_size][N] arrays.
 *
 * Activations are quantized per token to int8 in blocks of 32 columns (absmax scales, as
 * llama.cpp's Q8 blocks, plus a second code for the rounding error: see quantize_activations),
 * so the inner loop is u8 x s8 -> int32 dot products and float work happens once per
 * 32 columns:
 *   y_r = sum_blocks s_r (x_scale_hi dot(q_r, x_hi) + x_scale_lo dot(q_r, x_lo))
 *       - sum_groups s_r z_r / 16 sum(x)
 * where sum(x) is the float sum of the activations of the group.
 *
 * Why: a decode step streams every weight once, and PyTorch's int4 kernel reads ~11 GB/s here
 * against ~27 GB/s that two cores can read. Tiles are handed out dynamically to the OpenMP
 * threads (as linear_bf16.c) so a core busy elsewhere does not stall the layer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "activation_codes.h"
#include "int8_row_codes.h"
#include "kernels.h"
#include "simd.h"

#define TILE_ROWS 64  /* output rows per tile (4 vectors of 16) */
#define ROW_VECTORS 4
#define STEP 8        /* columns per 64-byte load of a row vector */
#if 2 * BLOCK / STEP > VN_MAX_ADDS
#error "a block's nibble dot products overflow vn's int16 sums"
#endif

/* One tile of 64 output rows for one token; `out_rows` rows are written (the last tile of a
 * padded matrix writes fewer). `x_codes` holds the token's two code rows of k bytes each. */
static inline void tile_matmul(const uint8_t *tile_codes, const uint16_t *scales,
                               const uint8_t *zero_points, int64_t padded_n, int64_t k,
                               int64_t group_size, const int8_t *x_codes, const float *x_scales,
                               const float *x_sums, act_t *out, int64_t out_rows) {
    const vf minus_sixteenth = vf_set1(-1.0f / 16.0f);
    const int64_t blocks_per_group = group_size / BLOCK;
    vf y[ROW_VECTORS];
    for (int v = 0; v < ROW_VECTORS; ++v) y[v] = vf_zero();
    float group_sum = 0.0f;
    for (int64_t block = 0; block < k / BLOCK; ++block) {
        /* NOTE: BLOCK / STEP steps of a low and a high nibble: VN_MAX_ADDS products */
        vn dots[2][ROW_VECTORS];
        for (int level = 0; level < 2; ++level)
            for (int v = 0; v < ROW_VECTORS; ++v) dots[level][v] = vn_zero();
        for (int step = 0; step < BLOCK / STEP; ++step) {
            const int64_t column = block * BLOCK + step * STEP;
            const uint8_t *codes = tile_codes + column * TILE_ROWS / 2;
            vb x_low[2], x_high[2];
            for (int level = 0; level < 2; ++level) {
                int32_t quads[2]; /* NOTE: memcpy, not a cast: int8 codes read as int32 */
                memcpy(quads, x_codes + level * k + column, sizeof quads);
                x_low[level] = vb_set1_i32(quads[0]);
                x_high[level] = vb_set1_i32(quads[1]);
            }
            for (int v = 0; v < ROW_VECTORS; ++v) {
                const vb packed = vb_load(codes + 64 * v);
                const vb low = vb_low_nibbles(packed);
                const vb high = vb_high_nibbles(packed);
                for (int level = 0; level < 2; ++level) {
                    dots[level][v] = vn_dot4_add(dots[level][v], low, x_low[level]);
                    dots[level][v] = vn_dot4_add(dots[level][v], high, x_high[level]);
                }
            }
        }
        const int64_t group_offset = (block / blocks_per_group) * padded_n;
        const int closes_group = (block + 1) % blocks_per_group == 0;
        const vf x_scale_hi = vf_set1(x_scales[2 * block]);
        const vf x_scale_lo = vf_set1(x_scales[2 * block + 1]);
        group_sum += x_sums[block];
        for (int v = 0; v < ROW_VECTORS; ++v) {
            const vf scale = vf_load_bf16(scales + group_offset + v * 16);
            const vf dot = vf_fmadd(x_scale_hi, vi_to_vf(vn_sum(dots[0][v])),
                                    vf_mul(x_scale_lo, vi_to_vf(vn_sum(dots[1][v]))));
            y[v] = vf_fmadd(scale, dot, y[v]);
            if (closes_group) {
                const vf zero = vf_load_u8(zero_points + group_offset + v * 16);
                /* -s z / 16: the weight of code 0, which every column of the group adds */
                const vf offset = vf_mul(vf_mul(scale, zero), minus_sixteenth);
                y[v] = vf_fmadd(offset, vf_set1(group_sum), y[v]);
            }
        }
        if (closes_group) group_sum = 0.0f;
    }
    for (int v = 0; v < ROW_VECTORS; ++v) {
        const int64_t rows = out_rows - v * 16;
        if (rows <= 0) break;
        store_act_n(out + v * 16, y[v], rows);
    }
}

/*
 * x [m, k], codes [padded_n / 64][k / 8][64][4], scales [k / group_size][padded_n] bf16,
 * zero_points [k / group_size][padded_n] uint8 -> out [m, n] (n <= padded_n). Returns 0, or -1
 * for shapes the kernel does not take (k or group_size not a multiple of 32, group_size not
 * dividing k, padded_n not a multiple of 64) and -2 when scratch memory cannot be allocated.
 */
int int4_linear(const act_t *x, const uint8_t *codes, const uint16_t *scales,
                const uint8_t *zero_points, act_t *out, int64_t m, int64_t n, int64_t padded_n,
                int64_t k, int64_t group_size, int num_threads) {
    if (k % BLOCK || group_size % BLOCK || k % group_size || padded_n % TILE_ROWS || n > padded_n)
        return -1;
    const int64_t blocks_per_token = k / BLOCK;
    activation_codes x_codes;
    if (activation_codes_make(x, m, k, num_threads, &x_codes)) return -2;
    const int64_t num_tiles = padded_n / TILE_ROWS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
        const int64_t row0 = tile * TILE_ROWS;
        const int64_t out_rows = n - row0 < TILE_ROWS ? n - row0 : TILE_ROWS;
        if (out_rows <= 0) continue;
        /* NOTE: one token at a time: the tile (k * 32 bytes) stays in L1/L2 between tokens.
         * Sharing each unpacked block among 4 tokens (as int8_linear.c does) was measured
         * slower (Zen 4, the two builds interleaved on the 1.5B's shapes: 1.4-1.5x at 8-128
         * tokens, 1.15x at one): each token's broadcast codes then repeat for every row vector
         * instead of every step, which costs more than the unpacking it saves. */
        for (int64_t t = 0; t < m; ++t)
            tile_matmul(codes + tile * TILE_ROWS * k / 2, scales + row0, zero_points + row0,
                        padded_n, k, group_size, x_codes.codes + 2 * t * k,
                        x_codes.scales + 2 * t * blocks_per_token,
                        x_codes.sums + t * blocks_per_token, out + t * n + row0, out_rows);
    }
    activation_codes_free(&x_codes);
    return 0;
}

/*
 * Rows [row0, row0 + num_rows) of the weight (row0 a multiple of 64), dequantized as
 * Int4Linear._dequantize_native does, w = (q - z / 16) s in float32 rounded once to act_t (the
 * same values bit for bit), into out [k][num_rows]: transposed, so that each 64-byte load of a
 * tile (16 rows x 8 columns) gives 8 columns of 16 consecutive rows, stored as 8 vectors.
 * For steps too large for the kernel above (compute-bound at ~2x the GEMM's time), which then
 * run PyTorch's GEMM on the result: unpacking with PyTorch ops cost as much as the GEMM itself.
 * Returns 0, or -1 for shapes int4_linear refuses too or rows outside the weight.
 */
int int4_dequantize(const uint8_t *codes, const uint16_t *scales, const uint8_t *zero_points,
                    act_t *out, int64_t row0, int64_t num_rows, int64_t padded_n, int64_t k,
                    int64_t group_size, int num_threads) {
    if (k % BLOCK || group_size % BLOCK || k % group_size || row0 < 0 || row0 % TILE_ROWS ||
        num_rows < 0 || row0 + num_rows > padded_n)
        return -1;
    const int64_t first_tile = row0 / TILE_ROWS;
    const int64_t num_tiles = (num_rows + TILE_ROWS - 1) / TILE_ROWS;
    const vf sixteenth = vf_set1(1.0f / 16.0f);
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
        for (int64_t group = 0; group < k / group_size; ++group) {
            const int64_t tile_row = (first_tile + tile) * TILE_ROWS;
            const uint8_t *tile_codes = codes + tile_row * k / 2;
            for (int v = 0; v < ROW_VECTORS; ++v) {
                const int64_t out_row = tile * TILE_ROWS + v * 16; /* of out's num_rows */
                if (out_row >= num_rows) break;
                const int64_t rows = num_rows - out_row < 16 ? num_rows - out_row : 16;
                const int64_t meta = group * padded_n + tile_row + v * 16;
                const vf scale = vf_load_bf16(scales + meta);
                const vf offset = vf_mul(vf_load_u8(zero_points + meta), sixteenth);
                for (int64_t step = group * group_size / STEP;
                     step < (group + 1) * group_size / STEP; ++step) {
                    const vb packed = vb_load(tile_codes + step * STEP * TILE_ROWS / 2 + 64 * v);
                    const vb nibbles[2] = {vb_low_nibbles(packed), vb_high_nibbles(packed)};
                    for (int half = 0; half < 2; ++half)
                        for (int byte = 0; byte < 4; ++byte) {
                            /* NOTE: (q - z/16) is exact in float32; one rounding, at s */
                            const vf w = vf_mul(
                                vf_sub(vb_lane_byte_to_vf(nibbles[half], byte), offset), scale);
                            const int64_t column = step * STEP + half * 4 + byte;
                            store_act_n(out + column * num_rows + out_row, w, rows);
                        }
                }
            }
        }
    }
    return 0;
}

typedef struct {
    const uint8_t *codes;
    const uint16_t *scales;
    const uint8_t *zero_points;
    int64_t padded_n, k, group_size;
} int4_weight;

/* w = (q - z / 16) s of 16 rows at 32 columns, in float32 (int4_dequantize's values before
 * their rounding to act_t) */
static inline void int4_block(const void *weight, int64_t row, int64_t column, vf *w) {
    const int4_weight *weight_of = weight;
    const int64_t k = weight_of->k, tile_row = row - row % TILE_ROWS;
    const int64_t v = (row % TILE_ROWS) / 16;
    const int64_t meta = (column / weight_of->group_size) * weight_of->padded_n + row;
    const vf scale = vf_load_bf16(weight_of->scales + meta);
    const vf offset = vf_mul(vf_load_u8(weight_of->zero_points + meta), vf_set1(1.0f / 16.0f));
    const uint8_t *tile_codes = weight_of->codes + tile_row * k / 2;
    for (int step = 0; step < BLOCK / STEP; ++step) {
        const vb packed = vb_load(tile_codes + (column / STEP + step) * STEP * TILE_ROWS / 2 + 64 * v);
        const vb nibbles[2] = {vb_low_nibbles(packed), vb_high_nibbles(packed)};
        for (int half = 0; half < 2; ++half)
            for (int byte = 0; byte < 4; ++byte)
                w[step * STEP + half * 4 + byte] =
                    vf_mul(vf_sub(vb_lane_byte_to_vf(nibbles[half], byte), offset), scale);
    }
}

/*
 * Rows [row0, row0 + num_rows) of the weight (row0 a multiple of 64) as int8 codes W^T
 * [k][num_rows] and float32 scales [num_rows] (int8_row_codes.h). Returns 0, or -1 for shapes
 * int4_linear refuses too or rows outside the weight.
 */
int int4_int8_codes(const uint8_t *codes, const uint16_t *scales, const uint8_t *zero_points,
                    int8_t *codes_t, float *row_scales, int64_t row0, int64_t num_rows,
                    int64_t padded_n, int64_t k, int64_t group_size, int num_threads) {
    if (k % BLOCK || group_size % BLOCK || k % group_size || padded_n % TILE_ROWS) return -1;
    const int4_weight weight = {codes, scales, zero_points, padded_n, k, group_size};
    return int8_row_codes(&weight, int4_block, codes_t, row_scales, row0, num_rows, padded_n, k,
                          num_threads);
}

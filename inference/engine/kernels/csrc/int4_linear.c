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
#include "kernels.h"
#include "simd.h"

#define TILE_ROWS 64  /* output rows per tile (4 vectors of 16) */
#define ROW_VECTORS 4
#define STEP 8        /* columns per 64-byte load of a row vector */
#define TOKEN_GROUP 4 /* tokens that share a pass over a tile */
#if 2 * BLOCK / STEP > VN_MAX_ADDS
#error "a block's nibble dot products overflow vn's int16 sums"
#endif

/*
 * One tile of 64 output rows for `num_tokens` (<= TOKEN_GROUP) tokens; `out_rows` rows of each
 * token's output row (`n` apart) are written (the last tile of a padded matrix writes fewer).
 * Token t's two code rows of k bytes start at x_codes + 2 t k.
 *
 * The tokens share each unpacked block of codes: unpacking a tile's nibbles cost as much as the
 * dot products of one token, so a step of many tokens would otherwise pay it for each. Every
 * token's result is the one it gets alone (the same sums in the same order), whatever the
 * grouping: batch size never changes an output. always_inline: called with a constant
 * `num_tokens`, the token loops unroll and the accumulators stay in registers.
 */
static inline __attribute__((always_inline)) void tile_matmul(
    const uint8_t *tile_codes, const uint16_t *scales, const uint8_t *zero_points,
    int64_t padded_n, int64_t k, int64_t group_size, const int8_t *x_codes,
    const float *x_scales, const float *x_sums, act_t *out, int64_t n, int64_t out_rows,
    const int num_tokens) {
    const vf minus_sixteenth = vf_set1(-1.0f / 16.0f);
    const int64_t blocks_per_group = group_size / BLOCK;
    const int64_t blocks_per_token = k / BLOCK;
    vf y[TOKEN_GROUP][ROW_VECTORS];
    float group_sums[TOKEN_GROUP];
    for (int t = 0; t < num_tokens; ++t) {
        group_sums[t] = 0.0f;
        for (int v = 0; v < ROW_VECTORS; ++v) y[t][v] = vf_zero();
    }
    for (int64_t block = 0; block < blocks_per_token; ++block) {
        const int64_t group_offset = (block / blocks_per_group) * padded_n;
        const int closes_group = (block + 1) % blocks_per_group == 0;
        for (int t = 0; t < num_tokens; ++t) group_sums[t] += x_sums[t * blocks_per_token + block];
        const uint8_t *block_codes = tile_codes + block * BLOCK * TILE_ROWS / 2;
        for (int v = 0; v < ROW_VECTORS; ++v) {
            vb low[BLOCK / STEP], high[BLOCK / STEP];
            for (int step = 0; step < BLOCK / STEP; ++step) {
                const vb packed = vb_load(block_codes + step * STEP * TILE_ROWS / 2 + 64 * v);
                low[step] = vb_low_nibbles(packed);
                high[step] = vb_high_nibbles(packed);
            }
            const vf scale = vf_load_bf16(scales + group_offset + v * 16);
            /* -s z / 16: the weight of code 0, which every column of the group adds */
            const vf offset = closes_group ? vf_mul(vf_mul(scale, vf_load_u8(zero_points +
                                                    group_offset + v * 16)), minus_sixteenth)
                                           : vf_zero();
            for (int t = 0; t < num_tokens; ++t) {
                const int8_t *token_codes = x_codes + 2 * t * k + block * BLOCK;
                /* NOTE: BLOCK / STEP steps of a low and a high nibble: VN_MAX_ADDS products */
                vn dots[2];
                for (int level = 0; level < 2; ++level) {
                    dots[level] = vn_zero();
                    for (int step = 0; step < BLOCK / STEP; ++step) {
                        int32_t quads[2]; /* NOTE: memcpy, not a cast: int8 codes read as int32 */
                        memcpy(quads, token_codes + level * k + step * STEP, sizeof quads);
                        dots[level] = vn_dot4_add(dots[level], low[step], vb_set1_i32(quads[0]));
                        dots[level] = vn_dot4_add(dots[level], high[step], vb_set1_i32(quads[1]));
                    }
                }
                const float *token_scales = x_scales + 2 * (t * blocks_per_token + block);
                const vf dot = vf_fmadd(vf_set1(token_scales[0]), vi_to_vf(vn_sum(dots[0])),
                                        vf_mul(vf_set1(token_scales[1]), vi_to_vf(vn_sum(dots[1]))));
                y[t][v] = vf_fmadd(scale, dot, y[t][v]);
                if (closes_group) y[t][v] = vf_fmadd(offset, vf_set1(group_sums[t]), y[t][v]);
            }
        }
        if (closes_group)
            for (int t = 0; t < num_tokens; ++t) group_sums[t] = 0.0f;
    }
    for (int t = 0; t < num_tokens; ++t)
        for (int v = 0; v < ROW_VECTORS; ++v) {
            const int64_t rows = out_rows - v * 16;
            if (rows <= 0) break;
            store_act_n(out + t * n + v * 16, y[t][v], rows);
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
        /* NOTE: the tile (k * 32 bytes) stays in L1/L2 while the tokens pass over it. */
        const uint8_t *tile_codes = codes + tile * TILE_ROWS * k / 2;
        int64_t t = 0;
        for (; t + TOKEN_GROUP <= m; t += TOKEN_GROUP)
            tile_matmul(tile_codes, scales + row0, zero_points + row0, padded_n, k, group_size,
                        x_codes.codes + 2 * t * k, x_codes.scales + 2 * t * blocks_per_token,
                        x_codes.sums + t * blocks_per_token, out + t * n + row0, n, out_rows,
                        TOKEN_GROUP);
        for (; t < m; ++t)
            tile_matmul(tile_codes, scales + row0, zero_points + row0, padded_n, k, group_size,
                        x_codes.codes + 2 * t * k, x_codes.scales + 2 * t * blocks_per_token,
                        x_codes.sums + t * blocks_per_token, out + t * n + row0, n, out_rows, 1);
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
 * Returns 0, or -1 for shapes the layout does not have.
 */
int int4_dequantize(const uint8_t *codes, const uint16_t *scales, const uint8_t *zero_points,
                    act_t *out, int64_t row0, int64_t num_rows, int64_t padded_n, int64_t k,
                    int64_t group_size, int num_threads) {
    if (k % STEP || group_size % STEP || row0 % TILE_ROWS || row0 + num_rows > padded_n)
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

/*
 * y = x W^T for activations x (bf16 or float32) and int8 weights with one scale per output row
 * (the format of quantization.Int8Linear: w = s q, q in [-127, 127]), with integer dot products.
 *
 * Weights are packed by tiles of 64 output rows as [K/4][64][4] bytes: the 4 bytes of row r at
 * step j are columns 4j..4j+3, so one 64-byte load holds 16 rows x 4 columns, ready for
 * vi_dot4_add_signed against 4 activation codes broadcast to every row. Scales are [padded N].
 *
 * Activations are quantized per token as for the int4 matmul (activation_codes.h: two int8
 * codes per value in blocks of 32 columns, so the error stays below bf16's rounding), and
 *   y_r = s_r sum_blocks (x_scale_hi dot(q_r, x_hi) + x_scale_lo dot(q_r, x_lo)).
 *
 * Why: GGUF's 5- to 8-bit tensors (Q5_0, Q6_K, Q8_0: a Q4_K_M model's attention values and half
 * its down projections) load as int8, and PyTorch's int8 matmul is not a fast path on CPUs; with
 * it a model that mixes int4 and int8 layers runs every decode step in one native call
 * (decode_layers.c). Tiles go to the OpenMP threads dynamically, as in int4_linear.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "activation_codes.h"
#include "int8_row_codes.h"
#include "kernels.h"
#include "simd.h"

#define TILE_ROWS 64 /* output rows per tile (4 vectors of 16) */
#define ROW_VECTORS 4
#define STEP 4 /* columns per 64-byte load of a row vector */
#define TOKEN_GROUP 4 /* tokens that share a pass over a tile */

/* One tile of 64 output rows for one token; `out_rows` rows are written. Decodes and the tokens
 * a step has beyond its groups of TOKEN_GROUP run this: each step's broadcast codes serve every
 * row vector (tile_matmul_group with one token measured 0.8-0.9x its speed on Zen 4). */
static inline void tile_matmul_one(const int8_t *tile_codes, const act_t *scales, int64_t k,
                                   const int8_t *x_codes, const float *x_scales, act_t *out,
                                   int64_t out_rows) {
    vf y[ROW_VECTORS];
    for (int v = 0; v < ROW_VECTORS; ++v) y[v] = vf_zero();
    for (int64_t block = 0; block < k / BLOCK; ++block) {
        vi dots[2][ROW_VECTORS];
        for (int level = 0; level < 2; ++level)
            for (int v = 0; v < ROW_VECTORS; ++v) dots[level][v] = vi_zero();
        for (int step = 0; step < BLOCK / STEP; ++step) {
            const int64_t column = block * BLOCK + step * STEP;
            const int8_t *codes = tile_codes + column * TILE_ROWS;
            vb x_quad[2];
            for (int level = 0; level < 2; ++level) {
                int32_t quad; /* NOTE: memcpy, not a cast: int8 codes read as int32 */
                memcpy(&quad, x_codes + level * k + column, sizeof quad);
                x_quad[level] = vb_set1_i32(quad);
            }
            for (int v = 0; v < ROW_VECTORS; ++v) {
                const vb weights = vb_load(codes + 64 * v);
                for (int level = 0; level < 2; ++level)
                    dots[level][v] = vi_dot4_add_signed(dots[level][v], weights, x_quad[level]);
            }
        }
        const vf x_scale_hi = vf_set1(x_scales[2 * block]);
        const vf x_scale_lo = vf_set1(x_scales[2 * block + 1]);
        for (int v = 0; v < ROW_VECTORS; ++v)
            y[v] = vf_fmadd(x_scale_hi, vi_to_vf(dots[0][v]),
                            vf_fmadd(x_scale_lo, vi_to_vf(dots[1][v]), y[v]));
    }
    for (int v = 0; v < ROW_VECTORS; ++v) {
        const int64_t rows = out_rows - v * 16;
        if (rows <= 0) break;
        store_act_n(out + v * 16, vf_mul(y[v], load_act(scales + v * 16)), rows);
    }
}

/*
 * One tile of 64 output rows for `num_tokens` (<= TOKEN_GROUP) tokens; `out_rows` rows of each
 * token's output row (`n` apart) are written. Token t's two code rows of k bytes start at
 * x_codes + 2 t k. The tokens share each block's weight loads (Zen 4, both interleaved on the
 * 1.5B's shapes: 1.1-1.2x faster than tile_matmul_one from 8 to 128 tokens), and each token's
 * result is the one it gets alone: the same integer dot products and float operations in the
 * same order.
 */
static inline __attribute__((always_inline)) void tile_matmul_group(
    const int8_t *tile_codes, const act_t *scales, int64_t k, const int8_t *x_codes,
    const float *x_scales, act_t *out, int64_t n, int64_t out_rows, const int num_tokens) {
    const int64_t blocks_per_token = k / BLOCK;
    vf y[TOKEN_GROUP][ROW_VECTORS];
    for (int t = 0; t < num_tokens; ++t)
        for (int v = 0; v < ROW_VECTORS; ++v) y[t][v] = vf_zero();
    for (int64_t block = 0; block < blocks_per_token; ++block) {
        const int8_t *block_codes = tile_codes + block * BLOCK * TILE_ROWS;
        for (int v = 0; v < ROW_VECTORS; ++v) {
            vb weights[BLOCK / STEP];
            for (int step = 0; step < BLOCK / STEP; ++step)
                weights[step] = vb_load(block_codes + step * STEP * TILE_ROWS + 64 * v);
            for (int t = 0; t < num_tokens; ++t) {
                const int8_t *token_codes = x_codes + 2 * t * k + block * BLOCK;
                vi dots[2];
                for (int level = 0; level < 2; ++level) {
                    dots[level] = vi_zero();
                    for (int step = 0; step < BLOCK / STEP; ++step) {
                        int32_t quad; /* NOTE: memcpy, not a cast: int8 codes read as int32 */
                        memcpy(&quad, token_codes + level * k + step * STEP, sizeof quad);
                        dots[level] =
                            vi_dot4_add_signed(dots[level], weights[step], vb_set1_i32(quad));
                    }
                }
                const float *token_scales = x_scales + 2 * (t * blocks_per_token + block);
                y[t][v] = vf_fmadd(vf_set1(token_scales[0]), vi_to_vf(dots[0]),
                                   vf_fmadd(vf_set1(token_scales[1]), vi_to_vf(dots[1]), y[t][v]));
            }
        }
    }
    for (int t = 0; t < num_tokens; ++t)
        for (int v = 0; v < ROW_VECTORS; ++v) {
            const int64_t rows = out_rows - v * 16;
            if (rows <= 0) break;
            store_act_n(out + t * n + v * 16, vf_mul(y[t][v], load_act(scales + v * 16)), rows);
        }
}

/*
 * x [m, k], codes [padded_n / 64][k / 4][64][4] int8, scales [padded_n] -> out [m, n]
 * (n <= padded_n). Returns 0, -1 for shapes the kernel does not take (k not a multiple of 32,
 * padded_n not a multiple of 64) and -2 when scratch memory cannot be allocated.
 */
int int8_linear(const act_t *x, const int8_t *codes, const act_t *scales, act_t *out, int64_t m,
                int64_t n, int64_t padded_n, int64_t k, int num_threads) {
    if (k % BLOCK || padded_n % TILE_ROWS || n > padded_n) return -1;
    const int64_t blocks_per_token = k / BLOCK;
    activation_codes x_codes;
    if (activation_codes_make(x, m, k, num_threads, &x_codes)) return -2;
    const int64_t num_tiles = padded_n / TILE_ROWS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
        const int64_t row0 = tile * TILE_ROWS;
        const int64_t out_rows = n - row0 < TILE_ROWS ? n - row0 : TILE_ROWS;
        if (out_rows <= 0) continue;
        /* NOTE: the tile (k * 64 bytes) stays in L2 while the tokens pass over it. */
        const int8_t *tile_codes = codes + tile * TILE_ROWS * k;
        int64_t t = 0;
        for (; t + TOKEN_GROUP <= m; t += TOKEN_GROUP)
            tile_matmul_group(tile_codes, scales + row0, k, x_codes.codes + 2 * t * k,
                              x_codes.scales + 2 * t * blocks_per_token, out + t * n + row0, n,
                              out_rows, TOKEN_GROUP);
        for (; t < m; ++t)
            tile_matmul_one(tile_codes, scales + row0, k, x_codes.codes + 2 * t * k,
                            x_codes.scales + 2 * t * blocks_per_token, out + t * n + row0,
                            out_rows);
    }
    activation_codes_free(&x_codes);
    return 0;
}

/*
 * Rows [row0, row0 + num_rows) of the weight (row0 a multiple of 64), dequantized as
 * Int8Linear.dequantize_rows does, w = q s rounded once to act_t (the same values bit for bit:
 * the product of an int8 code and a bf16 scale is exact in float32), into out [k][num_rows]:
 * transposed, as int4_linear.c's int4_dequantize and for the same reason (steps above the
 * kernel's token limit run PyTorch's GEMM on it). Returns 0, or -1 for shapes int8_linear
 * refuses too or rows outside the weight.
 */
int int8_dequantize(const int8_t *codes, const act_t *scales, act_t *out, int64_t row0,
                    int64_t num_rows, int64_t padded_n, int64_t k, int num_threads) {
    if (k % BLOCK || row0 < 0 || row0 % TILE_ROWS || num_rows < 0 || row0 + num_rows > padded_n)
        return -1;
    const int64_t first_tile = row0 / TILE_ROWS;
    const int64_t num_tiles = (num_rows + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
        for (int64_t block = 0; block < k / BLOCK; ++block) {
            const int64_t tile_row = (first_tile + tile) * TILE_ROWS;
            const int8_t *block_codes = codes + tile_row * k + block * BLOCK * TILE_ROWS;
            for (int v = 0; v < ROW_VECTORS; ++v) {
                const int64_t out_row = tile * TILE_ROWS + v * 16; /* of out's num_rows */
                if (out_row >= num_rows) break;
                const int64_t rows = num_rows - out_row < 16 ? num_rows - out_row : 16;
                const vf scale = load_act(scales + tile_row + v * 16);
                for (int step = 0; step < BLOCK / STEP; ++step) {
                    const vb packed = vb_load(block_codes + step * STEP * TILE_ROWS + 64 * v);
                    for (int byte = 0; byte < STEP; ++byte) {
                        const int64_t column = block * BLOCK + step * STEP + byte;
                        store_act_n(out + column * num_rows + out_row,
                                    vf_mul(vb_lane_sbyte_to_vf(packed, byte), scale), rows);
                    }
                }
            }
        }
    }
    return 0;
}

typedef struct {
    const int8_t *codes;
    const act_t *scales;
    int64_t k;
} int8_weight;

/* w = q s of 16 rows at 32 columns, in float32 (exact: int8_dequantize's values) */
static inline void int8_block(const void *weight, int64_t row, int64_t column, vf *w) {
    const int8_weight *weight_of = weight;
    const int64_t tile_row = row - row % TILE_ROWS, v = (row % TILE_ROWS) / 16;
    const int8_t *tile_codes = weight_of->codes + tile_row * weight_of->k;
    const vf scale = load_act(weight_of->scales + row);
    for (int step = 0; step < BLOCK / STEP; ++step) {
        const vb packed = vb_load(tile_codes + (column / STEP + step) * STEP * TILE_ROWS + 64 * v);
        for (int byte = 0; byte < STEP; ++byte)
            w[step * STEP + byte] = vf_mul(vb_lane_sbyte_to_vf(packed, byte), scale);
    }
}

/*
 * Rows [row0, row0 + num_rows) of the weight (row0 a multiple of 64) as int8 codes W^T
 * [k][num_rows] with float32 scales [num_rows], recoded per row as int4_int8_codes codes
 * (int8_row_codes.h): the codes a row has already where its largest one is +-127. Returns 0,
 * or -1 for shapes int8_linear refuses too or rows outside the weight.
 */
int int8_int8_codes(const int8_t *codes, const act_t *scales, int8_t *codes_t, float *row_scales,
                    int64_t row0, int64_t num_rows, int64_t padded_n, int64_t k,
                    int num_threads) {
    if (k % BLOCK || padded_n % TILE_ROWS) return -1;
    const int8_weight weight = {codes, scales, k};
    return int8_row_codes(&weight, int8_block, codes_t, row_scales, row0, num_rows, padded_n, k,
                          num_threads);
}

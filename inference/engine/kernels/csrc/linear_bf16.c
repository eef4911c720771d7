/*
 * y = x W^T (+ b) in bf16 with Intel AMX (x86-64 CPUs with amx_tile and amx_bf16).
 *
 * Weights are packed once, at load time, in AMX's "VNNI" layout by tiles of 16 output rows:
 * [N/16][K/2][16][2], so the B operand of one tile multiply (32 values of k for 16 rows) is
 * 1 KB of contiguous memory. Why not oneDNN's own packed weights (layers/linear.py): at one
 * token a decode step only streams the weights, and oneDNN's kernel reaches ~12 GB/s there
 * against ~27 GB/s that two cores can read; this kernel keeps the tile unit fed with sequential
 * 1 KB loads at any number of tokens.
 *
 * Blocking: up to 32 rows of x (two A tiles) by 32 output columns (two B tiles) into four
 * float32 accumulator tiles; work items (row block, column block) are spread over threads.
 * Numerics: bf16 products summed in float32 (as oneDNN's bf16 GEMM), the bias added in float32,
 * the result rounded to bf16 (nearest even).
 */
#define _GNU_SOURCE /* syscall() under -std=c11 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"
#include "simd.h"

#define TILE_ROWS 16   /* rows of x, or output columns, per tile */
#define TILE_K 32      /* bf16 values of k per tile row (64 bytes) */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux hands out the AMX register state only to processes that ask for it. */
int amx_request_permission(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

/* Interleave W [n, k] (row-major bf16) into [n/16][k/2][16][2]. */
void pack_bf16_vnni(const uint16_t *weight, uint16_t *packed, int64_t n, int64_t k) {
#pragma omp parallel for
    for (int64_t tile = 0; tile < n / TILE_ROWS; ++tile)
        for (int64_t row = 0; row < TILE_ROWS; ++row) {
            const uint16_t *src = weight + (tile * TILE_ROWS + row) * k;
            uint16_t *dst = packed + tile * TILE_ROWS * k + row * 2;
            for (int64_t pair = 0; pair < k / 2; ++pair) {
                dst[pair * TILE_ROWS * 2] = src[2 * pair];
                dst[pair * TILE_ROWS * 2 + 1] = src[2 * pair + 1];
            }
        }
}

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* tmm0-3: C (a, b), tmm4-5: A, tmm6-7: B */
static void configure_tiles(int rows_a0, int rows_a1) {
    tile_config config;
    memset(&config, 0, sizeof(config));
    config.palette_id = 1;
    const int rows_a[2] = {rows_a0, rows_a1 ? rows_a1 : 1};
    for (int a = 0; a < 2; ++a) {
        for (int b = 0; b < 2; ++b) {
            config.rows[a * 2 + b] = (uint8_t)rows_a[a];
            config.colsb[a * 2 + b] = TILE_ROWS * 4;
        }
        config.rows[4 + a] = (uint8_t)rows_a[a];
        config.colsb[4 + a] = TILE_K * 2;
        config.rows[6 + a] = TILE_K / 2;
        config.colsb[6 + a] = TILE_ROWS * 4;
    }
    _tile_loadconfig(&config);
}

/* rows x 16 float32 sums (+ bias) -> bf16 out[row][column0 ...] */
static inline void write_rows(const float *sums, int rows, const uint16_t *bias, uint16_t *out,
                              int64_t n, int64_t column0) {
    const vf b = bias ? vf_load_bf16(bias + column0) : vf_zero();
    for (int r = 0; r < rows; ++r)
        vf_store_bf16(out + r * n + column0, vf_add(vf_load(sums + r * 16), b));
}

/* One block: rows [row0, row0 + 16 * NUM_A) of x by columns [col0, col0 + 16 * NUM_B). */
#define BLOCK(NUM_A, NUM_B)                                                                     \
    static void block_##NUM_A##x##NUM_B(const uint16_t *x, const uint16_t *packed,               \
                                        const uint16_t *bias, uint16_t *out, int64_t n,          \
                                        int64_t k, int64_t row0, int rows_a0, int rows_a1,       \
                                        int64_t col0) {                                          \
        float sums[TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));                          \
        const uint16_t *b0 = packed + col0 * k;                                                  \
        const uint16_t *b1 = b0 + TILE_ROWS * k;                                                 \
        const uint16_t *a0 = x + row0 * k;                                                       \
        const uint16_t *a1 = a0 + TILE_ROWS * k;                                                 \
        (void)b1;                                                                                \
        (void)a1;                                                                                \
        _tile_zero(0);                                                                           \
        if (NUM_B > 1) _tile_zero(1);                                                            \
        if (NUM_A > 1) _tile_zero(2);                                                            \
        if (NUM_A > 1 && NUM_B > 1) _tile_zero(3);                                               \
        for (int64_t kk = 0; kk < k; kk += TILE_K) {                                             \
            _tile_loadd(4, a0 + kk, k * 2);                                                      \
            _tile_loadd(6, b0 + kk * TILE_ROWS, TILE_ROWS * 4);                                  \
            _tile_dpbf16ps(0, 4, 6);                                                             \
            if (NUM_B > 1) {                                                                     \
                _tile_loadd(7, b1 + kk * TILE_ROWS, TILE_ROWS * 4);                              \
                _tile_dpbf16ps(1, 4, 7);                                                         \
            }                                                                                    \
            if (NUM_A > 1) {                                                                     \
                _tile_loadd(5, a1 + kk, k * 2);                                                  \
                _tile_dpbf16ps(2, 5, 6);                                                         \
                if (NUM_B > 1) _tile_dpbf16ps(3, 5, 7);                                          \
            }                                                                                    \
        }                                                                                        \
        _tile_stored(0, sums, 64);                                                               \
        write_rows(sums, rows_a0, bias, out + row0 * n, n, col0);                                \
        if (NUM_B > 1) {                                                                         \
            _tile_stored(1, sums, 64);                                                           \
            write_rows(sums, rows_a0, bias, out + row0 * n, n, col0 + TILE_ROWS);                \
        }                                                                                        \
        if (NUM_A > 1) {                                                                         \
            _tile_stored(2, sums, 64);                                                           \
            write_rows(sums, rows_a1, bias, out + (row0 + TILE_ROWS) * n, n, col0);              \
            if (NUM_B > 1) {                                                                     \
                _tile_stored(3, sums, 64);                                                       \
                write_rows(sums, rows_a1, bias, out + (row0 + TILE_ROWS) * n, n,                 \
                           col0 + TILE_ROWS);                                                    \
            }                                                                                    \
        }                                                                                        \
    }
BLOCK(1, 1)
BLOCK(1, 2)
BLOCK(2, 1)
BLOCK(2, 2)

/*
 * x [m, k] bf16 contiguous; packed: W as pack_bf16_vnni wrote it; bias [n] bf16 or NULL;
 * out [m, n] bf16. Returns -1 (nothing written) unless n % 16 == 0 and k % 32 == 0.
 * amx_request_permission() must have succeeded in this process.
 */
int linear_bf16_amx(const uint16_t *x, const uint16_t *packed, const uint16_t *bias,
                    uint16_t *out, int64_t m, int64_t n, int64_t k, int num_threads) {
    if (n % TILE_ROWS || k % TILE_K || m < 1) return -1;
    const int64_t row_blocks = (m + 2 * TILE_ROWS - 1) / (2 * TILE_ROWS);
    const int64_t col_blocks = (n / TILE_ROWS + 1) / 2;
    const int64_t num_items = row_blocks * col_blocks;
    int threads = num_threads;
    if (threads > num_items) threads = (int)num_items;
#pragma omp parallel num_threads(threads)
    {
        int configured_rows = -1;
        /* NOTE: dynamic, not static: when the web stack takes one of the cores for a moment,
         * the other thread takes the remaining blocks instead of waiting for it at the end
         * (measured with api.bench, 32 SSE streams against the engine alone on 2 cores:
         * 0.70 of the engine's throughput with static blocks, 1.0 with dynamic ones). */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            /* column blocks vary fastest: a thread walks its weights once per row block */
            const int64_t row0 = (item / col_blocks) * 2 * TILE_ROWS;
            const int64_t col0 = (item % col_blocks) * 2 * TILE_ROWS;
            const int64_t rows = m - row0 < 2 * TILE_ROWS ? m - row0 : 2 * TILE_ROWS;
            if (rows != configured_rows) {
                configure_tiles(rows < TILE_ROWS ? (int)rows : TILE_ROWS,
                                rows > TILE_ROWS ? (int)(rows - TILE_ROWS) : 0);
                configured_rows = (int)rows;
            }
            const int rows_a0 = rows < TILE_ROWS ? (int)rows : TILE_ROWS;
            const int rows_a1 = rows > TILE_ROWS ? (int)(rows - TILE_ROWS) : 0;
            const int two_b = col0 + TILE_ROWS < n;
            if (rows_a1 && two_b)
                block_2x2(x, packed, bias, out, n, k, row0, rows_a0, rows_a1, col0);
            else if (rows_a1)
                block_2x1(x, packed, bias, out, n, k, row0, rows_a0, rows_a1, col0);
            else if (two_b)
                block_1x2(x, packed, bias, out, n, k, row0, rows_a0, rows_a1, col0);
            else
                block_1x1(x, packed, bias, out, n, k, row0, rows_a0, rows_a1, col0);
        }
        if (configured_rows >= 0) _tile_release();
    }
    return 0;
}

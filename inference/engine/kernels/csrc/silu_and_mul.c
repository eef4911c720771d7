/*
 * The SiLU-gated product of a Llama MLP in bf16: out = silu(gate) * up, one pass.
 *
 * PyTorch runs F.silu(gate) * up as two ops over [tokens, intermediate] bf16 tensors, each
 * converting to float and back: measured here 0.54 ms for a 512-token chunk of SmolLM2's
 * 1,536-wide MLP, ~8% of a prefill step. Rounding follows PyTorch's: silu(gate) is computed in
 * float32 and rounded to bf16, then multiplied by up in float32 and rounded again.
 */
#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

/*
 * gate_up: [rows, 2 * width] bf16, each row the gate then the up projection;
 * out: [rows, width] bf16. width must be a multiple of 16 (returns -1 otherwise).
 */
int silu_and_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t width,
                      int num_threads) {
    if (width % 16) return -1;
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for num_threads(rows >= 16 ? num_threads : 1)
    for (int64_t row = 0; row < rows; ++row) {
        const uint16_t *gate = gate_up + row * 2 * width;
        const uint16_t *up = gate + width;
        uint16_t *dst = out + row * width;
        for (int64_t i = 0; i < width; i += 16) {
            const __m512 g = load_bf16x16(gate + i);
            const __m512 negated = _mm512_sub_ps(_mm512_setzero_ps(), g);
            const __m512 silu = round_to_bf16(_mm512_div_ps(g, _mm512_add_ps(one, exp_ps(negated))));
            const __m512 product = _mm512_mul_ps(silu, load_bf16x16(up + i));
            _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(product));
        }
    }
    return 0;
}

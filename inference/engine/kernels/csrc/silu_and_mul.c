/*
 * The SiLU-gated product of a Llama MLP: out = silu(gate) * up, one pass.
 *
 * PyTorch runs F.silu(gate) * up as two ops over [tokens, intermediate] tensors, each
 * converting to float and back: measured here 0.54 ms for a 512-token chunk of SmolLM2's
 * 1,536-wide MLP, ~8% of a prefill step. Rounding follows PyTorch's: silu(gate) is computed in
 * float32 and rounded to the activation type, then multiplied by up in float32 and rounded
 * again.
 */
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

/*
 * gate_up: [rows, 2 * width], each row the gate then the up projection; out: [rows, width].
 * width must be a multiple of 16 (returns -1 otherwise).
 */
int silu_and_mul(const act_t *gate_up, act_t *out, int64_t rows, int64_t width, int num_threads) {
    if (width % VF_LANES) return -1;
    const vf one = vf_set1(1.0f);
#pragma omp parallel for num_threads(rows >= 16 ? num_threads : 1)
    for (int64_t row = 0; row < rows; ++row) {
        const act_t *gate = gate_up + row * 2 * width;
        const act_t *up = gate + width;
        act_t *dst = out + row * width;
        for (int64_t i = 0; i < width; i += VF_LANES) {
            const vf g = load_act(gate + i);
            const vf negated = vf_sub(vf_zero(), g);
            const vf silu = round_act(vf_div(g, vf_add(one, vf_exp(negated))));
            store_act(dst + i, vf_mul(silu, load_act(up + i)));
        }
    }
    return 0;
}

/*
 * bf16 <-> float32 conversions and a vector exp, shared by the kernels (AVX-512 BF16).
 * Header-only (static inline): each kernel library is compiled on its own.
 */
#ifndef CACHET_BF16_H
#define CACHET_BF16_H

#include <immintrin.h>
#include <stdint.h>

/* 16 bf16 values -> float32 (exact). */
static inline __m512 load_bf16x16(const uint16_t *src) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* float32 -> 16 bf16 values, rounded to nearest even (as PyTorch's .to(bfloat16)). */
static inline void store_bf16x16(uint16_t *dst, __m512 x) {
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(x));
}

/* x rounded to bf16 and back: where a PyTorch bf16 op would round its result. */
static inline __m512 round_to_bf16(__m512 x) {
    __m512i wide = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/*
 * e^x in float32 (relative error ~2e-7): 2^n * poly(r), x = n ln2 + r, |r| <= ln2/2. Below -87
 * it returns ~1e-38 (0 for every use here), above 89 +inf, as expf would.
 */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(89.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif

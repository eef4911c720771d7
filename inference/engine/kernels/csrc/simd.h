/*
 * The vector operations the kernels are written in, for the instruction set a library is built
 * for (kernels/__init__.py picks it from the CPU's flags and passes its -march):
 * - AVX-512 (x86-64-v4), using the BF16 and VNNI instructions where the build enables them
 *   (__AVX512BF16__, __AVX512VNNI__) and exact integer equivalents otherwise;
 * - AVX2 + FMA (x86-64-v3): each vector is two 256-bit halves;
 * - NEON (aarch64): each vector is four 128-bit quarters (the dot-product instructions where
 *   the build has them, __ARM_FEATURE_DOTPROD).
 * Every level computes the same values: the float operations are the same IEEE operations in
 * the same order (fused multiply-adds where the source writes them), and the integer dot
 * products are exact. Only reductions across lanes (vf_reduce_*) may add in another order.
 *
 * Types: `vf` holds 16 float32 lanes, `vi` 16 int32 lanes, `vb` 64 bytes. Integer dot products
 * take 4 bytes per int32 lane: vi_dot4_add for unsigned codes below 128 by signed bytes,
 * vi_dot4_add_signed for signed bytes by signed bytes. `vn` accumulates up to VN_MAX_ADDS dot
 * products of 4-bit codes (below 16) by signed bytes (|s| <= 127), then vn_sum gives their int32
 * sums: where the dot product is not one instruction (AVX2, AVX-512 without VNNI) the partial
 * sums stay int16 until then (8 x 2 x 15 x 127 < 2^15), one instruction a product instead of three. Activations are bf16
 * or float32 (`act_t`): a library is built for one, with -DCACHET_ACTIVATION_FLOAT32 for
 * float32, and its kernels read and write that type through load_act/store_act. round_act
 * rounds a float32 result where PyTorch would round it to the activation type (bf16: to
 * nearest even; float32: nothing to do).
 *
 * Header-only (static inline): each kernel library is compiled on its own.
 */
#ifndef CACHET_SIMD_H
#define CACHET_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define CACHET_SIMD_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define CACHET_SIMD_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define CACHET_SIMD_NEON 1
#include <arm_neon.h>
#else
#error "the kernels need AVX-512 (F, BW), AVX2 with FMA, or aarch64 NEON"
#endif

#define VF_LANES 16
#define VN_MAX_ADDS 8 /* vn_dot4_add calls a vn takes before vn_sum (int16 range) */

/* ---------------------------------------------------------------- AVX-512 */
#if CACHET_SIMD_AVX512
typedef __m512 vf;
typedef __m512i vi;
typedef __m512i vb;

static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
/* a b + c and c - a b, each rounded once */
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf vf_abs(vf x) { return _mm512_abs_ps(x); }
static inline float vf_reduce_add(vf x) { return _mm512_reduce_add_ps(x); }
static inline float vf_reduce_max(vf x) { return _mm512_reduce_max_ps(x); }
/* to the nearest integer, ties to even */
static inline vf vf_round(vf x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* x 2^n for integral n in [-126, 128] */
static inline vf vf_scale_pow2(vf x, vf n) { return _mm512_scalef_ps(x, n); }

static inline vf vf_load_bf16(const uint16_t *p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
/* float32 -> bf16 rounded to nearest even, 16 results as 16-bit lanes of a 256-bit vector */
static inline __m256i vf_to_bf16_bits(vf x) {
#ifdef __AVX512BF16__
    return (__m256i)_mm512_cvtneps_pbh(x);
#else
    /* as PyTorch's round_to_nearest_even: bits + 0x7fff + lsb of the result, NaN -> 0x7fc0 */
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    rounded = _mm512_srli_epi32(rounded, 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(rounded);
#endif
}
static inline void vf_store_bf16(uint16_t *p, vf x) {
    _mm256_storeu_si256((__m256i *)p, vf_to_bf16_bits(x));
}
/* x rounded to bf16 and back: where a PyTorch bf16 op would round its result */
static inline vf vf_round_bf16(vf x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(vf_to_bf16_bits(x)), 16));
}
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n) {
    const __mmask16 mask = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
    _mm256_mask_storeu_epi16(p, mask, vf_to_bf16_bits(x));
}
static inline void vf_store_n(float *p, vf x, int64_t n) {
    const __mmask16 mask = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
    _mm512_mask_storeu_ps(p, mask, x);
}
/* 16 bytes -> 16 floats */
static inline vf vf_load_u8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vf vf_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline vi vi_zero(void) { return _mm512_setzero_si512(); }
/* ties to even; the caller keeps |x| < 2^31 */
static inline vi vf_to_vi(vf x) { return _mm512_cvtps_epi32(x); }
static inline vf vi_to_vf(vi x) { return _mm512_cvtepi32_ps(x); }
/* 16 int32 in [-128, 127] -> 16 bytes */
static inline void vi_store_i8(int8_t *p, vi x) {
    _mm_storeu_si128((__m128i *)p, _mm512_cvtsepi32_epi8(x));
}

static inline vb vb_load(const void *p) { return _mm512_loadu_si512(p); }
static inline vb vb_set1_i32(int32_t x) { return _mm512_set1_epi32(x); }
static inline vb vb_low_nibbles(vb x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0f)); }
static inline vb vb_high_nibbles(vb x) {
    return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f));
}
/* byte `byte` (0-3) of each of the 16 int32 lanes, unsigned, as floats */
static inline vf vb_lane_byte_to_vf(vb x, int byte) {
    const __m512i shifted = _mm512_srl_epi32(x, _mm_cvtsi32_si128(8 * byte));
    return _mm512_cvtepi32_ps(_mm512_and_si512(shifted, _mm512_set1_epi32(0xff)));
}
/* the same, the byte read as signed */
static inline vf vb_lane_sbyte_to_vf(vb x, int byte) {
    const __m512i high = _mm512_sll_epi32(x, _mm_cvtsi32_si128(24 - 8 * byte));
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(high, 24));
}
/* lane i += sum of the 4 products u[4i + j] s[4i + j], u unsigned bytes below 128, s signed */
static inline vi vi_dot4_add(vi acc, vb u, vb s) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    /* NOTE: exact: the pair sums stay within int16 for u < 128 and |s| <= 127 */
    const __m512i pairs = _mm512_maddubs_epi16(u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}
/* lane i += sum of the 4 products a[4i + j] b[4i + j] of signed bytes in [-127, 127] */
static inline vi vi_dot4_add_signed(vi acc, vb a, vb b) {
    /* |a| times b with a's sign: the unsigned-by-signed product the instructions take */
    const __mmask64 negative = _mm512_movepi8_mask(a);
    const __m512i signed_b = _mm512_mask_sub_epi8(b, negative, _mm512_setzero_si512(), b);
    return vi_dot4_add(acc, _mm512_abs_epi8(a), signed_b);
}
#ifdef __AVX512VNNI__
typedef __m512i vn;
static inline vn vn_zero(void) { return _mm512_setzero_si512(); }
static inline vn vn_dot4_add(vn acc, vb nibbles, vb s) { return _mm512_dpbusd_epi32(acc, nibbles, s); }
static inline vi vn_sum(vn acc) { return acc; }
#else
typedef __m512i vn; /* int16 sums of pairs of products */
static inline vn vn_zero(void) { return _mm512_setzero_si512(); }
static inline vn vn_dot4_add(vn acc, vb nibbles, vb s) {
    return _mm512_add_epi16(acc, _mm512_maddubs_epi16(nibbles, s));
}
static inline vi vn_sum(vn acc) { return _mm512_madd_epi16(acc, _mm512_set1_epi16(1)); }
#endif

/* ---------------------------------------------------------------- AVX2 + FMA */
#elif CACHET_SIMD_AVX2
typedef struct {
    __m256 h[2];
} vf;
typedef struct {
    __m256i h[2];
} vi;
typedef struct {
    __m256i h[2];
} vb;

#define VF_MAP1(expr)                                                                          \
    vf r;                                                                                      \
    for (int i = 0; i < 2; ++i) r.h[i] = (expr);                                               \
    return r

static inline vf vf_zero(void) { VF_MAP1(_mm256_setzero_ps()); }
static inline vf vf_set1(float x) { VF_MAP1(_mm256_set1_ps(x)); }
static inline vf vf_load(const float *p) { VF_MAP1(_mm256_loadu_ps(p + 8 * i)); }
static inline void vf_store(float *p, vf x) {
    _mm256_storeu_ps(p, x.h[0]);
    _mm256_storeu_ps(p + 8, x.h[1]);
}
static inline vf vf_add(vf a, vf b) { VF_MAP1(_mm256_add_ps(a.h[i], b.h[i])); }
static inline vf vf_sub(vf a, vf b) { VF_MAP1(_mm256_sub_ps(a.h[i], b.h[i])); }
static inline vf vf_mul(vf a, vf b) { VF_MAP1(_mm256_mul_ps(a.h[i], b.h[i])); }
static inline vf vf_div(vf a, vf b) { VF_MAP1(_mm256_div_ps(a.h[i], b.h[i])); }
static inline vf vf_max(vf a, vf b) { VF_MAP1(_mm256_max_ps(a.h[i], b.h[i])); }
static inline vf vf_min(vf a, vf b) { VF_MAP1(_mm256_min_ps(a.h[i], b.h[i])); }
static inline vf vf_fmadd(vf a, vf b, vf c) { VF_MAP1(_mm256_fmadd_ps(a.h[i], b.h[i], c.h[i])); }
static inline vf vf_fnmadd(vf a, vf b, vf c) {
    VF_MAP1(_mm256_fnmadd_ps(a.h[i], b.h[i], c.h[i]));
}
static inline vf vf_abs(vf x) {
    VF_MAP1(_mm256_and_ps(x.h[i], _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))));
}
static inline float avx2_reduce_add_256(__m256 x) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}
static inline float vf_reduce_add(vf x) { return avx2_reduce_add_256(_mm256_add_ps(x.h[0], x.h[1])); }
static inline float vf_reduce_max(vf x) {
    const __m256 both = _mm256_max_ps(x.h[0], x.h[1]);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(both), _mm256_extractf128_ps(both, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline vf vf_round(vf x) {
    VF_MAP1(_mm256_round_ps(x.h[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf vf_scale_pow2(vf x, vf n) {
    /* 2^n built in the exponent field: n + 127 in [1, 255] (255: +inf, as scalef overflows) */
    VF_MAP1(_mm256_mul_ps(
        x.h[i], _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_add_epi32(_mm256_cvtps_epi32(n.h[i]), _mm256_set1_epi32(127)), 23))));
}

static inline vf vf_load_bf16(const uint16_t *p) {
    VF_MAP1(_mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8 * i))), 16)));
}
/* float32 -> bf16 (nearest even, NaN -> 0x7fc0, as PyTorch), 8 results in 32-bit lanes */
static inline __m256i avx2_bf16_bits(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    rounded = _mm256_srli_epi32(rounded, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
}
static inline __m256i vf_to_bf16_bits(vf x) {
    /* packus interleaves the 128-bit lanes: [a0-3 b0-3 a4-7 b4-7]; the permute restores order */
    const __m256i packed = _mm256_packus_epi32(avx2_bf16_bits(x.h[0]), avx2_bf16_bits(x.h[1]));
    return _mm256_permute4x64_epi64(packed, 0xd8);
}
static inline void vf_store_bf16(uint16_t *p, vf x) {
    _mm256_storeu_si256((__m256i *)p, vf_to_bf16_bits(x));
}
static inline vf vf_round_bf16(vf x) {
    VF_MAP1(_mm256_castsi256_ps(_mm256_slli_epi32(avx2_bf16_bits(x.h[i]), 16)));
}
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n) {
    if (n >= 16) {
        vf_store_bf16(p, x);
        return;
    }
    uint16_t all[16];
    vf_store_bf16(all, x);
    memcpy(p, all, sizeof(uint16_t) * (size_t)n);
}
static inline void vf_store_n(float *p, vf x, int64_t n) {
    if (n >= 16) {
        vf_store(p, x);
        return;
    }
    float all[16];
    vf_store(all, x);
    memcpy(p, all, sizeof(float) * (size_t)n);
}
static inline vf vf_load_u8(const uint8_t *p) {
    VF_MAP1(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i)))));
}
static inline vf vf_load_i8(const int8_t *p) {
    VF_MAP1(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i)))));
}

static inline vi vi_zero(void) {
    vi r = {{_mm256_setzero_si256(), _mm256_setzero_si256()}};
    return r;
}
static inline vi vf_to_vi(vf x) {
    vi r = {{_mm256_cvtps_epi32(x.h[0]), _mm256_cvtps_epi32(x.h[1])}};
    return r;
}
static inline vf vi_to_vf(vi x) { VF_MAP1(_mm256_cvtepi32_ps(x.h[i])); }
static inline void vi_store_i8(int8_t *p, vi x) {
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(x.h[0], x.h[1]), 0xd8);
    const __m128i bytes =
        _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128((__m128i *)p, bytes);
}

static inline vb vb_load(const void *p) {
    vb r = {{_mm256_loadu_si256((const __m256i *)p),
             _mm256_loadu_si256((const __m256i *)((const char *)p + 32))}};
    return r;
}
static inline vb vb_set1_i32(int32_t x) {
    vb r = {{_mm256_set1_epi32(x), _mm256_set1_epi32(x)}};
    return r;
}
static inline vb vb_low_nibbles(vb x) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    vb r = {{_mm256_and_si256(x.h[0], nibble), _mm256_and_si256(x.h[1], nibble)}};
    return r;
}
static inline vb vb_high_nibbles(vb x) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    vb r = {{_mm256_and_si256(_mm256_srli_epi16(x.h[0], 4), nibble),
             _mm256_and_si256(_mm256_srli_epi16(x.h[1], 4), nibble)}};
    return r;
}
static inline vf vb_lane_byte_to_vf(vb x, int byte) {
    const __m128i count = _mm_cvtsi32_si128(8 * byte);
    VF_MAP1(_mm256_cvtepi32_ps(
        _mm256_and_si256(_mm256_srl_epi32(x.h[i], count), _mm256_set1_epi32(0xff))));
}
static inline vf vb_lane_sbyte_to_vf(vb x, int byte) {
    const __m128i count = _mm_cvtsi32_si128(24 - 8 * byte);
    VF_MAP1(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(x.h[i], count), 24)));
}
static inline vi vi_dot4_add(vi acc, vb u, vb s) {
    /* NOTE: exact: the pair sums stay within int16 for u < 128 and |s| <= 127 */
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 2; ++i)
        acc.h[i] = _mm256_add_epi32(
            acc.h[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u.h[i], s.h[i]), ones));
    return acc;
}
static inline vi vi_dot4_add_signed(vi acc, vb a, vb b) {
    /* |a| times b with a's sign (exact for |a| <= 127 and |b| <= 127) */
    vb magnitude, signed_b;
    for (int i = 0; i < 2; ++i) {
        magnitude.h[i] = _mm256_sign_epi8(a.h[i], a.h[i]);
        signed_b.h[i] = _mm256_sign_epi8(b.h[i], a.h[i]);
    }
    return vi_dot4_add(acc, magnitude, signed_b);
}
typedef struct {
    __m256i h[2]; /* int16 sums of pairs of products */
} vn;
static inline vn vn_zero(void) {
    vn r = {{_mm256_setzero_si256(), _mm256_setzero_si256()}};
    return r;
}
static inline vn vn_dot4_add(vn acc, vb nibbles, vb s) {
    for (int i = 0; i < 2; ++i)
        acc.h[i] = _mm256_add_epi16(acc.h[i], _mm256_maddubs_epi16(nibbles.h[i], s.h[i]));
    return acc;
}
static inline vi vn_sum(vn acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    vi r = {{_mm256_madd_epi16(acc.h[0], ones), _mm256_madd_epi16(acc.h[1], ones)}};
    return r;
}
#undef VF_MAP1

/* ---------------------------------------------------------------- NEON */
#elif CACHET_SIMD_NEON
/*
 * Cross-compiled and run under qemu-aarch64 for both levels (armv8-a; armv8.2-a+dotprod) and
 * both activation types by tests/engine/kernels/test_cross_aarch64.py.
 * NOTE: vmaxq/vminq return NaN when an operand is NaN, where x86's max/min return their second
 * operand: vf_exp(NaN) is NaN here and ~0 on x86 (no kernel feeds it a NaN from finite data).
 */
typedef struct {
    float32x4_t q[4];
} vf;
typedef struct {
    int32x4_t q[4];
} vi;
typedef struct {
    uint8x16_t q[4];
} vb;

#define VF_MAP1(expr)                                                                          \
    vf r;                                                                                      \
    for (int i = 0; i < 4; ++i) r.q[i] = (expr);                                               \
    return r

static inline vf vf_zero(void) { VF_MAP1(vdupq_n_f32(0.0f)); }
static inline vf vf_set1(float x) { VF_MAP1(vdupq_n_f32(x)); }
static inline vf vf_load(const float *p) { VF_MAP1(vld1q_f32(p + 4 * i)); }
static inline void vf_store(float *p, vf x) {
    for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, x.q[i]);
}
static inline vf vf_add(vf a, vf b) { VF_MAP1(vaddq_f32(a.q[i], b.q[i])); }
static inline vf vf_sub(vf a, vf b) { VF_MAP1(vsubq_f32(a.q[i], b.q[i])); }
static inline vf vf_mul(vf a, vf b) { VF_MAP1(vmulq_f32(a.q[i], b.q[i])); }
static inline vf vf_div(vf a, vf b) { VF_MAP1(vdivq_f32(a.q[i], b.q[i])); }
static inline vf vf_max(vf a, vf b) { VF_MAP1(vmaxq_f32(a.q[i], b.q[i])); }
static inline vf vf_min(vf a, vf b) { VF_MAP1(vminq_f32(a.q[i], b.q[i])); }
static inline vf vf_fmadd(vf a, vf b, vf c) { VF_MAP1(vfmaq_f32(c.q[i], a.q[i], b.q[i])); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { VF_MAP1(vfmsq_f32(c.q[i], a.q[i], b.q[i])); }
static inline vf vf_abs(vf x) { VF_MAP1(vabsq_f32(x.q[i])); }
static inline float vf_reduce_add(vf x) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(x.q[0], x.q[1]), vaddq_f32(x.q[2], x.q[3])));
}
static inline float vf_reduce_max(vf x) {
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(x.q[0], x.q[1]), vmaxq_f32(x.q[2], x.q[3])));
}
static inline vf vf_round(vf x) { VF_MAP1(vrndnq_f32(x.q[i])); }
static inline vf vf_scale_pow2(vf x, vf n) {
    VF_MAP1(vmulq_f32(x.q[i], vreinterpretq_f32_s32(vshlq_n_s32(
                                  vaddq_s32(vcvtnq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23))));
}

static inline vf vf_load_bf16(const uint16_t *p) {
    VF_MAP1(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16)));
}
static inline uint16x4_t neon_bf16_bits(float32x4_t x) {
    const uint32x4_t bits = vreinterpretq_u32_f32(x);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    const uint32x4_t rounded =
        vshrq_n_u32(vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t is_number = vceqq_f32(x, x);
    return vmovn_u32(vbslq_u32(is_number, rounded, vdupq_n_u32(0x7fc0)));
}
static inline void vf_store_bf16(uint16_t *p, vf x) {
    for (int i = 0; i < 4; ++i) vst1_u16(p + 4 * i, neon_bf16_bits(x.q[i]));
}
static inline vf vf_round_bf16(vf x) {
    VF_MAP1(vreinterpretq_f32_u32(vshll_n_u16(neon_bf16_bits(x.q[i]), 16)));
}
static inline void vf_store_bf16_n(uint16_t *p, vf x, int64_t n) {
    uint16_t all[16];
    vf_store_bf16(all, x);
    memcpy(p, all, sizeof(uint16_t) * (size_t)(n < 16 ? n : 16));
}
static inline void vf_store_n(float *p, vf x, int64_t n) {
    float all[16];
    vf_store(all, x);
    memcpy(p, all, sizeof(float) * (size_t)(n < 16 ? n : 16));
}
static inline vf vf_load_u8(const uint8_t *p) {
    const uint16x8_t low = vmovl_u8(vld1_u8(p)), high = vmovl_u8(vld1_u8(p + 8));
    vf r = {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(low))),
             vcvtq_f32_u32(vmovl_u16(vget_high_u16(low))),
             vcvtq_f32_u32(vmovl_u16(vget_low_u16(high))),
             vcvtq_f32_u32(vmovl_u16(vget_high_u16(high)))}};
    return r;
}
static inline vf vf_load_i8(const int8_t *p) {
    const int16x8_t low = vmovl_s8(vld1_s8(p)), high = vmovl_s8(vld1_s8(p + 8));
    vf r = {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(low))),
             vcvtq_f32_s32(vmovl_s16(vget_high_s16(low))),
             vcvtq_f32_s32(vmovl_s16(vget_low_s16(high))),
             vcvtq_f32_s32(vmovl_s16(vget_high_s16(high)))}};
    return r;
}

static inline vi vi_zero(void) {
    vi r;
    for (int i = 0; i < 4; ++i) r.q[i] = vdupq_n_s32(0);
    return r;
}
static inline vi vf_to_vi(vf x) {
    vi r;
    for (int i = 0; i < 4; ++i) r.q[i] = vcvtnq_s32_f32(x.q[i]);
    return r;
}
static inline vf vi_to_vf(vi x) { VF_MAP1(vcvtq_f32_s32(x.q[i])); }
static inline void vi_store_i8(int8_t *p, vi x) {
    const int16x8_t low = vcombine_s16(vqmovn_s32(x.q[0]), vqmovn_s32(x.q[1]));
    const int16x8_t high = vcombine_s16(vqmovn_s32(x.q[2]), vqmovn_s32(x.q[3]));
    vst1q_s8(p, vcombine_s8(vqmovn_s16(low), vqmovn_s16(high)));
}

static inline vb vb_load(const void *p) {
    vb r;
    for (int i = 0; i < 4; ++i) r.q[i] = vld1q_u8((const uint8_t *)p + 16 * i);
    return r;
}
static inline vb vb_set1_i32(int32_t x) {
    vb r;
    for (int i = 0; i < 4; ++i) r.q[i] = vreinterpretq_u8_s32(vdupq_n_s32(x));
    return r;
}
static inline vb vb_low_nibbles(vb x) {
    for (int i = 0; i < 4; ++i) x.q[i] = vandq_u8(x.q[i], vdupq_n_u8(0x0f));
    return x;
}
static inline vb vb_high_nibbles(vb x) {
    for (int i = 0; i < 4; ++i) x.q[i] = vshrq_n_u8(x.q[i], 4);
    return x;
}
static inline vf vb_lane_byte_to_vf(vb x, int byte) {
    /* a negative count shifts right */
    VF_MAP1(vcvtq_f32_u32(vandq_u32(vshlq_u32(vreinterpretq_u32_u8(x.q[i]), vdupq_n_s32(-8 * byte)),
                                    vdupq_n_u32(0xff))));
}
static inline vf vb_lane_sbyte_to_vf(vb x, int byte) {
    const int32x4_t count = vdupq_n_s32(24 - 8 * byte);
    VF_MAP1(vcvtq_f32_s32(
        vshrq_n_s32(vshlq_s32(vreinterpretq_s32_u8(x.q[i]), count), 24)));
}
static inline vi vi_dot4_add(vi acc, vb u, vb s) {
    /* u < 128, so its bytes are the same numbers read as signed */
    for (int i = 0; i < 4; ++i) {
        const int8x16_t a = vreinterpretq_s8_u8(u.q[i]), b = vreinterpretq_s8_u8(s.q[i]);
#ifdef __ARM_FEATURE_DOTPROD
        acc.q[i] = vdotq_s32(acc.q[i], a, b);
#else
        const int16x8_t low = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        const int16x8_t high = vmull_high_s8(a, b);
        /* pairwise: [p0+p1, p2+p3, ...] then the pairs of pairs, 4 products per lane */
        acc.q[i] = vaddq_s32(acc.q[i], vpaddq_s32(vpaddlq_s16(low), vpaddlq_s16(high)));
#endif
    }
    return acc;
}
static inline vi vi_dot4_add_signed(vi acc, vb a, vb b) {
    /* NEON's dot products are signed by signed already: the same instructions */
    return vi_dot4_add(acc, a, b);
}
typedef vi vn;
static inline vn vn_zero(void) { return vi_zero(); }
static inline vn vn_dot4_add(vn acc, vb nibbles, vb s) { return vi_dot4_add(acc, nibbles, s); }
static inline vi vn_sum(vn acc) { return acc; }
#undef VF_MAP1
#endif

/* ---------------------------------------------------------------- all levels */

/*
 * e^x in float32 (relative error ~2e-7): 2^n * poly(r), x = n ln2 + r, |r| <= ln2/2. Below -87
 * it returns ~1e-38 (0 for every use here), above 89 +inf, as expf would.
 */
static inline vf vf_exp(vf x) {
    x = vf_min(vf_max(x, vf_set1(-87.0f)), vf_set1(89.0f));
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.0f / 720.0f);
    p = vf_fmadd(p, r, vf_set1(1.0f / 120.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f / 24.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f / 6.0f));
    p = vf_fmadd(p, r, vf_set1(0.5f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    return vf_scale_pow2(p, n);
}

/* The activation type of this build: 16 values at a time, read, written and rounded. */
#ifdef CACHET_ACTIVATION_FLOAT32
typedef float act_t;
static inline vf load_act(const act_t *p) { return vf_load(p); }
static inline void store_act(act_t *p, vf x) { vf_store(p, x); }
static inline void store_act_n(act_t *p, vf x, int64_t n) { vf_store_n(p, x, n); }
static inline vf round_act(vf x) { return x; }
#else
typedef uint16_t act_t;
static inline vf load_act(const act_t *p) { return vf_load_bf16(p); }
static inline void store_act(act_t *p, vf x) { vf_store_bf16(p, x); }
static inline void store_act_n(act_t *p, vf x, int64_t n) { vf_store_bf16_n(p, x, n); }
static inline vf round_act(vf x) { return vf_round_bf16(x); }
#endif

#endif

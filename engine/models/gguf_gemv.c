/* A GGUF file's own quantized blocks times fp32 activations (see gguf_blocks.py): the weight layers of a CPU model
 * loaded with weights="gguf", read as llama.cpp stores them, never requantized.
 *
 * Block formats (32 weights of one row each, ``in`` a multiple of 32), as gguf-py dequantizes them:
 *   Q4_0, 18 bytes: fp16 d, 16 bytes of nibbles;          w = d * (q - 8)
 *   Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles;  w = d * q + m
 *   Q8_0, 34 bytes: fp16 d, 32 int8;                      w = d * q
 * The low nibbles of a block's 16 bytes are its weights 0-15, the high ones 16-31.
 *
 * ``gguf_dequantize`` writes those weights in fp32 exactly as gguf-py computes them (one product, then for Q4_1 one
 * sum, each rounded: this file is built with -ffp-contract=off so no fused multiply-add merges the two), for
 * prefill chunks, which torch's fp32 matmul then multiplies. ``gguf_gemv`` serves decode rows: per block it sums
 * q * x in fp32 and scales the sum by d once (Q4_1 adds m times the block's sum of x, computed once per activation
 * row; Q4_0 takes 8d times it away): the same sum as the dequantized weights' products, in another order and
 * grouping, within fp32 rounding of it. Decode reads
 * each weight once per token, so reading the 4-bit blocks (0.56-0.63 bytes a weight) instead of int8 codes
 * (1 byte) is the point. Four output rows at a time share each activation vector; the next four are requested
 * ahead. Callers split [lo, hi) across threads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };  /* ggml's type numbers */

static inline float half_to_float(const uint8_t *p) {
    uint16_t half;
    memcpy(&half, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(half);
#else
    /* exact for normals, subnormals, infinities and NaNs (the same bit operations as host_kernel.c) */
    union { uint32_t u; float f; } out = { (uint32_t)(half & 0x7fff) << 13 };
    const uint32_t exponent = out.u & 0x0f800000u;
    out.u += (uint32_t)(127 - 15) << 23;
    if (exponent == 0x0f800000u) {
        out.u += (uint32_t)(128 - 16) << 23;
    } else if (exponent == 0) {
        const union { uint32_t u; float f; } magic = { (uint32_t)113 << 23 };
        out.u += 1u << 23;
        out.f -= magic.f;
    }
    out.u |= (uint32_t)(half & 0x8000) << 16;
    return out.f;
#endif
}

static inline long block_bytes(int type) {
    return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q8_0 ? 34 : 0;
}

/* One block's 32 weights as small integers (exact in fp32): q - 8, q or the int8. */
static inline void block_ints(const uint8_t *block, int type, float *q) {
    if (type == Q8_0) {
        for (int j = 0; j < 32; j++) q[j] = (float)(int8_t)block[2 + j];
        return;
    }
    const uint8_t *nibbles = block + (type == Q4_1 ? 4 : 2);
    const float offset = type == Q4_0 ? 8.0f : 0.0f;
    for (int j = 0; j < 16; j++) {
        q[j] = (float)(nibbles[j] & 0x0F) - offset;
        q[j + 16] = (float)(nibbles[j] >> 4) - offset;
    }
}

/* raw: [out, in / 32 blocks]; writes rows [lo, hi) of the fp32 weight w: [out, in]. Returns 0, -1 for a bad type
 * or width. */
int gguf_dequantize(const uint8_t *raw, int type, long in, long lo, long hi, float *w) {
    const long bb = block_bytes(type);
    if (bb == 0 || in % 32) return -1;
    const long blocks = in / 32;
    for (long o = lo; o < hi; o++) {
        for (long b = 0; b < blocks; b++) {
            const uint8_t *block = raw + (o * blocks + b) * bb;
            float q[32];
            block_ints(block, type, q);
            const float d = half_to_float(block);
            float *out = w + o * in + b * 32;
            if (type == Q4_1) {
                const float m = half_to_float(block + 2);
                for (int j = 0; j < 32; j++) out[j] = d * q[j] + m;  /* two roundings: no contraction here */
            } else {
                for (int j = 0; j < 32; j++) out[j] = d * q[j];
            }
        }
    }
    return 0;
}

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HEADINFER_GGUF_AVX2 1

static inline float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* 8 bytes widened to 32-bit lanes (the load is part of the widening instruction) */
static inline __m256i widen_bytes(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* sum over the block of q_j * x_j, in 8 lanes (x: the block's 32 activations in 4 vectors; Q4_0's q is the nibble,
 * its -8 is applied with the block's sum of x, like Q4_1's m). The nibbles are widened as whole bytes, then split
 * in their 32-bit lanes (an and, a shift): bytes 0-7 give weights 0-7 and 16-23, bytes 8-15 weights 8-15 and 24-31.
 * That is two widening shuffles a block, where splitting the nibbles first took six, and the shuffles set the
 * pace (4-bit blocks ran at half the int8 GEMV's weights per second). */
static inline __attribute__((always_inline)) __m256 block_dot(const uint8_t *block, int type, const __m256 *x) {
    if (type == Q8_0) {
        const uint8_t *q = block + 2;
        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), x[0]);
        for (int k = 1; k < 4; k++)
            s = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * k)))), x[k], s);
        return s;
    }
    const uint8_t *nibbles = block + (type == Q4_1 ? 4 : 2);
    const __m256i mask = _mm256_set1_epi32(0x0F);
    const __m256i first = widen_bytes(nibbles), second = widen_bytes(nibbles + 8);
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(first, mask)), x[0]);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(second, mask)), x[1], s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(first, 4)), x[2], s);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(second, 4)), x[3], s);
}

/* Four consecutive output rows (``stride`` bytes apart) against one activation row. */
static inline __attribute__((always_inline)) void dot4(const uint8_t *row, long stride, int type, const float *x, const float *xsum, long blocks,
                        float *out) {
    const long bb = block_bytes(type);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};  /* sum over blocks of m * (the block's sum of x); Q4_0: m = -8d */
    for (long b = 0; b < blocks; b++) {
        /* The next four rows' line at this offset, once per line: requested now, it arrives while these rows
         * compute (as in int8_gemv.c). */
        if ((b * bb) % 64 < bb)
            for (int k = 4; k < 8; k++) __builtin_prefetch(row + k * stride + b * bb, 0, 0);
        const __m256 xb[4] = {_mm256_loadu_ps(x + 32 * b), _mm256_loadu_ps(x + 32 * b + 8),
                              _mm256_loadu_ps(x + 32 * b + 16), _mm256_loadu_ps(x + 32 * b + 24)};
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * bb;
            int32_t halves;  /* d and, for Q4_1, m: widened together */
            memcpy(&halves, block, 4);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(halves));
            acc[k] = _mm256_fmadd_ps(block_dot(block, type, xb), _mm256_broadcastss_ps(dm), acc[k]);
            if (type == Q4_1) offsets[k] += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * xsum[b];
            if (type == Q4_0) offsets[k] += -8.0f * _mm_cvtss_f32(dm) * xsum[b];
        }
    }
    for (int k = 0; k < 4; k++) out[k] = hsum8(acc[k]) + offsets[k];
}
#endif

/* One output row against one activation row, plainly (the tail rows, and machines without AVX2). */
static inline float dot1(const uint8_t *row, int type, const float *x, const float *xsum, long blocks) {
    const long bb = block_bytes(type);
    float total = 0.0f;
    for (long b = 0; b < blocks; b++) {
        const uint8_t *block = row + b * bb;
        float q[32], sum = 0.0f;
        block_ints(block, type, q);
        for (int j = 0; j < 32; j++) sum += q[j] * x[32 * b + j];
        total += half_to_float(block) * sum;
        if (type == Q4_1) total += half_to_float(block + 2) * xsum[b];
    }
    return total;
}

/* x: [rows, in] fp32; raw: [out, in / 32 blocks]; bias: [out] fp32 or NULL; y: [rows, out] fp32. Computes output
 * columns [lo, hi) only. Returns 0, -1 for a bad type or width, -2 out of memory. */
int gguf_gemv(const float *x, const uint8_t *raw, int type, const float *bias, float *y, long rows, long in,
              long out, long lo, long hi) {
    const long bb = block_bytes(type);
    if (bb == 0 || in % 32) return -1;
    const long blocks = in / 32, stride = blocks * bb;
    /* each block's sum of x (Q4_1's m multiplies it): this call's own, as other threads run other ranges */
    float *xsum = malloc(sizeof(float) * rows * blocks);
    if (xsum == NULL) return -2;
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < blocks; b++) {
            float sum = 0.0f;
            for (int j = 0; j < 32; j++) sum += x[r * in + 32 * b + j];
            xsum[r * blocks + b] = sum;
        }
    for (long o = lo; o < hi; o += 4) {
        const int width = hi - o < 4 ? (int)(hi - o) : 4;
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * in, *sr = xsum + r * blocks;
            float s[4];
#ifdef HEADINFER_GGUF_AVX2
            /* one call per type: each inlined copy has its block format as a constant */
            if (width == 4 && type == Q4_1) {
                dot4(raw + o * stride, stride, Q4_1, xr, sr, blocks, s);
            } else if (width == 4 && type == Q4_0) {
                dot4(raw + o * stride, stride, Q4_0, xr, sr, blocks, s);
            } else if (width == 4) {
                dot4(raw + o * stride, stride, Q8_0, xr, sr, blocks, s);
            } else
#endif
            {
                for (int k = 0; k < width; k++) s[k] = dot1(raw + (o + k) * stride, type, xr, sr, blocks);
            }
            for (int k = 0; k < width; k++) y[r * out + o + k] = s[k] + (bias ? bias[o + k] : 0.0f);
        }
    }
    free(xsum);
    return 0;
}

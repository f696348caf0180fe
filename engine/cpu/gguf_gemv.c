/* A GGUF file's own quantized blocks times fp32 activations (see gguf_blocks.py): the weight layers of a CPU model
 * loaded with weights="gguf", read as llama.cpp stores them, never requantized.
 *
 * Block formats (a row's weights in blocks of 32, or super-blocks of 256 for the K types), as gguf-py
 * dequantizes them (d, m, dmin: fp16; q: the block's small integers):
 *   Q4_0  18 bytes: d, 16 bytes of nibbles                  w = d * (q - 8)
 *   Q4_1  20 bytes: d, m, 16 bytes of nibbles               w = d * q + m
 *   Q5_0  22 bytes: d, 32 high bits, 16 bytes of nibbles    w = d * (q - 16)
 *   Q5_1  24 bytes: d, m, 32 high bits, nibbles             w = d * q + m
 *   Q8_0  34 bytes: d, 32 int8                              w = d * q
 *   Q4_K 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;  per 32: w = (d*sc) * q - dmin*mn
 *   Q5_K 176 bytes: as Q4_K plus 32 bytes of high bits
 *   Q6_K 210 bytes: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, d;     per 16: w = (d*sc) * (q - 32)
 * In a 32-weight block the low nibbles of its 16 bytes are weights 0-15, the high ones 16-31.
 *
 * ``gguf_dequantize`` writes those weights in fp32 exactly as gguf-py computes them: each product and sum rounded by
 * itself (this file is built with -ffp-contract=off, so no fused multiply-add merges two), for prefill chunks, which
 * torch's fp32 matmul then multiplies, and for matching a file's tensors to a model's layers bit for bit.
 * ``gguf_gemv`` serves decode rows. For Q4_0, Q4_1 and Q8_0 (on AVX2) it sums q * x per block in fp32 and scales
 * the sum by d once (Q4_1 adds m times the block's sum of x, computed once per activation row; Q4_0 takes 8d times
 * it away): the same sum as the dequantized weights' products, in another order and grouping, within fp32 rounding
 * of it. Other types dequantize each block into L1 and multiply the weights themselves. Decode reads each weight
 * once per token, so reading 4-6-bit blocks (0.56-0.82 bytes a weight) instead of int8 codes (1 byte) or fp32 (4)
 * is the point. Four output rows at a time share each activation vector; the next four are requested ahead.
 * Q4_K and Q6_K (a Q4_K_M file's every layer) also have AVX-512 paths, 16 lanes, where the CPU has AVX-512F/BW
 * (``gguf_gemv_path`` says which path a build runs; tests force each through ``-march``): the same factored sums, in
 * another grouping; with AVX-512 VNNI, Q6_K's are integer sums of its codes (see "through integer dot products").
 * Their dequantization for prefill is vectorized there too, bit for bit the scalar's.
 * Callers split [lo, hi) across threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../native/common.h"
#ifdef __F16C__
#include <immintrin.h>
#endif

/* Every weight prefetch asks for all cache levels (hint 3): the non-temporal hint (0) it used before measured 1.2-2.6x
 * slower from DRAM on AVX-512, most of all on rows wider than L1 holds the activations of (docs/benchmarks/
 * gemv-prefetch.md). -DPREFETCH_HINT=0 builds the old one for that benchmark. */
#ifndef PREFETCH_HINT
#define PREFETCH_HINT 3
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  /* ggml's numbers */

static inline float half_to_float(const uint8_t *p) {
    uint16_t half;
    memcpy(&half, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(half);
#else
    return hc_half_bits_to_float(half);  /* exact, as F16C */
#endif
}

static inline long block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

static inline long block_size(int type) {  /* weights per block */
    return type == Q4_K || type == Q5_K || type == Q6_K ? 256 : 32;
}

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j (of 8) from the 12 packed bytes (gguf-py's get_scale_min). */
static inline void scale_min(const uint8_t *packed, int j, int *scale, int *min) {
    if (j < 4) {
        *scale = packed[j] & 0x3F;
        *min = packed[j + 4] & 0x3F;
    } else {
        *scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 2) & 0x30);
        *min = (packed[j + 4] >> 4) | ((packed[j] >> 2) & 0x30);
    }
}

/* One block's weights in fp32, each computed as gguf-py computes it (see the top of this file). */
static inline void block_weights(const uint8_t *block, int type, float *w) {
    const float d = half_to_float(block);
    switch (type) {
    case Q8_0:
        for (int j = 0; j < 32; j++) w[j] = d * (float)(int8_t)block[2 + j];
        return;
    case Q4_0:
    case Q4_1: {
        const int has_min = type == Q4_1;
        const uint8_t *qs = block + (has_min ? 4 : 2);
        const float offset = has_min ? 0.0f : 8.0f;
        for (int j = 0; j < 16; j++) {
            w[j] = d * ((float)(qs[j] & 0x0F) - offset);
            w[j + 16] = d * ((float)(qs[j] >> 4) - offset);
        }
        if (has_min) {
            const float m = half_to_float(block + 2);
            for (int j = 0; j < 32; j++) w[j] = w[j] + m;
        }
        return;
    }
    case Q5_0:
    case Q5_1: {
        const int has_min = type == Q5_1;
        const float offset = has_min ? 0.0f : 16.0f;
        uint32_t qh;
        memcpy(&qh, block + (has_min ? 4 : 2), 4);
        const uint8_t *qs = block + (has_min ? 8 : 6);
        for (int j = 0; j < 16; j++) {
            w[j] = d * ((float)((qs[j] & 0x0F) | ((qh >> j) & 1) << 4) - offset);
            w[j + 16] = d * ((float)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
        }
        if (has_min) {
            const float m = half_to_float(block + 2);
            for (int j = 0; j < 32; j++) w[j] = w[j] + m;
        }
        return;
    }
    case Q4_K:
    case Q5_K: {
        const float dmin = half_to_float(block + 2);
        const uint8_t *packed = block + 4, *qh = block + 16, *qs = block + (type == Q5_K ? 48 : 16);
        for (int j = 0; j < 8; j++) {  /* sub-block j: bytes 32 * (j / 2) on, low nibbles for even j */
            int scale, min;
            scale_min(packed, j, &scale, &min);
            const float sd = d * (float)scale, md = dmin * (float)min;
            const uint8_t *bytes = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            for (int k = 0; k < 32; k++) {
                int q = (bytes[k] >> shift) & 0x0F;
                if (type == Q5_K) q |= ((qh[k] >> j) & 1) << 4;
                w[32 * j + k] = sd * (float)q - md;
            }
        }
        return;
    }
    case Q6_K: {
        const uint8_t *ql = block, *qh = block + 128;
        const int8_t *scales = (const int8_t *)(block + 192);
        const float d6 = half_to_float(block + 208);  /* Q6_K keeps its d last */
        for (int g = 0; g < 2; g++)
            for (int c = 0; c < 4; c++) {  /* elements 128 g + 32 c + k */
                const uint8_t *low = ql + 64 * g + 32 * (c & 1), *high = qh + 32 * g;
                const int shift = c < 2 ? 0 : 4;
                const float lo_scale = d6 * (float)scales[8 * g + 2 * c];
                const float hi_scale = d6 * (float)scales[8 * g + 2 * c + 1];
                for (int k = 0; k < 32; k++) {
                    const int q = (((low[k] >> shift) & 0x0F) | ((high[k] >> (2 * c)) & 3) << 4) - 32;
                    w[128 * g + 32 * c + k] = (k < 16 ? lo_scale : hi_scale) * (float)q;
                }
            }
        return;
    }
    }
}

/* ``rows`` (at most 4) consecutive output rows, ``stride`` bytes apart, against one activation row, any block type:
 * each block dequantized into L1, then multiplied (the products of the dequantized weights, summed in 8 lanes). */
static inline void dot_any(const uint8_t *row, long stride, int type, const float *x, long blocks, int rows,
                           float *out) {
    const long bb = block_bytes(type), bs = block_size(type);
    float acc[4][8] = {{0.0f}};
    float w[256] __attribute__((aligned(32)));
    for (long b = 0; b < blocks; b++)
        for (int k = 0; k < rows; k++) {
            block_weights(row + k * stride + b * bb, type, w);
            const float *xb = x + b * bs;
            for (long e = 0; e < bs; e += 8)
                for (int l = 0; l < 8; l++) acc[k][l] += w[e + l] * xb[e + l];
        }
    for (int k = 0; k < rows; k++) {
        float sum = 0.0f;
        for (int l = 0; l < 8; l++) sum += acc[k][l];
        out[k] = sum;
    }
}

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HEADINFER_GGUF_AVX2 1

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
    const uint8_t *nibbles = block + (type == Q4_1 ? 4 : type == Q5_0 ? 6 : 2);
    const __m256i mask = _mm256_set1_epi32(0x0F);
    const __m256i first = widen_bytes(nibbles), second = widen_bytes(nibbles + 8);
    __m256i q[4] = {_mm256_and_si256(first, mask), _mm256_and_si256(second, mask), _mm256_srli_epi32(first, 4),
                    _mm256_srli_epi32(second, 4)};
    if (type == Q5_0) {  /* weight i's fifth bit is bit i of qh: shifted to bit 4 of its lane, kept, or'ed in */
        uint32_t qh;
        memcpy(&qh, block + 2, 4);
        const __m256i bits = _mm256_set1_epi32((int)qh), low = _mm256_set1_epi32((int)(qh << 4));
        const __m256i up0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);  /* (qh << 4) >> i: bits 0-7 */
        const __m256i sixteen = _mm256_set1_epi32(16);
        /* q[1], q[2], q[3] hold weights 8-15, 16-23, 24-31: qh >> (i - 4) */
        const int base[4] = {0, 4, 12, 20};
        q[0] = _mm256_or_si256(q[0], _mm256_and_si256(_mm256_srlv_epi32(low, up0), sixteen));
        for (int v = 1; v < 4; v++) {
            const __m256i shifts = _mm256_add_epi32(up0, _mm256_set1_epi32(base[v]));
            q[v] = _mm256_or_si256(q[v], _mm256_and_si256(_mm256_srlv_epi32(bits, shifts), sixteen));
        }
    }
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(q[0]), x[0]);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[1]), x[1], s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[2]), x[2], s);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[3]), x[3], s);
}

/* Four consecutive output rows (``stride`` bytes apart) against one activation row. */
static inline __attribute__((always_inline)) void dot4(const uint8_t *row, long stride, int type, const float *x,
                                                       const float *xsum, long blocks, float *out) {
    const long bb = block_bytes(type);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    /* sum over blocks of m times the block's sum of x (Q4_0: m = -8d, Q5_0: -16d) */
    float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (long b = 0; b < blocks; b++) {
        /* The next four rows' line at this offset, once per line: requested now, it arrives while these rows
         * compute (as in int8_gemv.c). */
        if ((b * bb) % 64 < bb)
            for (int k = 4; k < 8; k++) __builtin_prefetch(row + k * stride + b * bb, 0, PREFETCH_HINT);
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
            if (type == Q5_0) offsets[k] += -16.0f * _mm_cvtss_f32(dm) * xsum[b];
        }
    }
    for (int k = 0; k < 4; k++) out[k] = hc_hsum8(acc[k]) + offsets[k];
}

/* Q4_K, four rows: per sub-block of 32, sum q * x, times d * scale; minus dmin * min times the sub-block's sum of
 * x (xsum, per 32 activations). A sub-block pair shares 32 bytes: low nibbles, then high. */
static inline __attribute__((always_inline)) void dot4_q4k(const uint8_t *row, long stride, const float *x,
                                                           const float *xsum, long blocks, float *out) {
    const __m256i mask = _mm256_set1_epi32(0x0F);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (long b = 0; b < blocks; b++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * 144;
            for (long line = 0; line < 144; line += 64) __builtin_prefetch(block + 4 * stride + line, 0, PREFETCH_HINT);
            const float d = half_to_float(block), dmin = half_to_float(block + 2);
            const uint8_t *qs = block + 16;
            for (int g = 0; g < 4; g++) {
                int scale0, min0, scale1, min1;
                scale_min(block + 4, 2 * g, &scale0, &min0);
                scale_min(block + 4, 2 * g + 1, &scale1, &min1);
                const float *xg = x + 256 * b + 64 * g;
                __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
                for (int i = 0; i < 32; i += 8) {
                    const __m256i bytes = widen_bytes(qs + 32 * g + i);
                    const __m256i ql = _mm256_and_si256(bytes, mask), qu = _mm256_srli_epi32(bytes, 4);
                    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ql), _mm256_loadu_ps(xg + i), lo);
                    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qu), _mm256_loadu_ps(xg + 32 + i), hi);
                }
                acc[k] = _mm256_fmadd_ps(lo, _mm256_set1_ps(d * (float)scale0), acc[k]);
                acc[k] = _mm256_fmadd_ps(hi, _mm256_set1_ps(d * (float)scale1), acc[k]);
                offsets[k] -= dmin * (float)min0 * xsum[8 * b + 2 * g] + dmin * (float)min1 * xsum[8 * b + 2 * g + 1];
            }
        }
    }
    for (int k = 0; k < 4; k++) out[k] = hc_hsum8(acc[k]) + offsets[k];
}

/* Q6_K's four 6-bit values from the same 8 positions of its low-nibble rows a (elements c = 0, 2) and b (c = 1, 3)
 * and its 2-bit rows h: q - 32 for elements 128 g + 32 c + i .. i + 7. */
static inline void q6_values(__m256i a, __m256i b, __m256i h, __m256 *q) {
    const __m256i mask = _mm256_set1_epi32(0x0F), three = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    const __m256i lows[4] = {_mm256_and_si256(a, mask), _mm256_and_si256(b, mask), _mm256_srli_epi32(a, 4),
                             _mm256_srli_epi32(b, 4)};
    for (int c = 0; c < 4; c++) {
        const __m256i high = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * c), three), 4);
        q[c] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lows[c], high), bias));
    }
}

/* Q6_K, four rows: per sub-block of 16, sum (q - 32) * x, times d * scale. Elements 128 g + 32 c + k take
 * nibble c / 2 of ql[64 g + 32 (c % 2) + k] and bits 2c, 2c + 1 of qh[32 g + k]; sub-block (128 g + 32 c + k) / 16. */
static inline __attribute__((always_inline)) void dot4_q6k(const uint8_t *row, long stride, const float *x, long blocks,
                                                           float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (long b = 0; b < blocks; b++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * 210;
            for (long line = 0; line < 210; line += 64) __builtin_prefetch(block + 4 * stride + line, 0, PREFETCH_HINT);
            const int8_t *scales = (const int8_t *)(block + 192);
            const float d = half_to_float(block + 208);
            const float *xb = x + 256 * b;
            for (int g = 0; g < 2; g++)
                for (int half = 0; half < 2; half++) {  /* positions 16 half .. 16 half + 15: one sub-block per c */
                    const int i = 16 * half;
                    __m256 q0[4], q1[4];
                    q6_values(widen_bytes(block + 64 * g + i), widen_bytes(block + 64 * g + 32 + i),
                              widen_bytes(block + 128 + 32 * g + i), q0);
                    q6_values(widen_bytes(block + 64 * g + i + 8), widen_bytes(block + 64 * g + 32 + i + 8),
                              widen_bytes(block + 128 + 32 * g + i + 8), q1);
                    for (int c = 0; c < 4; c++) {
                        const int e = 128 * g + 32 * c + i;
                        const __m256 t = _mm256_fmadd_ps(q1[c], _mm256_loadu_ps(xb + e + 8),
                                                         _mm256_mul_ps(q0[c], _mm256_loadu_ps(xb + e)));
                        acc[k] = _mm256_fmadd_ps(t, _mm256_set1_ps(d * (float)scales[e / 16]), acc[k]);
                    }
                }
        }
    }
    for (int k = 0; k < 4; k++) out[k] = hc_hsum8(acc[k]);
}
#endif

#if defined(HEADINFER_GGUF_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__)
#define HEADINFER_GGUF_AVX512 1

/* Q4_K's 8 six-bit scales (bytes 0-7 of ``out``) and 8 mins (bytes 8-15) from the 12 packed bytes, all at once in
 * four 32-bit words (llama.cpp's unpacking; the same numbers as scale_min, checked against it by the tests through
 * every bit pattern). x86 only: little-endian words. */
static inline void scales_mins_k(const uint8_t *packed, uint32_t out[4]) {
    const uint32_t six = 0x3f3f3f3fu, low = 0x0f0f0f0fu, two = 0x03030303u;
    uint32_t w[3];
    memcpy(w, packed, 12);
    out[0] = w[0] & six;                                      /* scales 0-3 */
    out[1] = (w[2] & low) | (((w[0] >> 6) & two) << 4);       /* scales 4-7 */
    out[2] = w[1] & six;                                      /* mins 0-3 */
    out[3] = ((w[2] >> 4) & low) | (((w[1] >> 6) & two) << 4); /* mins 4-7 */
}

static inline __m256 bytes8_to_float(const void *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Q4_K on 16 lanes, four rows: per sub-block of 32, sum q * x, times d * scale; minus dmin * min times the
 * sub-block's sum of x. A 16-byte load widened to 16 32-bit lanes holds 16 low nibbles (sub-block 2g) and 16 high
 * ones (2g + 1): the low ones become floats by a table lookup (vpermps reads only an index's low 4 bits, so no mask
 * is needed, and it runs on the shuffle port while conversions and FMAs share the other two), the high ones by a
 * shift and a conversion. The factors of a super-block (8 of d * scale, 8 of dmin * min) are unpacked and
 * multiplied 8 at a time, and the mins' sum is taken in 8 lanes. */
static inline __attribute__((always_inline)) void dot4_q4k_512(const uint8_t *row, long stride, const float *x,
                                                               const float *xsum, long blocks, float *out) {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    /* two sums a row (low and high nibbles' sub-blocks): a chain of 8 dependent FMAs a block would bound the pace */
    __m512 acc[4][2];
    for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    __m256 offsets[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float factors[8] __attribute__((aligned(32)));
    for (long b = 0; b < blocks; b++) {
        const float *xb = x + 256 * b;
        const __m256 sums = _mm256_loadu_ps(xsum + 8 * b);
#pragma GCC unroll 4  /* the four rows unrolled: their sums stay in registers */
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * 144;
            for (long line = 0; line < 144; line += 64) __builtin_prefetch(block + 4 * stride + line, 0, PREFETCH_HINT);
            uint32_t unpacked[4];
            scales_mins_k(block + 4, unpacked);
            const __m256 d = _mm256_set1_ps(half_to_float(block)), dmin = _mm256_set1_ps(half_to_float(block + 2));
            _mm256_store_ps(factors, _mm256_mul_ps(d, bytes8_to_float(unpacked)));
            /* read back from memory below: a broadcast from memory is a load, one from a register a shuffle, and
             * the shuffle port is this loop's busiest (widening and table lookups) */
            __asm__ volatile("" : : "r"(factors) : "memory");
            offsets[k] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, bytes8_to_float(unpacked + 2)), sums, offsets[k]);
            const uint8_t *qs = block + 16;
            for (int g = 0; g < 4; g++) {
                const float *xg = xb + 64 * g;
                const __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * g)));
                const __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * g + 16)));
                __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(q0, table), _mm512_loadu_ps(xg));
                lo = _mm512_fmadd_ps(_mm512_permutexvar_ps(q1, table), _mm512_loadu_ps(xg + 16), lo);
                __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q0, 4)), _mm512_loadu_ps(xg + 32));
                hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q1, 4)), _mm512_loadu_ps(xg + 48), hi);
                acc[k][0] = _mm512_fmadd_ps(lo, _mm512_set1_ps(factors[2 * g]), acc[k][0]);
                acc[k][1] = _mm512_fmadd_ps(hi, _mm512_set1_ps(factors[2 * g + 1]), acc[k][1]);
            }
        }
    }
    for (int k = 0; k < 4; k++) out[k] = _mm512_reduce_add_ps(_mm512_add_ps(acc[k][0], acc[k][1])) - hc_hsum8(offsets[k]);
}

/* Q6_K's 6-bit codes q (0-63) from its 128 low-nibble bytes and 64 bytes of 2-bit highs, 64 at a time in bytes (its
 * values are q - 32): element 128 g + 32 c + k takes nibble c / 2 of ql[64 g + 32 (c % 2) + k] and bits 2c, 2c + 1
 * of qh[32 g + k]. The highs of both c of a 64-byte half are shifted into bits 4-5 by one per-16-bit-word shift
 * (4 and 2 for c = 0, 1; 0 and 2 right for c = 2, 3): bits crossing into the next byte land outside 0x30. */
static inline __attribute__((always_inline)) void q6k_codes(const uint8_t *block, int g, __m512i *q01, __m512i *q23) {
    /* q01: elements 128 g + [0, 64); q23: 128 g + [64, 128) */
    const __m512i nibble = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i low = _mm512_loadu_si512((const void *)(block + 64 * g));
    const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 128 + 32 * g)));
    const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi16(bits, up), high);
    const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(bits, down), high);
    /* 0xEC: (a & c) | b */
    *q01 = _mm512_ternarylogic_epi32(low, h01, nibble, 0xEC);
    *q23 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 4), h23, nibble, 0xEC);
}

/* the 256 values q - 32 (int8, in element order) */
static inline void q6k_values(const uint8_t *block, int8_t *q) {
    const __m512i bias = _mm512_set1_epi8(32);
    for (int g = 0; g < 2; g++) {
        __m512i q01, q23;
        q6k_codes(block, g, &q01, &q23);
        _mm512_store_si512((void *)(q + 128 * g), _mm512_sub_epi8(q01, bias));
        _mm512_store_si512((void *)(q + 128 * g + 64), _mm512_sub_epi8(q23, bias));
    }
}

/* Q6_K on 16 lanes, four rows: a block's values are unpacked into L1 as bytes (64 at a time), then each sub-block
 * of 16 is one widening load, one conversion, one product with x and one FMA by d * scale (the 16 factors made at
 * once). */
static inline __attribute__((always_inline)) void dot4_q6k_512(const uint8_t *row, long stride, const float *x,
                                                               long blocks, float *out) {
    __m512 acc[4][4];  /* four sums a row, sub-block s into s % 4: no long chain of dependent FMAs */
    for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = _mm512_setzero_ps();
    int8_t q[256] __attribute__((aligned(64)));
    float factors[16] __attribute__((aligned(64)));
    for (long b = 0; b < blocks; b++) {
        const float *xb = x + 256 * b;
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * 210;
            for (long line = 0; line < 210; line += 64) __builtin_prefetch(block + 4 * stride + line, 0, PREFETCH_HINT);
            q6k_values(block, q);
            const __m512 scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 192))));
            _mm512_store_ps(factors, _mm512_mul_ps(_mm512_set1_ps(half_to_float(block + 208)), scales));
            __asm__ volatile("" : : "r"(factors) : "memory");  /* broadcasts from memory, as in dot4_q4k_512 */
            for (int s = 0; s < 16; s++) {
                const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(q + 16 * s))));
                acc[k][s % 4] = _mm512_fmadd_ps(_mm512_mul_ps(values, _mm512_loadu_ps(xb + 16 * s)),
                                                _mm512_set1_ps(factors[s]), acc[k][s % 4]);
            }
        }
    }
    for (int k = 0; k < 4; k++)
        out[k] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[k][0], acc[k][1]),
                                                    _mm512_add_ps(acc[k][2], acc[k][3])));
}
#endif

#if defined(HEADINFER_GGUF_AVX512) && defined(__AVX512VNNI__)
#define HEADINFER_GGUF_VNNI 1
/* Q6_K through integer dot products (AVX-512 VNNI), where a core reads memory faster than the fp32 path's
 * instructions go: on an EPYC core (40 GB/s read) it streamed Q6_K blocks at ~15 GB/s from DRAM and from L2 alike,
 * bound by its widenings, conversions and products (docs/benchmarks/gemv-vnni.md: 25-29 GB/s here).
 *
 * The activations are taken apart once per input vector (``vn_prepare``), not per row or per projection: each
 * sub-block of 32 as integers X (|X| <= 2^22) times a scale s (its largest magnitude / (2^22 - 1)), and X in three
 * balanced signed bytes, X = a 2^16 + b 2^8 + c. A row's 6-bit codes (before their offset of 32) times those bytes
 * are exact integer sums, four products a 32-bit lane (vpdpbusd), shifted together exactly; the offset is taken away
 * exactly as 32 times the lane's sum of X. Each lane's integer is converted to fp32 once and scaled by the block's
 * d * scale times s. The error is X's rounding to an integer (and x / s's in fp32): about 2^-23 of its sub-block's
 * largest magnitude per activation (measured 2e-8 of the sum of magnitudes, against the fp32 path's ~1e-7), so not
 * a bit-equal fp32 sum, but within the float tolerance every path is tested to. An input with an infinity or NaN
 * takes the fp32 path (gv_prepare).
 *
 * Q4_K stays on its fp32 path (dot4_q4k_512): the same integer scheme for its nibbles (three vpdpbusd, two shifts,
 * a conversion and a permute per 64 weights, against the fp32 path's table lookups) measured faster alone from L2
 * but slower in the model's step: the CPU default model's step at 2K, in turns, 59.5-61.3 ms with both types on
 * this path against 55.1-57.1 with Q6_K alone (one core; 39.9-41.4 against 38.6-39.5 on two).
 *
 * Layout, per super-block of 256 activations: four chunks of 64 in element order (chunk c: sub-blocks of 32 2c and
 * 2c + 1), as q6k_codes makes a row's codes; per chunk three limbs of 64 bytes (a, b, c) and 16 lane sums of X
 * (times 32).
 *
 * Lines are requested ~16 KB of rows ahead into L2 (prefetcht2): with the fp32 path's distance (4 rows, into L1)
 * the integer path streamed 15-18 GB/s from DRAM, ~16 KB ahead 22-29 (the fp32 paths gain nothing from it: their
 * instructions bind). */
enum { VN_LIMBS = 4 * 3 * 64 };
#ifndef VN_AHEAD_BYTES
#define VN_AHEAD_BYTES 16384 /* ~16 KB ahead in whole rows: 12-64 KB measured alike; a fixed 32 rows (161 KB of a
                                down projection's 5 KB rows) ran it at 14 GB/s against 19-21 */
#endif
#define VN_PREFETCH_HINT 1 /* prefetcht2: into L2 (not PREFETCH_HINT, which the fp32 paths' benchmark varies) */

typedef struct {
    int8_t *limbs;  /* [blocks][4 chunks][3][64] */
    int32_t *sums;  /* [blocks][4 chunks][16]: 32 * the lane's sum of X (Q6_K's offset) */
    float *scales;  /* [blocks][8]: s of each sub-block of 32, in element order */
} vn_input;

/* 16 integers (|v| <= 2^22) as three balanced bytes, each written as 16 bytes of its limb */
static inline void vn_split16(__m512i v, int8_t *a, int8_t *b, int8_t *c) {
    const __m512i low = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24); /* [-128, 127] */
    v = _mm512_srai_epi32(_mm512_sub_epi32(v, low), 8);
    const __m512i mid = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
    v = _mm512_srai_epi32(_mm512_sub_epi32(v, mid), 8);                  /* [-64, 64] */
    _mm_storeu_si128((__m128i *)a, _mm512_cvtepi32_epi8(v));
    _mm_storeu_si128((__m128i *)b, _mm512_cvtepi32_epi8(mid));
    _mm_storeu_si128((__m128i *)c, _mm512_cvtepi32_epi8(low));
}

/* x [in] (in a multiple of 256) -> limbs, lane sums and scales: ``in / 256`` super-blocks of each */
static void vn_prepare(const float *x, long in, vn_input *v) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512i ones = _mm512_set1_epi8(1);
    for (long b = 0; b < in / 256; b++) {
        float *scales = v->scales + 8 * b;
        float inverse[8];
        for (int j = 0; j < 8; j++) {
            const __m512 x0 = _mm512_loadu_ps(x + 256 * b + 32 * j), x1 = _mm512_loadu_ps(x + 256 * b + 32 * j + 16);
            float most = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
            /* at least 2^-100, so that 1 / s stays finite and s a normal float: a sub-block of smaller values (none
             * that a layer's input holds) keeps fewer bits, its error at most 2^-123 per activation */
            if (!(most > 0x1p-100f)) most = 0x1p-100f;
            scales[j] = most / 4194303.0f;
            inverse[j] = 4194303.0f / most;
        }
        for (int c = 0; c < 4; c++) {
            int8_t *limb = v->limbs + b * VN_LIMBS + 192 * c;
            for (int i = 0; i < 4; i++) {  /* 16 at a time, rounded to the nearest: |X| <= 2^22 - 1 plus a rounding */
                const __m512 k = _mm512_set1_ps(inverse[2 * c + i / 2]);
                const __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 256 * b + 64 * c + 16 * i), k));
                vn_split16(X, limb + 16 * i, limb + 64 + 16 * i, limb + 128 + 16 * i);
            }
            /* 32 * (the lane's four X) = 32 * (sum a 2^16 + sum b 2^8 + sum c), summed by the same instruction */
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512((const void *)limb));
            s = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), ones, _mm512_loadu_si512((const void *)(limb + 64)));
            s = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), ones, _mm512_loadu_si512((const void *)(limb + 128)));
            _mm512_storeu_si512((void *)(v->sums + 64 * b + 16 * c), _mm512_slli_epi32(s, 5));
        }
    }
}

/* how far ahead a row's lines are requested: VN_AHEAD_BYTES in whole rows, at least the next four */
static inline long vn_ahead(long stride) {
    const long rows = VN_AHEAD_BYTES / stride;
    return (rows > 4 ? rows : 4) * stride;
}

/* a chunk's exact integer sum per lane: codes (unsigned bytes) times X, from its three limbs */
static inline __m512i vn_dot(__m512i codes, const int8_t *limb) {
    __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512((const void *)limb));
    sum = _mm512_dpbusd_epi32(_mm512_slli_epi32(sum, 8), codes, _mm512_loadu_si512((const void *)(limb + 64)));
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(sum, 8), codes, _mm512_loadu_si512((const void *)(limb + 128)));
}

/* Q6_K, four rows: its 6-bit codes (before the offset of 32) as bytes, a chunk of 64 at a time (q6k_codes); per
 * chunk the exact lane sum of codes times X less 32 times the lane's sum of X, times d * scale (of the lane's
 * sub-block of 16) * s (of its sub-block of 32). */
static inline __attribute__((always_inline)) void dot4_q6k_vnni(const uint8_t *row, long stride, const vn_input *v,
                                                                long blocks, float *out) {
    const long ahead = vn_ahead(stride);
    /* lane -> sub-block of 16: chunk c's lanes 4t .. 4t + 3 hold sub-block 4c + t */
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    /* each sub-block of 32's s for its two sub-blocks of 16 */
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        const int8_t *limbs = v->limbs + b * VN_LIMBS;
        const int32_t *sums = v->sums + 64 * b;
        const __m512 s = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(v->scales + 8 * b)));
        for (int k = 0; k < 4; k++) {
            const uint8_t *block = row + k * stride + b * 210;
            for (long line = 0; line < 210; line += 64) __builtin_prefetch(block + ahead + line, 0, VN_PREFETCH_HINT);
            const __m128i packed = _mm_loadu_si128((const __m128i *)(block + 192));
            const __m512 scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(packed));
            const __m512 factors = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(half_to_float(block + 208)), scales), s);
            for (int g = 0; g < 2; g++) {
                __m512i q01, q23;
                q6k_codes(block, g, &q01, &q23);
                const __m512i codes[2] = {q01, q23}; /* chunks 2g and 2g + 1 */
                for (int i = 0; i < 2; i++) {
                    const int c = 2 * g + i;
                    const __m512i sum = _mm512_sub_epi32(vn_dot(codes[i], limbs + 192 * c),
                                                         _mm512_loadu_si512((const void *)(sums + 16 * c)));
                    const __m512i lane = _mm512_add_epi32(lanes, _mm512_set1_epi32(4 * c));
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(lane, factors), acc[k]);
                }
            }
        }
    }
    for (int k = 0; k < 4; k++) out[k] = _mm512_reduce_add_ps(acc[k]);
}
#endif

#ifdef HEADINFER_GGUF_AVX512
/* One Q4_K or Q6_K block's weights in fp32, 16 at a time, each the same product and difference as block_weights
 * (rounded one by one: no FMA), for prefill's dequantize-and-matmul. */
static inline void block_weights_512(const uint8_t *block, int type, float *w) {
    if (type == Q4_K) {
        const float d = half_to_float(block), dmin = half_to_float(block + 2);
        const uint8_t *qs = block + 16;
        for (int j = 0; j < 8; j++) {
            int scale, min;
            scale_min(block + 4, j, &scale, &min);
            const __m512 sd = _mm512_set1_ps(d * (float)scale), md = _mm512_set1_ps(dmin * (float)min);
            for (int h = 0; h < 2; h++) {
                __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * (j / 2) + 16 * h)));
                q = _mm512_and_si512(_mm512_srli_epi32(q, 4 * (j & 1)), _mm512_set1_epi32(0x0F));
                _mm512_storeu_ps(w + 32 * j + 16 * h, _mm512_sub_ps(_mm512_mul_ps(sd, _mm512_cvtepi32_ps(q)), md));
            }
        }
        return;
    }
    int8_t q[256] __attribute__((aligned(64)));
    q6k_values(block, q);
    const float d6 = half_to_float(block + 208);
    const int8_t *scales = (const int8_t *)(block + 192);
    for (int s = 0; s < 16; s++) {
        const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(q + 16 * s))));
        _mm512_storeu_ps(w + 16 * s, _mm512_mul_ps(_mm512_set1_ps(d6 * (float)scales[s]), values));
    }
}
#endif

/* raw: [out, in / block size blocks]; writes rows [lo, hi) of the fp32 weight w: [out, in]. Returns 0, -1 for a
 * bad type or width. */
int gguf_dequantize(const uint8_t *raw, int type, long in, long lo, long hi, float *w) {
    const long bb = block_bytes(type), bs = block_size(type);
    if (bb == 0 || in % bs) return -1;
    const long blocks = in / bs;
#ifdef HEADINFER_GGUF_AVX512
    if (type == Q4_K || type == Q6_K) {
        for (long o = lo; o < hi; o++)
            for (long b = 0; b < blocks; b++) block_weights_512(raw + (o * blocks + b) * bb, type, w + o * in + b * bs);
        return 0;
    }
#endif
    for (long o = lo; o < hi; o++)
        for (long b = 0; b < blocks; b++) block_weights(raw + (o * blocks + b) * bb, type, w + o * in + b * bs);
    return 0;
}

/* The vector path this build runs for the K types: 512 (AVX-512), 256 (AVX2), 0 (the portable C). */
int gguf_gemv_path(void) {
#if defined(HEADINFER_GGUF_AVX512)
    return 512;
#elif defined(HEADINFER_GGUF_AVX2)
    return 256;
#else
    return 0;
#endif
}

/* whether rows of this type can multiply an input of ``in`` (a whole number of its blocks) */
static inline int fits(int type, long in) { return block_bytes(type) != 0 && in % block_size(type) == 0; }

/* whether rows of this type take the VNNI path (where the build has it): their input needs its limbs */
static inline int takes_limbs(int type) { return type == Q6_K; }

/* One activation input as the row kernels read it, made once per input vector and shared by every row range and
 * projection that multiplies it (q, k and v; gate and up; each thread's range): each row's sums of 32 (offsets and
 * mins multiply them) and, where the VNNI path may run, its limbs (vn_prepare). */
typedef struct {
    const float *x; /* [rows, in] */
    long rows, in;
    float *xsum;    /* [rows, in / 32] */
#ifdef HEADINFER_GGUF_VNNI
    vn_input *vn;   /* [rows], or NULL */
#endif
    void *memory;
} gv_input;

/* The input for projections of which some take limbs (``limbs``: then the VNNI data too, where this build runs that
 * path). Returns 0, or -2 out of memory (nothing to release). */
static int gv_prepare(const float *x, long rows, long in, int limbs, gv_input *p) {
    const long sums = in / 32;
    size_t bytes = sizeof(float) * rows * sums;
#ifdef HEADINFER_GGUF_VNNI
    int vnni = limbs && in % 256 == 0;
    const long blocks = in / 256;
    if (vnni) bytes += rows * (sizeof(vn_input) + blocks * (VN_LIMBS + sizeof(int32_t) * 64 + sizeof(float) * 8)) + 64;
#else
    (void)limbs;
#endif
    p->x = x, p->rows = rows, p->in = in;
    p->memory = malloc(bytes ? bytes : 1);
    if (p->memory == NULL) return -2;
    p->xsum = p->memory;
    for (long r = 0; r < rows; r++)
        for (long b = 0; b < sums; b++) {
            float sum = 0.0f;
            for (long j = 0; j < 32; j++) sum += x[r * in + 32 * b + j];
            p->xsum[r * sums + b] = sum;
        }
#ifdef HEADINFER_GGUF_VNNI
    p->vn = NULL;
    /* an infinity or NaN (their sums are not finite) has no integer form: such an input takes the fp32 path, which
     * carries it through as torch would */
    for (long i = 0; vnni && i < rows * sums; i++) vnni = isfinite(p->xsum[i]);
    if (vnni) {
        uintptr_t at = (uintptr_t)(p->xsum + rows * sums);
        p->vn = (vn_input *)at;
        at = (at + rows * sizeof(vn_input) + 63) & ~(uintptr_t)63;
        for (long r = 0; r < rows; r++) {
            p->vn[r].limbs = (int8_t *)at, at += blocks * VN_LIMBS;
            p->vn[r].sums = (int32_t *)at, at += blocks * sizeof(int32_t) * 64;
            p->vn[r].scales = (float *)at, at += blocks * sizeof(float) * 8;
            vn_prepare(x + r * in, in, p->vn + r);
        }
    }
#endif
    return 0;
}

static void gv_release(gv_input *p) { free(p->memory); }

/* gguf_gemv's rows [lo, hi) of one projection against a prepared input (its width checked by the caller). */
static void gemv_rows(const gv_input *p, const uint8_t *raw, int type, const float *bias, float *y, long out, long lo,
                      long hi) {
    const long in = p->in, blocks = in / block_size(type), stride = blocks * block_bytes(type), sums = in / 32;
    for (long o = lo; o < hi; o += 4) {
        const int width = hi - o < 4 ? (int)(hi - o) : 4;
        for (long r = 0; r < p->rows; r++) {
            const float *xr = p->x + r * in, *sr = p->xsum + r * sums;
            float s[4];
#ifdef HEADINFER_GGUF_VNNI
            if (width == 4 && type == Q6_K && p->vn != NULL) {
                dot4_q6k_vnni(raw + o * stride, stride, p->vn + r, blocks, s);
            } else
#endif
#ifdef HEADINFER_GGUF_AVX2
            /* one call per type: each inlined copy has its block format as a constant */
            if (width == 4 && type == Q4_1) {
                dot4(raw + o * stride, stride, Q4_1, xr, sr, blocks, s);
            } else if (width == 4 && type == Q4_0) {
                dot4(raw + o * stride, stride, Q4_0, xr, sr, blocks, s);
            } else if (width == 4 && type == Q8_0) {
                dot4(raw + o * stride, stride, Q8_0, xr, sr, blocks, s);
            } else if (width == 4 && type == Q5_0) {
                dot4(raw + o * stride, stride, Q5_0, xr, sr, blocks, s);
            } else if (width == 4 && type == Q4_K) {
#ifdef HEADINFER_GGUF_AVX512
                dot4_q4k_512(raw + o * stride, stride, xr, sr, blocks, s);
#else
                dot4_q4k(raw + o * stride, stride, xr, sr, blocks, s);
#endif
            } else if (width == 4 && type == Q6_K) {
#ifdef HEADINFER_GGUF_AVX512
                dot4_q6k_512(raw + o * stride, stride, xr, blocks, s);
#else
                dot4_q6k(raw + o * stride, stride, xr, blocks, s);
#endif
            } else
#endif
            {
                (void)sr;
                dot_any(raw + o * stride, stride, type, xr, blocks, width, s);
            }
            for (int k = 0; k < width; k++) y[r * out + o + k] = s[k] + (bias ? bias[o + k] : 0.0f);
        }
    }
}

/* x: [rows, in] fp32; raw: [out, in / block size blocks]; bias: [out] fp32 or NULL; y: [rows, out] fp32. Computes
 * output columns [lo, hi) only. Returns 0, -1 for a bad type or width, -2 out of memory. */
int gguf_gemv(const float *x, const uint8_t *raw, int type, const float *bias, float *y, long rows, long in,
              long out, long lo, long hi) {
    if (!fits(type, in)) return -1;
    gv_input p;
    if (gv_prepare(x, rows, in, hi - lo >= 4 && takes_limbs(type), &p) != 0) return -2;
    gemv_rows(&p, raw, type, bias, y, out, lo, hi);
    gv_release(&p);
    return 0;
}

/* 1 where this build runs Q6_K rows through the VNNI integer path (dot4_q6k_vnni), else 0. */
int gguf_gemv_vnni(void) {
#ifdef HEADINFER_GGUF_VNNI
    return 1;
#else
    return 0;
#endif
}

/* ---- decode rows split over cores (split_pool.h) ---- */
#include "../native/split_pool.h"

typedef struct {
    const gv_input *input;
    const uint8_t *raw;
    const float *bias;
    float *y;
    long out;
    int type;
} gemv_call;

static int gemv_range(const void *context, long lo, long hi) {
    const gemv_call *c = context;
    gemv_rows(c->input, c->raw, c->type, c->bias, c->y, c->out, lo, hi);
    return 0;
}

/* gguf_gemv over every output column, in ranges of whole groups of 4 on the caller and up to threads - 1 of this
 * library's pool workers. */
int gguf_gemv_split(const float *x, const uint8_t *raw, int type, const float *bias, float *y, long rows, long in,
                    long out, int threads) {
    if (!fits(type, in)) return -1;
    gv_input p;  /* once for every thread's range */
    if (gv_prepare(x, rows, in, takes_limbs(type), &p) != 0) return -2;
    const gemv_call call = {&p, raw, bias, y, out, type};
    const int status = sp_run(gemv_range, &call, out, 4, threads);
    gv_release(&p);
    return status;
}

typedef struct {
    const uint8_t *raw;
    float *w;
    long in;
    int type;
} dequantize_call;

static int dequantize_range(const void *context, long lo, long hi) {
    const dequantize_call *c = context;
    return gguf_dequantize(c->raw, c->type, c->in, lo, hi, c->w);
}

/* gguf_dequantize of every row [0, out), split like gguf_gemv_split: a prefill chunk dequantizes every layer. */
int gguf_dequantize_split(const uint8_t *raw, int type, long in, long out, float *w, int threads) {
    const dequantize_call call = {raw, w, in, type};
    return sp_run(dequantize_range, &call, out, 1, threads);
}

/* The pool's idle spin in ns, set (returns the previous value), and the tasks its workers ran (see split_pool.h). */
long gguf_split_spin_ns(long spin_ns) { return sp_set_spin_ns(spin_ns); }
long gguf_split_worker_tasks(void) { return sp_worker_tasks(); }

/* sp_run itself: what another library's calls run on to share this pool (the host attention kernel's
 * ha_runner, set by engine/kv/native.py's share_pool). */
int gguf_split_run(sp_range_fn run, const void *context, long total, long align, int threads) {
    return sp_run(run, context, total, align, threads);
}

/* ---- a decode layer's fused pieces (fused_decode.py), on this library's pool ---- */
#include "gguf_decode.h"

/* One compute task of a layer's host attention (host_kernel.h): the partial softmax of one head group's query rows
 * over one tile of its home, read once in its stored dtype (bf16/fp16/fp32 widened in registers, int8 codes times
 * their scales, fp8 codes through a table into a small fp32 chunk). Compiled once per vector path (native.py):
 * -DHA_VARIANT_AVX512 (16-float vectors), -DHA_VARIANT_AVX2 (8), none (4: SSE2 on x86-64, NEON on arm64); the
 * same source, so the paths compute the same thing in the same order but for the lanes of a sum.
 *
 * Chunks of 64 tokens, in order, every head of a chunk in turn (a token's heads lie together: reading a chunk reads
 * memory as it lies). Per head and block of up to 4 query rows (6 in one block on AVX-512 with head dim 128, the CPU
 * default model's decode step: as 4 + 2 the 2-row block read the chunk again and reduced 8 partials as 16):
 * - reads: bf16 in paired lane order where the head dim allows (see HA_BF16_PAIRED: one integer operation widens
 *   a vector); the lines of the key (value) 8 KiB of the head's tokens ahead requested as each key is scored
 *   (each value added), a few at a time (the hardware prefetcher alone left a 32K-token layer read from DRAM
 *   1.6x slower);
 * - scores: 4 rows x (W / 4) keys of dot products at once, each summed over the head dim in one vector, the
 *   W vectors then reduced into one vector of W scores by a transpose-and-add tree (a horizontal sum per key would
 *   cost as much as its dot product); AVX-512 with 4 rows and head dim 128 (Llama-3's decode): scores_d128, the
 *   head dim a constant so that the 16 partials stay in registers; AVX-512 prefill blocks of fp32 homes (16 rows a
 *   head or more, head dim 128): the chunk's keys transposed once, then each 4-row block's scores an outer product
 *   (scores_kt: no tree; a block 13-17% faster on one thread);
 * - the masks and softcap where the chunk needs them, then an online softmax in fp32 (running max m and sum l per
 *   row; the row's output rescaled only when its max grows); exp by a Cephes polynomial (about 1 ulp), 0 below
 *   e^-87 (a weight under 1e-38 next to the max's 1);
 * - values: the rows' outputs held in registers a slice of the head dim at a time, each value vector widened once
 *   per row block;
 * - int8: the chunk's key and value scales gathered into two vectors per head, the keys' applied to the scores
 *   and the values' folded into the probabilities a vector at a time (not a scalar multiply per token and row).
 */
#include "host_kernel.h"
#include "../native/common.h"

#include <math.h>
#include <stdlib.h>
#if defined(HA_VARIANT_AVX512) || defined(HA_VARIANT_AVX2)
#include <immintrin.h>
#endif
#include <string.h>

#if defined(HA_VARIANT_AVX512)
#define W 16
#define ACC_VECTORS 16 /* the value pass's accumulators: half of the 32 registers */
#if defined(HA_BF16_DOT) /* AVX-512 with AVX512_BF16: scores_d128_dot */
#define TASK ha_task_avx512bf16
#define TASK_READ ha_read_avx512bf16
#else
#define TASK ha_task_avx512
#define TASK_READ ha_read_avx512
#endif
#elif defined(HA_VARIANT_AVX2)
#define W 8
#define ACC_VECTORS 8 /* half of the 16 registers */
#define TASK ha_task_avx2
#define TASK_READ ha_read_avx2
#else
#define W 4
#define ACC_VECTORS 8
#define TASK ha_task_portable
#define TASK_READ ha_read_portable
#endif

#define CH 64          /* tokens per chunk: the softmax bookkeeping paid once per 64 keys (32: 5% slower, 16: 18%) */
#define RB 4           /* query rows per block */
#define RB_MAX 6       /* a 6-row block (AVX-512, head dim 128): Qwen2.5's 6 query heads a KV head */
#ifndef HA_ROWS6
#define HA_ROWS6 1     /* 0: 6 rows as blocks of 4 + 2 (the benchmark's baseline build: host-rows6.md) */
#endif
#define TB (W / RB)    /* keys per score step: RB * TB dot products reduce into one vector */
#ifndef HA_PREFETCH_BYTES
#define HA_PREFETCH_BYTES 8192 /* how far ahead a head's keys (values) are requested, in bytes of its key and value:
                                  16 tokens of a bf16 head of 128, 32 of int8 (measured, 32K tokens from DRAM, one
                                  thread: bf16 8-16 tokens ~8% faster than 32, 24 or 64 slower; int8 32 best of
                                  16-64; none: 1.6x slower) */
#endif
#ifndef HA_SPLIT_PREFETCH
#define HA_SPLIT_PREFETCH 1
#endif
/* bf16/fp16/fp32 homes: where the next lines go depends on the CPU (host_pool.c picks, job->prefetch_l1):
 * - into L2 only (prefetcht2): a request into L1 holds one of the core's few line-fill buffers until its line
 *   arrives, and the kernel's loads wait for the same buffers; L2's miss queue is longer. On the 2-vCPU VM of
 *   2026-11-27, 32K-128K tokens from DRAM: bf16 4-10% faster than into L1;
 * - into L1 (prefetcht0) on AMD: on the Zen 5 EPYC VM, prefetcht2 left the loads waiting (from DRAM, one thread:
 *   the CPU default model's fp32 layer 13-18% slower, Llama-3-8B's bf16 one 4%; docs/benchmarks/host-prefetch.md). */
#define HA_PREFETCH_HINT_L2 1
#define HA_PREFETCH_HINT_L1 3
#ifndef HA_PREFETCH_HINT_INT8
#define HA_PREFETCH_HINT_INT8 3 /* int8 homes: T0, into L1 (prefetcht2 measured 3-9% slower in the same runs) */
#endif

#if defined(__FLT16_MAX__) && !defined(HEADINFER_NO_FLOAT16)
#define HA_HAS_FLOAT16 1
typedef _Float16 vhf __attribute__((vector_size(W * 2), aligned(2)));
#endif

typedef float vf __attribute__((vector_size(W * 4)));
typedef float vfu __attribute__((vector_size(W * 4), aligned(4))); /* any float alignment */
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef uint16_t vhu __attribute__((vector_size(W * 2), aligned(2)));
typedef int8_t vbu __attribute__((vector_size(W), aligned(1)));

#define INLINE static inline __attribute__((always_inline))

/* bf16 read in "paired" lane order (head dims a multiple of 2W): one load of 2W elements is W 32-bit lanes, each
 * holding elements 2i (low half) and 2i+1 (high half); ``bits << 16`` is the even elements, ``bits & 0xffff0000``
 * the odd ones, each exactly as fp32: one integer operation per W elements, where widening in order costs a
 * shuffle and a shift. The task permutes its queries into that order and its outputs back (dot products and
 * the value sums are per element: only where each element sits in the registers changes). */
#define HA_BF16_PAIRED 5
typedef uint32_t vuu __attribute__((vector_size(W * 4), aligned(4)));

INLINE int element_size(const int dtype) {
    return dtype == HA_FP32 ? 4 : (dtype == HA_BF16 || dtype == HA_FP16 || dtype == HA_BF16_PAIRED) ? 2 : 1;
}

/* W consecutive elements at p, widened to fp32 (int8: the codes; their scale is applied to the score, and folded
 * into the probability, once per token instead of once per element). Intrinsics where GCC's generic
 * conversions split a 512-bit widening into 256-bit halves (measured 3x slower). */
INLINE vf load(const char *p, const int dtype) {
    if (dtype == HA_FP32) return *(const vfu *)p;
#if defined(HA_VARIANT_AVX512)
    if (dtype == HA_BF16) return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
    if (dtype == HA_FP16) return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(HA_VARIANT_AVX2)
    if (dtype == HA_BF16) return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    if (dtype == HA_FP16) return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    if (dtype == HA_BF16) { /* bf16 is the top half of an fp32: exact */
        const vu bits = __builtin_convertvector(*(const vhu *)p, vu) << 16;
        return (vf)bits;
    }
    if (dtype == HA_FP16) {
#ifdef HA_HAS_FLOAT16
        return __builtin_convertvector(*(const vhf *)p, vf);
#else
        vf out;
        for (int i = 0; i < W; i++) out[i] = hc_half_bits_to_float(((const uint16_t *)p)[i]);
        return out;
#endif
    }
    return __builtin_convertvector(*(const vbu *)p, vf); /* HA_INT8 */
#endif
}

/* Elements [d, d + 2W) of a head's row at ``base`` in the kernel's lane order (d a multiple of 2W): two vectors. */
INLINE void load_pair(const char *base, const int d, const int dtype, vf *low, vf *high) {
    if (dtype == HA_BF16_PAIRED) {
        const vu bits = *(const vuu *)(base + d * 2);
        *low = (vf)(bits << 16);
        *high = (vf)(bits & 0xffff0000u);
    } else {
        *low = load(base + d * element_size(dtype), dtype);
        *high = load(base + (d + W) * element_size(dtype), dtype);
    }
}

/* x[i] = sum of part[i]'s lanes, for W parts: log2(W) levels of pairwise folds. */
INLINE vf fold(vf x, vf y) {
#if W == 16
    const vi even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const vi odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
#elif W == 8
    const vi even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
#else
    const vi even = {0, 2, 4, 6}, odd = {1, 3, 5, 7};
#endif
    return __builtin_shuffle(x, y, even) + __builtin_shuffle(x, y, odd);
}

INLINE vf transpose_sum(vf *part) {
    for (int n = W; n > 1; n /= 2)
        for (int i = 0; i < n / 2; i++) part[i] = fold(part[2 * i], part[2 * i + 1]);
    return part[0];
}

/* The max and the sum of a vector's lanes, by halving swaps (a scalar loop over the lanes is a chain of W
 * dependent operations: it cost as much as a chunk's dot products). */
#if W == 16
#define SWAPS {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}, {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}, \
              {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}, {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}
#elif W == 8
#define SWAPS {4, 5, 6, 7, 0, 1, 2, 3}, {2, 3, 0, 1, 6, 7, 4, 5}, {1, 0, 3, 2, 5, 4, 7, 6}
#else
#define SWAPS {2, 3, 0, 1}, {1, 0, 3, 2}
#endif

INLINE vf vmax(vf x, vf y) {
#if defined(HA_VARIANT_AVX512)
    return (vf)_mm512_max_ps((__m512)x, (__m512)y);
#elif defined(HA_VARIANT_AVX2)
    return (vf)_mm256_max_ps((__m256)x, (__m256)y);
#else
    const vi greater = x > y;
    return (vf)(((vi)x & greater) | ((vi)y & ~greater));
#endif
}

INLINE float hmax(vf x) {
    const vi swaps[] = {SWAPS};
    for (unsigned i = 0; i < sizeof(swaps) / sizeof(swaps[0]); i++) x = vmax(x, __builtin_shuffle(x, swaps[i]));
    return x[0];
}

INLINE float hsum(vf x) {
    const vi swaps[] = {SWAPS};
    for (unsigned i = 0; i < sizeof(swaps) / sizeof(swaps[0]); i++) x += __builtin_shuffle(x, swaps[i]);
    return x[0];
}

/* e^x for x <= 0 (Cephes expf: range reduction by ln 2, a degree-6 polynomial); 0 below -87. */
INLINE vf vexp(vf x) {
    const vi under = x < -87.0f;
    x = (vf)(((vi)x & ~under) | ((vi)((vf){0} - 87.0f) & under));
    const vf t = x * 1.44269504088896341f + 12582912.0f; /* + 1.5 * 2^23: rounds to the nearest integer */
    const vf n = t - 12582912.0f;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vf y = p * (r * r) + r + 1.0f;
    const vi two_n = (__builtin_convertvector(n, vi) + 127) << 23;
    return (vf)((vi)(y * (vf)two_n) & ~under);
}

/* Where one head's rows of a chunk read and write. */
typedef struct {
    const char *keys, *values;          /* this head's key (value) of the chunk's first token */
    const float *key_scales, *value_scales; /* int8: [CH] this head's scales of the chunk's tokens, in order */
    long token_bytes;                   /* from one token to the next */
    long ahead;                         /* tokens of the task's tile from the chunk's first on: what may be
                                           prefetched (past the tile another thread may be writing) */
    int distance;                       /* tokens ahead that are requested (HA_PREFETCH_BYTES) */
    int l1;                             /* bf16/fp16/fp32: requested into L1 (else L2) */
    const float *query;                 /* [R, D] this head's folded rows, in the kernel's lane order */
    const uint16_t *raw;                /* [R, D] the same rows as bf16 bits, unscaled, in element order; or NULL */
    float raw_scale;                    /* scores = (raw . k) * raw_scale */
    float *m, *l, *acc;                 /* [R], [R], [R, D] this head's running state */
    int dim;
    const float *kt;                    /* [128][CH] the chunk's keys transposed (fp32 prefill blocks), or NULL */
} head_view;

/* One line requested with its dtype's hint (the hint must be a constant: dtype is one after inlining, and the
 * level is a branch that goes the same way through a whole call). */
INLINE void prefetch_line_hinted(const char *line, const int dtype, const int l1) {
    if (dtype == HA_INT8) __builtin_prefetch(line, 0, HA_PREFETCH_HINT_INT8);
    else if (l1) __builtin_prefetch(line, 0, HA_PREFETCH_HINT_L1);
    else __builtin_prefetch(line, 0, HA_PREFETCH_HINT_L2);
}

/* Requests the lines of this head's key (``row`` = hv->keys) or value (hv->values) of ``token`` (chunk-relative)
 * if it lies in the tile. Spread over the loops, a few lines per token, instead of a chunk's lines at once: a burst
 * of hundreds of requests fills the core's line-fill buffers and stalls the loads the arithmetic waits for
 * (measured: a 1K-token layer held in L3 ran 30% slower with the burst). Keys are requested in the score pass,
 * values in the value pass, each pass's own stream: requesting both in the score pass left memory idle during
 * the value pass and asked for the chunk's bytes in ~60% of its time (int8 from DRAM: ~8% slower). */
INLINE void prefetch_row(const char *row, const head_view *hv, long token, const int dtype) {
    if (token >= hv->ahead) return;
    const long bytes = (long)hv->dim * element_size(dtype);
    for (long offset = 0; offset < bytes; offset += 64)
        prefetch_line_hinted(row + token * hv->token_bytes + offset, dtype, hv->l1);
#if !HA_SPLIT_PREFETCH
    for (long offset = 0; offset < bytes; offset += 64)
        prefetch_line_hinted(hv->values + token * hv->token_bytes + offset, dtype, hv->l1);
#endif
}

/* Rows [r0, r0 + NR) of one head: outputs [d0, d0 + DV * W) += probabilities s times the chunk's values (int8:
 * s already holds probability times the value's scale). */
INLINE void value_slice(const head_view *hv, float s[][CH], int r0, const int NR, const int DV, int d0, int n,
                        const int dtype) {
    const int prefetch = HA_SPLIT_PREFETCH && r0 == 0 && d0 == 0; /* one pass over the tokens requests */
    const int D = hv->dim;
    vf o[RB_MAX][ACC_VECTORS];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < DV; v++) o[r][v] = *(const vfu *)(hv->acc + (long)(r0 + r) * D + d0 + v * W);
    for (int j = 0; j < n; j++) {
        vf value[ACC_VECTORS];
        if (prefetch) prefetch_row(hv->values, hv, j + hv->distance, dtype);
        const char *row = hv->values + j * hv->token_bytes;
        if (DV % 2 == 0)
            for (int v = 0; v < DV; v += 2) load_pair(row, d0 + v * W, dtype, &value[v], &value[v + 1]);
        else
            for (int v = 0; v < DV; v++) value[v] = load(row + (d0 + v * W) * element_size(dtype), dtype);
        for (int r = 0; r < NR; r++) {
            const float p = s[r][j];
            for (int v = 0; v < DV; v++) o[r][v] += p * value[v];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < DV; v++) *(vfu *)(hv->acc + (long)(r0 + r) * D + d0 + v * W) = o[r][v];
}

#if defined(HA_VARIANT_AVX512)
/* The transpose tree's first two levels on part[0 .. 4 * quads), with in-lane shuffles (one cycle each,
 * non-destructive: vpermt2ps overwrites an input, so GCC's fold() costs a copy per level too): level 1 leaves, per
 * 128-bit lane, two partials of each of two vectors; level 2, z[k], one partial of each of part[4k .. 4k + 3] (in
 * elements 0..3 of every 128-bit lane). */
INLINE void fold_in_lanes(const __m512 *part, const int quads, __m512 *z) {
    __m512 x[8];
    for (int j = 0; j < 2 * quads; j++)
        x[j] = _mm512_add_ps(_mm512_unpacklo_ps(part[2 * j], part[2 * j + 1]),
                             _mm512_unpackhi_ps(part[2 * j], part[2 * j + 1]));
    for (int k = 0; k < quads; k++)
        z[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
}

/* The 16 lane sums of part[0..15], lane i = sum of part[i]'s lanes: fold_in_lanes, then levels 3-4 add the
 * 128-bit lanes, vector k landing in 128-bit lane k. */
INLINE __m512 sum16(const __m512 *part) {
    __m512 z[4], w[2];
    fold_in_lanes(part, 4, z);
    for (int k = 0; k < 2; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * k], z[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(z[2 * k], z[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Keys t0..t0 + 3 of the chunk (past n the last one again: masked later); the first row block also requests the
 * lines of the keys ``distance`` tokens ahead. */
INLINE void four_keys(const head_view *hv, int r0, int t0, int n, const int dtype, const char *key[4]) {
    if (r0 == 0)
        for (int t = 0; t < 4; t++) prefetch_row(hv->keys, hv, t0 + t + hv->distance, dtype);
    for (int t = 0; t < 4; t++) key[t] = hv->keys + (t0 + t < n ? t0 + t : n - 1) * hv->token_bytes;
}

/* Rows 0-3's scores of tokens t0..t0 + 3 from sum16's vector (128-bit lane r: row r). */
INLINE void store_scores(float s[][CH], int t0, const __m512 sums) {
    _mm_store_ps(s[0] + t0, _mm512_castps512_ps128(sums));
    _mm_store_ps(s[1] + t0, _mm512_extractf32x4_ps(sums, 1));
    _mm_store_ps(s[2] + t0, _mm512_extractf32x4_ps(sums, 2));
    _mm_store_ps(s[3] + t0, _mm512_extractf32x4_ps(sums, 3));
}

/* Rows 4-5's scores of tokens t0..t0 + 3 from part[0..7] (row 4's four keys, then row 5's): sum16's first two
 * levels on eight vectors, then each row's four 128-bit lanes added. */
INLINE void store_scores_2(float s[][CH], int t0, const __m512 *part) {
    __m512 z[2];
    fold_in_lanes(part, 2, z);
    for (int k = 0; k < 2; k++) { /* z[k]: each 128-bit lane a partial of row 4 + k's four keys */
        const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(z[k]), _mm512_extractf32x8_ps(z[k], 1));
        _mm_store_ps(s[4 + k] + t0, _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1)));
    }
}

/* The score pass of row_block for its common shapes, head dim 128: NR = 4 rows (bf16 pairs or int8 codes) or 6
 * (any dtype load_pair reads: the CPU default model's decode step, one pass over the keys where a 4-row and a
 * 2-row block read them twice). The head dim a constant, so the loop is unrolled and the NR x 4 partial dot products
 * stay in registers (the generic loop, D a variable, spilled them to the stack and reloaded them for the transpose
 * tree: ~1.4x the time of this one); rows 0-3 reduced by sum16, rows 4-5 by store_scores_2. Same products and sums
 * per lane as the generic loop, reduced in another order. */
INLINE void scores_d128(const head_view *hv, float s[][CH], int r0, int n, const int dtype, const int NR) {
    const float *query = hv->query + r0 * 128;
    for (int t0 = 0; t0 < n; t0 += 4) {
        const char *key[4];
        four_keys(hv, r0, t0, n, dtype, key);
        __m512 part[4 * RB_MAX];
        for (int i = 0; i < 4 * NR; i++) part[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int d = 0; d < 128; d += 32) {
            vf k[4], k2[4];
            for (int t = 0; t < 4; t++) load_pair(key[t], d, dtype, &k[t], &k2[t]);
            for (int r = 0; r < NR; r++) {
                const __m512 q = _mm512_loadu_ps(query + r * 128 + d), q2 = _mm512_loadu_ps(query + r * 128 + d + 16);
                for (int t = 0; t < 4; t++) {
                    part[r * 4 + t] = _mm512_fmadd_ps(q, (__m512)k[t], part[r * 4 + t]);
                    part[r * 4 + t] = _mm512_fmadd_ps(q2, (__m512)k2[t], part[r * 4 + t]);
                }
            }
        }
        store_scores(s, t0, sum16(part));
        if (NR == 6) store_scores_2(s, t0, part + 16);
    }
}

#ifndef HA_KEYS_TRANSPOSED
#define HA_KEYS_TRANSPOSED 1
#endif
#define KT_ROWS 16 /* rows of a head from which a chunk's keys are transposed once for all its 4-row blocks */

/* r[i][j] -> r[j][i] for a 16 x 16 block of floats: unpacks, then 128-bit lane shuffles (64 operations for 256
 * elements, where a scalar copy moved one element a load and a store). */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = (__m512)_mm512_unpacklo_pd((__m512d)t[4 * i], (__m512d)t[4 * i + 2]);
        u[4 * i + 1] = (__m512)_mm512_unpackhi_pd((__m512d)t[4 * i], (__m512d)t[4 * i + 2]);
        u[4 * i + 2] = (__m512)_mm512_unpacklo_pd((__m512d)t[4 * i + 1], (__m512d)t[4 * i + 3]);
        u[4 * i + 3] = (__m512)_mm512_unpackhi_pd((__m512d)t[4 * i + 1], (__m512d)t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}

/* The chunk's keys of one fp32 head transposed, kt[d][t] (t < n; 0 past it: masked later), so that 4 rows' scores
 * are an outer-product GEMM: per element d of the head dim, the rows' query elements broadcast times the keys'
 * vectors of 16 tokens, 16 accumulators, no transpose-and-add tree (prefill: the tree took a third of the score
 * pass). 16 x 16 blocks by transpose16; the keys 8 KiB ahead are requested as they are read. */
INLINE void transpose_keys(const head_view *hv, int n, float *kt) {
    for (int t0 = 0; t0 < CH; t0 += 16) {
        for (int t = t0; t < t0 + 16 && t < n; t++) prefetch_row(hv->keys, hv, t + hv->distance, HA_FP32);
        for (int d0 = 0; d0 < 128; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = t0 + i < n ? _mm512_loadu_ps((const float *)(hv->keys + (t0 + i) * hv->token_bytes) + d0)
                                  : _mm512_setzero_ps();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_store_ps(kt + (d0 + j) * CH + t0, r[j]);
        }
    }
}

/* Rows r0..r0 + 3's scores of the chunk's keys from kt (transpose_keys): s[r][t] = sum over d of q[r][d] kt[d][t],
 * summed over the head dim in order in each lane. */
INLINE void scores_kt(const head_view *hv, float s[][CH], int r0) {
    const float *query = hv->query + r0 * 128;
    __m512 acc[4][CH / 16];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < CH / 16; v++) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < 128; d++) {
        __m512 k[CH / 16];
        for (int v = 0; v < CH / 16; v++) k[v] = _mm512_load_ps(hv->kt + d * CH + 16 * v);
        for (int r = 0; r < 4; r++) {
            const __m512 q = _mm512_set1_ps(query[r * 128 + d]);
            for (int v = 0; v < CH / 16; v++) acc[r][v] = _mm512_fmadd_ps(q, k[v], acc[r][v]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < CH / 16; v++) _mm512_store_ps(s[r] + 16 * v, acc[r][v]);
}
#endif

#if defined(HA_VARIANT_AVX512) && defined(HA_BF16_DOT)
/* scores_d128 for bf16 homes whose queries are bf16 values too (a bf16 model's): vdpbf16ps multiplies 32 bf16
 * pairs into 16 fp32 lanes, key and query read as stored, no widening. A product of two bf16 values is exact in
 * fp32 and each is added in fp32, as the widened path's FMAs do, so the scores differ from that path's only by
 * the order of the sums (and the instruction's flushing of subnormals, below 1e-38); the scale is applied to the
 * sums instead of the queries. On an EPYC (Zen 5) core from L2: 2.6 ns a token and KV head against 9.0 for
 * scores_d128's widenings and FMAs (4 rows, head dim 128). */
INLINE void scores_d128_dot(const head_view *hv, float s[][CH], int r0, int n) {
    const uint16_t *query = hv->raw + r0 * 128;
    __m512bh q[4][4]; /* [row][32 elements of the head dim] */
    for (int r = 0; r < 4; r++)
        for (int d = 0; d < 4; d++) q[r][d] = (__m512bh)_mm512_loadu_si512((const void *)(query + r * 128 + d * 32));
    const __m512 scale = _mm512_set1_ps(hv->raw_scale);
    for (int t0 = 0; t0 < n; t0 += 4) {
        const char *key[4];
        four_keys(hv, r0, t0, n, HA_BF16_PAIRED, key);
        __m512 part[16];
        for (int i = 0; i < 16; i++) part[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int d = 0; d < 4; d++) {
            __m512bh k[4];
            for (int t = 0; t < 4; t++) k[t] = (__m512bh)_mm512_loadu_si512((const void *)(key[t] + d * 64));
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 4; t++) part[r * 4 + t] = _mm512_dpbf16_ps(part[r * 4 + t], q[r][d], k[t]);
        }
        store_scores(s, t0, _mm512_mul_ps(sum16(part), scale));
    }
}
#endif

/* Rows [r0, r0 + NR) of one head over the chunk's n tokens (first at position ``first``). */
INLINE void row_block(const head_view *hv, const ha_call *c, int r0, const int NR, int n, long first,
                      int is_plain, const int dtype) {
    const int D = hv->dim; /* a constant where run_chunk is specialised (128) */
    float s[RB_MAX][CH] __attribute__((aligned(64)));
    /* scores: TB keys x NR rows at a time; past n the last token is read again and masked below */
#if defined(HA_VARIANT_AVX512) && defined(HA_BF16_DOT)
    if (NR == 4 && D == 128 && dtype == HA_BF16_PAIRED && hv->raw != NULL) {
        scores_d128_dot(hv, s, r0, n);
        goto softmax;
    }
#endif
#if defined(HA_VARIANT_AVX512)
    if (NR == 4 && hv->kt != NULL) {
        scores_kt(hv, s, r0);
        goto softmax;
    }
    if (D == 128 && (NR == 6 || (NR == 4 && (dtype == HA_BF16_PAIRED || dtype == HA_INT8)))) {
        scores_d128(hv, s, r0, n, dtype, NR);
        goto softmax;
    }
#endif
    if (NR > RB) __builtin_unreachable(); /* 6-row blocks are scored above: run_chunk makes them only there */
    for (int t0 = 0; t0 < n; t0 += TB) {
        if (r0 == 0)
            for (int t = 0; t < TB; t++) prefetch_row(hv->keys, hv, t0 + t + hv->distance, dtype);
        vf part[W];
        for (int i = 0; i < W; i++) part[i] = (vf){0};
        const char *key[TB];
        for (int t = 0; t < TB; t++) key[t] = hv->keys + (t0 + t < n ? t0 + t : n - 1) * hv->token_bytes;
        int d = 0;
        for (; d + 2 * W <= D; d += 2 * W) { /* two vectors of the head dim per step: bf16 pairs share a load */
            vf k[TB], k2[TB];
            for (int t = 0; t < TB; t++) load_pair(key[t], d, dtype, &k[t], &k2[t]);
            for (int r = 0; r < NR; r++) {
                const vf q = *(const vfu *)(hv->query + (r0 + r) * D + d);
                const vf q2 = *(const vfu *)(hv->query + (r0 + r) * D + d + W);
                for (int t = 0; t < TB; t++) { /* two statements: two fused multiply-adds, not mul, fma, add */
                    part[r * TB + t] += q * k[t];
                    part[r * TB + t] += q2 * k2[t];
                }
            }
        }
        for (; d < D; d += W) { /* a head dim of an odd number of vectors (never in paired order) */
            vf k[TB];
            for (int t = 0; t < TB; t++) k[t] = load(key[t] + d * element_size(dtype), dtype);
            for (int r = 0; r < NR; r++) {
                const vf q = *(const vfu *)(hv->query + (r0 + r) * D + d);
                for (int t = 0; t < TB; t++) part[r * TB + t] += q * k[t];
            }
        }
        const vf sums = transpose_sum(part);
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < TB; t++) s[r][t0 + t] = sums[r * TB + t];
    }
#if defined(HA_VARIANT_AVX512)
softmax:;
#endif
    /* masks, softcap, online softmax: s becomes the probabilities (0 where hidden) */
    const long past = c->stop - c->q_len;
    for (int r = 0; r < NR; r++) {
        float *row = s[r];
        if (dtype == HA_INT8) /* the keys' scales, a vector at a time (past n: masked below) */
            for (int j = 0; j < CH; j += W) *(vf *)(row + j) *= *(const vfu *)(hv->key_scales + j);
        if (is_plain) {
            for (int j = n; j < CH; j++) row[j] = -INFINITY;
        } else {
            const long q_pos = past + (r0 + r) % c->q_len;
            for (int j = 0; j < CH; j++) {
                const long pos = first + j;
                if (j >= n || pos > q_pos || (c->window > 0 && pos <= q_pos - c->window)) row[j] = -INFINITY;
                else if (c->softcap > 0.0f) row[j] = c->softcap * tanhf(row[j]);
            }
        }
        vf most = *(const vfu *)row;
        for (int j = W; j < CH; j += W) most = vmax(most, *(const vfu *)(row + j));
        const float top = hmax(most);
        float *m = hv->m + r0 + r, *l = hv->l + r0 + r, *acc = hv->acc + (long)(r0 + r) * D;
        if (top == -INFINITY) { /* nothing visible: its probabilities are 0 (exp(-inf - -inf) would be NaN) */
            memset(row, 0, sizeof(float) * CH);
            continue;
        }
        if (top > *m) {
            const float rescale = expf(*m - top); /* 0 while m is still -inf */
            *l *= rescale;
            for (int d = 0; d < D; d += W) *(vfu *)(acc + d) *= rescale;
            *m = top;
        }
        vf total = {0};
        for (int j = 0; j < CH; j += W) {
            vf p = vexp(*(vfu *)(row + j) - *m);
            total += p;
            if (dtype == HA_INT8) p *= *(const vfu *)(hv->value_scales + j); /* folded into the value pass */
            *(vfu *)(row + j) = p;
        }
        *l += hsum(total);
    }
    /* values: the rows' outputs in registers, DV vectors of the head dim at a time */
    /* NR is 6 (24 accumulators + 4 values: two slices; 4 slices of 2 were 14% slower on one thread), 4, 2 or 1 */
    const int DV = NR == 6 ? 4 : ACC_VECTORS / NR;
    int d0 = 0;
    for (; d0 + DV * W <= D; d0 += DV * W) value_slice(hv, s, r0, NR, DV, d0, n, dtype);
    for (; d0 + 2 * W <= D; d0 += 2 * W) value_slice(hv, s, r0, NR, 2, d0, n, dtype); /* small head dims */
    for (; d0 < D; d0 += W) value_slice(hv, s, r0, NR, 1, d0, n, dtype);
}

/* Every head and row block of one chunk of n tokens at ``chunk`` (token_bytes apart; int8: scales per token
 * ``scale_stride`` floats apart from ``scales``); ``ahead``: tokens of the tile from the chunk's first on. */
INLINE void run_chunk(const ha_job *job, const char *chunk, long token_bytes, const float *scales, long scale_stride,
                      int n, long first, long ahead, int is_plain, const float *query, const uint16_t *raw,
                      float *m, float *l, float *acc, const int dtype, const int D) {
    const ha_call *c = job->call;
    const int g = c->group, rows = job->rows, es = element_size(dtype);
    float key_scales[CH] __attribute__((aligned(64))), value_scales[CH] __attribute__((aligned(64)));
    const int distance = HA_PREFETCH_BYTES / (2 * D * es) > 4 ? HA_PREFETCH_BYTES / (2 * D * es) : 4;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < g; h++) {
            const long head = (long)b * g + h;
            if (dtype == HA_INT8) { /* this head's scales in order, so that the tile applies a vector at a time */
                const float *ks = scales + (long)(b * 2) * g + h, *vs = scales + (long)(b * 2 + 1) * g + h;
                int j = 0;
#if defined(HA_VARIANT_AVX512)
                if (scale_stride == 2) { /* one head (B = g = 1): key and value scales alternate; de-interleaved
                                            16 at a time (a scalar copy per scale was ~5% of an int8 call) */
                    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
                    for (; j + 16 <= n; j += 16) {
                        const __m512 low = _mm512_loadu_ps(ks + 2 * j), high = _mm512_loadu_ps(ks + 2 * j + 16);
                        _mm512_store_ps(key_scales + j, _mm512_permutex2var_ps(low, even, high));
                        _mm512_store_ps(value_scales + j, _mm512_permutex2var_ps(low, odd, high));
                    }
                }
#endif
                for (; j < n; j++) {
                    key_scales[j] = ks[j * scale_stride];
                    value_scales[j] = vs[j * scale_stride];
                }
                for (int j = n; j < CH; j++) key_scales[j] = value_scales[j] = 0.0f;
            }
            head_view hv = {chunk + ((long)(b * 2) * g + h) * D * es, chunk + ((long)(b * 2 + 1) * g + h) * D * es,
                            key_scales, value_scales, token_bytes, ahead, distance, job->prefetch_l1,
                            query + head * rows * D,
                            raw == NULL ? NULL : raw + head * rows * D, job->raw_scale,
                            m + head * rows, l + head * rows, acc + head * rows * D, D, NULL};
            int r0 = 0;
#if defined(HA_VARIANT_AVX512)
            float kt[128 * CH] __attribute__((aligned(64)));
            if (HA_KEYS_TRANSPOSED && dtype == HA_FP32 && D == 128 && rows >= KT_ROWS) {
                transpose_keys(&hv, n, kt);
                hv.kt = kt;
            }
            if (HA_ROWS6 && rows == 6 && D == 128 && !(raw != NULL && dtype == HA_BF16_PAIRED)) {
                row_block(&hv, c, 0, 6, n, first, is_plain, dtype);
                continue;
            }
#endif
            for (; r0 + RB <= rows; r0 += RB) row_block(&hv, c, r0, RB, n, first, is_plain, dtype);
            if (rows - r0 >= 2) {
                row_block(&hv, c, r0, 2, n, first, is_plain, dtype);
                r0 += 2;
            }
            if (rows - r0 == 1) row_block(&hv, c, r0, 1, n, first, is_plain, dtype);
        }
}

/* One instantiation per stored dtype (fp8 chunks are widened into fp32 ones and go through the fp32 one). */
#define DEFINE_CHUNK(NAME, DTYPE)                                                                              \
    __attribute__((noinline)) static void NAME(const ha_job *job, const char *chunk, long token_bytes,         \
                                               const float *scales, long scale_stride, int n, long first,      \
                                               long ahead, int is_plain, const float *query,                   \
                                               const uint16_t *raw, float *m, float *l, float *acc) {          \
        if (job->call->dim == 128) /* the common head dim, a constant: loops unrolled, state in registers */   \
            run_chunk(job, chunk, token_bytes, scales, scale_stride, n, first, ahead, is_plain, query, raw, m, \
                      l, acc, DTYPE, 128);                                                                     \
        else                                                                                                   \
            run_chunk(job, chunk, token_bytes, scales, scale_stride, n, first, ahead, is_plain, query, raw, m, \
                      l, acc, DTYPE, job->call->dim);                                                          \
    }
DEFINE_CHUNK(chunk_fp32, HA_FP32)
DEFINE_CHUNK(chunk_bf16, HA_BF16)
DEFINE_CHUNK(chunk_fp16, HA_FP16)
DEFINE_CHUNK(chunk_int8, HA_INT8)
DEFINE_CHUNK(chunk_bf16_paired, HA_BF16_PAIRED)

typedef void (*chunk_fn)(const ha_job *, const char *, long, const float *, long, int, long, long, int,
                         const float *, const uint16_t *, float *, float *, float *);

/* fp8 e4m3fn codes -> fp32 (exact): a table of the 256 codes. */
static float fp8_table[256];
__attribute__((constructor)) static void fill_fp8_table(void) {
    for (int code = 0; code < 256; code++) {
        const int exponent = (code >> 3) & 15, mantissa = code & 7;
        float value = exponent == 0 ? ldexpf((float)mantissa, -9) : ldexpf(1.0f + mantissa / 8.0f, exponent - 7);
        if (exponent == 15 && mantissa == 7) value = NAN;
        fp8_table[code] = code & 128 ? -value : value;
    }
}

/* Paired lane order (HA_BF16_PAIRED) of rows of D floats: within each block of 2W, the even elements, then the
 * odd ones (``to_pairs``), and back. */
static void to_pairs(const float *in, float *out, long rows, int D) {
    for (long r = 0; r < rows; r++)
        for (int block = 0; block < D; block += 2 * W)
            for (int i = 0; i < W; i++) {
                out[r * D + block + i] = in[r * D + block + 2 * i];
                out[r * D + block + W + i] = in[r * D + block + 2 * i + 1];
            }
}

static void from_pairs(float *rows_data, long rows, int D) {
    float row[256];
    for (long r = 0; r < rows; r++) {
        float *data = rows_data + r * D;
        for (int block = 0; block < D; block += 2 * W)
            for (int i = 0; i < W; i++) {
                row[block + 2 * i] = data[block + i];
                row[block + 2 * i + 1] = data[block + W + i];
            }
        memcpy(data, row, sizeof(float) * D);
    }
}

/* This thread's scratch of at least ``floats`` (fp8 chunks, queries in paired order), reused across calls. */
static float *scratch(float **buffer, long *size, long floats) {
    if (*size < floats) {
        free(*buffer);
        *buffer = malloc(sizeof(float) * floats);
        *size = *buffer == NULL ? 0 : floats;
    }
    return *buffer;
}

int TASK(const ha_job *job, long index) {
    const ha_call *c = job->call;
    const int D = c->dim;
    if (c->kv_dtype < 0 || c->kv_dtype > HA_FP8 || D % W != 0 || D > 256) return -1;
    /* bf16 in paired order where the head dim holds whole pairs of vectors (D = 16 on AVX-512 does not) */
    const int dtype = c->kv_dtype == HA_BF16 && D % (2 * W) == 0 ? HA_BF16_PAIRED : c->kv_dtype;
    const int group_index = (int)(index / job->tiles_per_group);
    const long first = c->start + (index % job->tiles_per_group) * job->tile_tokens;
    const long last = first + job->tile_tokens < c->stop ? first + job->tile_tokens : c->stop;
    const long heads_rows = (long)c->batch * c->group * job->rows;
    float *m = job->m + index * heads_rows, *l = job->l + index * heads_rows;
    float *acc = job->acc + index * heads_rows * D;
    for (long i = 0; i < heads_rows; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    memset(acc, 0, sizeof(float) * heads_rows * D);
    const char *home = c->kv[group_index];
    const float *scales = c->scales ? c->scales[group_index] : NULL;
    const float *query = job->folded + group_index * heads_rows * D;
    /* the bf16 queries (the dot-product scores) only where this path computes them: bf16 homes in paired order */
    const uint16_t *raw = job->raw != NULL && dtype == HA_BF16_PAIRED ? job->raw + group_index * heads_rows * D : NULL;
#if defined(HA_BF16_DOT)
    if (raw != NULL && job->rows >= RB) __atomic_fetch_add(&ha_bf16_dot_tasks, 1, __ATOMIC_RELAXED);
#else
    raw = NULL;
#endif
    if (job->prefetch_l1 && dtype != HA_INT8 && dtype != HA_FP8)
        __atomic_fetch_add(&ha_l1_prefetch_tasks, 1, __ATOMIC_RELAXED);
    const chunk_fn chunk_of[] = {chunk_fp32, chunk_bf16, chunk_fp16, chunk_int8, chunk_fp32, chunk_bf16_paired};
    const chunk_fn run = chunk_of[dtype];
    const long token_bytes = job->token_bytes, scale_stride = (long)c->batch * 2 * c->group;
    const long past = c->stop - c->q_len;
    static __thread float *widened = NULL, *paired = NULL; /* this thread's fp8 chunk, paired queries */
    static __thread long widened_floats = 0, paired_floats = 0;
    if (dtype == HA_FP8 && scratch(&widened, &widened_floats, CH * scale_stride * D) == NULL) return -2;
    if (dtype == HA_BF16_PAIRED) {
        if (scratch(&paired, &paired_floats, heads_rows * D) == NULL) return -2;
        to_pairs(query, paired, heads_rows, D);
        query = paired;
    }
    for (long t = first; t < last; t += CH) {
        const int n = last - t < CH ? (int)(last - t) : CH;
        /* every row sees every key of the chunk: the newest is at most the first query's position, the oldest
           inside the last query's window */
        const int is_plain = c->softcap <= 0.0f && t + n - 1 <= past &&
                             (c->window <= 0 || t > past + c->q_len - 1 - c->window);
        const char *chunk = home + t * token_bytes;
        if (dtype == HA_FP8) {
            const uint8_t *codes = (const uint8_t *)chunk;
            const float *scale = scales + t * scale_stride;
            for (long i = 0; i < n * scale_stride; i++)
                for (int d = 0; d < D; d++) widened[i * D + d] = fp8_table[codes[i * D + d]] * scale[i];
            run(job, (const char *)widened, scale_stride * D * 4, NULL, 0, n, t, 0, is_plain, query, NULL, m, l,
                acc);
        } else {
            run(job, chunk, token_bytes, dtype == HA_INT8 ? scales + t * scale_stride : NULL, scale_stride, n, t,
                last - t, is_plain, query, raw, m, l, acc);
        }
    }
    if (dtype == HA_BF16_PAIRED) from_pairs(acc, heads_rows, D);
    return 0;
}

/* The plain read the benchmark compares the kernel with: the sum of ``bytes`` of floats (a multiple of 4 * W * 4),
 * four vectors at a time, on this thread. */
float TASK_READ(const char *data, long bytes) {
    vf sum[4] = {{0}, {0}, {0}, {0}};
    for (long offset = 0; offset + 4 * W * 4 <= bytes; offset += 4 * W * 4)
        for (int i = 0; i < 4; i++) sum[i] += *(const vfu *)(data + offset + i * W * 4);
    const vf total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    float out = 0.0f;
    for (int i = 0; i < W; i++) out += total[i];
    return out;
}

/* One tile of host attention (see host_attention.py): the partial softmax of one head group's query rows over
 * tokens [first, first + n) of its token-major home [capacity, B, 2, g, D], read once in its stored dtype.
 *
 * Blocks of 16 tokens, in order (the block after next is prefetched); per (batch row, KV head) of a block: its
 * keys and values widened to fp32 into buffers that stay in L1; per query row, 16 dot products (lanes over
 * channels, then one transpose-and-add that turns 16 partial vectors into a vector of 16 scores), the masks,
 * softcap and an online softmax in fp32 (running max m, sum l, kept per head and row in the caller's buffers),
 * then the block's values accumulated into the row's unnormalised output. Rows are
 * (repeat, query) pairs: row r is query r % q_len, at position past + r % q_len; it sees key j iff
 * j <= its position and, with a window W > 0, j > its position - W. With softcap C > 0 a score s becomes
 * C * tanh(s) (the queries arrive pre-scaled and pre-divided by C). Head dims 16, 32, 64, 128, 256.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define PREFETCH_AHEAD 2  /* blocks */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  /* the caller's memory: any float alignment */
typedef int32_t i16v __attribute__((vector_size(64)));
#ifndef HEADINFER_NO_LIBMVEC
/* glibc's libmvec has a vector expf (<= 4 ulp, like any libm): declaring it lets a block's 16 exponentials run
 * as one call. Where it is missing (not glibc x86-64) the build is retried without it (scalar expf). */
float expf(float) __attribute__((__simd__("notinbranch")));
#endif

enum { FP32 = 0, BF16 = 1, FP16 = 2 };

/* _Float16 exists from GCC 12 (x86) and clang 15 on; where it is missing (Ubuntu 22.04's GCC 11) fp16 is widened
 * with integer bit operations instead, exactly (normals, subnormals, infinities and NaNs).
 * HEADINFER_NO_FLOAT16 forces that path (native.py's fallback variants, and the tests). */
#if defined(__FLT16_MAX__) && !defined(HEADINFER_NO_FLOAT16)
#define HEADINFER_HAS_FLOAT16 1
#else
static inline float half_bits_to_float(uint16_t half) {
    union { uint32_t u; float f; } out = { (uint32_t)(half & 0x7fff) << 13 };  /* exponent and mantissa */
    const uint32_t exponent = out.u & 0x0f800000u;
    out.u += (uint32_t)(127 - 15) << 23;  /* rebias the exponent */
    if (exponent == 0x0f800000u) {
        out.u += (uint32_t)(128 - 16) << 23;  /* infinity or NaN: the largest exponent */
    } else if (exponent == 0) {  /* zero or subnormal: renormalise through an fp32 subtraction (exact) */
        const union { uint32_t u; float f; } magic = { (uint32_t)113 << 23 };
        out.u += 1u << 23;
        out.f -= magic.f;
    }
    out.u |= (uint32_t)(half & 0x8000) << 16;  /* the sign */
    return out.f;
}
#endif

static inline void widen(const char *src, int dtype, int dim, float *out) {
    if (dtype == FP32) {
        memcpy(out, src, (size_t)dim * sizeof(float));
    } else if (dtype == BF16) {  /* bf16 is the top half of an fp32: exact */
        const uint16_t *s = (const uint16_t *)src;
#pragma omp simd
        for (int d = 0; d < dim; d++) {
            union { uint32_t u; float f; } bits = { (uint32_t)s[d] << 16 };
            out[d] = bits.f;
        }
    } else {
#ifdef HEADINFER_HAS_FLOAT16
        const _Float16 *h = (const _Float16 *)src;
#pragma omp simd
        for (int d = 0; d < dim; d++) out[d] = (float)h[d];
#else
        const uint16_t *h = (const uint16_t *)src;
#pragma omp simd
        for (int d = 0; d < dim; d++) out[d] = half_bits_to_float(h[d]);
#endif
    }
}

static inline v16 fold(v16 x, v16 y, i16v lo, i16v hi) {
    return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}

/* part[0..15] -> one vector whose lane j is the sum of part[j]'s lanes (a transpose-and-add tree). */
static inline v16 transpose_sum(const v16 *part) {
    const i16v a_lo = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const i16v a_hi = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const i16v b_lo = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const i16v b_hi = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const i16v c_lo = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const i16v c_hi = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const i16v d_lo = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const i16v d_hi = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    v16 z[8], w[4], u[2];
    for (int i = 0; i < 8; i++) z[i] = fold(part[2 * i], part[2 * i + 1], a_lo, a_hi);
    for (int i = 0; i < 4; i++) w[i] = fold(z[2 * i], z[2 * i + 1], b_lo, b_hi);
    for (int i = 0; i < 2; i++) u[i] = fold(w[2 * i], w[2 * i + 1], c_lo, c_hi);
    return fold(u[0], u[1], d_lo, d_hi);
}

/* Scores of one row over the block -> probabilities, updating the row's (m, l) and rescaling its output. */
static inline v16 softmax_block(v16 scores, int is_plain, int count, long first, long q_pos, long window,
                                float softcap, float *m, float *l, v16u *acc, int chunks) {
    float s[LANES] __attribute__((aligned(64)));
    *(v16 *)s = scores;
    float top = *m;
    if (is_plain) {  /* a full block every row sees, no softcap: the decode case */
#pragma omp simd reduction(max : top)
        for (int j = 0; j < LANES; j++) top = s[j] > top ? s[j] : top;
    } else {
        for (int j = 0; j < LANES; j++) {
            const long pos = first + j;
            if (j >= count || pos > q_pos || (window > 0 && pos <= q_pos - window)) s[j] = -INFINITY;
            else if (softcap > 0.0f) s[j] = softcap * tanhf(s[j]);
            top = s[j] > top ? s[j] : top;
        }
    }
    if (top == -INFINITY) return (v16){0};  /* nothing visible yet: exp(-inf - -inf) would be NaN */
    if (top > *m) {
        const float scale = expf(*m - top);  /* 0 while m is still -inf */
        *l *= scale;
        for (int c = 0; c < chunks; c++) acc[c] *= scale;
        *m = top;
    }
    float p[LANES] __attribute__((aligned(64)));
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int j = 0; j < LANES; j++) {
        p[j] = expf(s[j] - top);
        total += p[j];
    }
    *l += total;
    return *(v16 *)p;
}

#define DEFINE_TILE(DIM)                                                                                        \
static int tile_##DIM(const char *tile, int dtype, int elem_size, long n, int batch, int group,               \
                      const float *query, int rows, int q_len, long first, long past, long window,            \
                      float softcap, float *m_out, float *l_out, float *acc_out) {                            \
    enum { CHUNKS = DIM / LANES };                                                                              \
    const long token_bytes = (long)batch * 2 * group * DIM * elem_size;                                         \
    const long heads = (long)batch * group;                                                                     \
    v16 keys[LANES * CHUNKS], values[LANES * CHUNKS];                                                          \
    v16 part[LANES];                                                                                            \
    for (long r = 0; r < heads * rows; r++) { m_out[r] = -INFINITY; l_out[r] = 0.0f; }                         \
    memset(acc_out, 0, sizeof(float) * heads * rows * DIM);                                                     \
    for (long t0 = 0; t0 < n; t0 += LANES) {                                                                    \
        const int count = n - t0 < LANES ? (int)(n - t0) : LANES;                                               \
        /* every row sees every key of the block: the newest key is at most the first query's position,       \
           and the oldest is inside the last query's window */                                                 \
        const int is_plain = count == LANES && softcap <= 0.0f && first + t0 + LANES - 1 <= past &&              \
                             (window <= 0 || first + t0 > past + q_len - 1 - window);                            \
        /* Ask for the block after next now: its cache lines arrive while this block computes. */              \
        if (t0 + PREFETCH_AHEAD * LANES < n) {                                                                  \
            const char *ahead = tile + (t0 + PREFETCH_AHEAD * LANES) * token_bytes;                             \
            const long span = (n - t0 - PREFETCH_AHEAD * LANES < LANES ? n - t0 - PREFETCH_AHEAD * LANES : LANES) \
                              * token_bytes;                                                                    \
            for (long offset = 0; offset < span; offset += 64) __builtin_prefetch(ahead + offset, 0, 0);        \
        }                                                                                                       \
        for (long head = 0; head < heads; head++) {                                                             \
            const v16u *q = (const v16u *)(query + head * rows * DIM);                                          \
            const long b = head / group, h = head % group;                                                      \
            const char *first_key = tile + t0 * token_bytes + (b * 2 * group + h) * DIM * elem_size;            \
            for (int j = 0; j < LANES; j++) { /* this head's 16 keys and values, widened into L1 */             \
                v16 *k = keys + j * CHUNKS, *v = values + j * CHUNKS;                                           \
                if (j >= count) {                                                                               \
                    for (int c = 0; c < CHUNKS; c++) k[c] = v[c] = (v16){0};                                    \
                    continue;                                                                                   \
                }                                                                                               \
                widen(first_key + j * token_bytes, dtype, DIM, (float *)k);                                     \
                widen(first_key + j * token_bytes + (long)group * DIM * elem_size, dtype, DIM, (float *)v);     \
            }                                                                                                   \
            float *m = m_out + head * rows, *l = l_out + head * rows;                                           \
            v16u *acc = (v16u *)(acc_out + head * rows * DIM);                                                  \
            for (int r = 0; r < rows; r++) {                                                                    \
                v16 qr[CHUNKS];                                                                                 \
                for (int c = 0; c < CHUNKS; c++) qr[c] = q[r * CHUNKS + c];                                     \
                for (int j = 0; j < LANES; j++) {                                                               \
                    v16 sum = qr[0] * keys[j * CHUNKS];                                                         \
                    for (int c = 1; c < CHUNKS; c++) sum += qr[c] * keys[j * CHUNKS + c];                       \
                    part[j] = sum;                                                                              \
                }                                                                                               \
                v16u *out = acc + r * CHUNKS;                                                                   \
                float p[LANES] __attribute__((aligned(64)));                                                    \
                *(v16 *)p = softmax_block(transpose_sum(part), is_plain, count, first + t0, past + r % q_len,   \
                                          window, softcap, m + r, l + r, out, CHUNKS);                          \
                v16 o[CHUNKS];                                                                                  \
                for (int c = 0; c < CHUNKS; c++) o[c] = out[c];                                                 \
                for (int j = 0; j < count; j++)                                                                 \
                    for (int c = 0; c < CHUNKS; c++) o[c] += p[j] * values[j * CHUNKS + c];                     \
                for (int c = 0; c < CHUNKS; c++) out[c] = o[c];                                                 \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    return 0;                                                                                                   \
}

DEFINE_TILE(16)
DEFINE_TILE(32)
DEFINE_TILE(64)
DEFINE_TILE(128)
DEFINE_TILE(256)

/* Returns 0, or -1 for a head dim without a specialisation (the caller then uses its torch tile). */
int host_attend_tile(const char *tile, int dtype, int elem_size, long n, int batch, int group, int dim,
                     const float *query, int rows, int q_len, long first, long past, long window, float softcap,
                     float *m_out, float *l_out, float *acc_out) {
#define CASE(DIM) case DIM: return tile_##DIM(tile, dtype, elem_size, n, batch, group, query, rows, q_len, first, \
                                              past, window, softcap, m_out, l_out, acc_out);
    switch (dim) { CASE(16) CASE(32) CASE(64) CASE(128) CASE(256) default: return -1; }
#undef CASE
}

/* One tile of host attention (see host_attention.py): the partial softmax of one head group's query rows over
 * tokens [first, first + n) of its token-major home [capacity, B, 2, g, D], read once in its stored dtype.
 *
 * Blocks of 512 tokens, in order; per (batch row, KV head) of a block: its keys widened to fp32 a chunk of 64
 * at a time in L1, one dot product per key and query row, the masks, softcap and an online softmax in fp32
 * (running max m, sum l, kept per head and row in the caller's buffers, rescaled once per block), then its values,
 * widened the same way, accumulated into each row's unnormalised output. Rows are
 * (repeat, query) pairs: row r is query r % q_len, at position past + r % q_len; it sees key j iff
 * j <= its position and, with a window W > 0, j > its position - W. With softcap C > 0 a score s becomes
 * C * tanh(s) (the queries arrive pre-scaled and pre-divided by C). Head dims 16, 32, 64, 128, 256.
 *
 * Plain C loops and 8-float vectors that the compiler maps to the machine's registers (-march=native): an earlier
 * version held 16-float vectors, which on AVX2 (8 floats a register) spilled to the stack at every step and ran at
 * half this speed.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Tokens per chunk: a head's keys (or values) of one chunk, widened to fp32, fill 64 * DIM * 4 bytes of L1
 * (16 KiB at head dim 64). Tokens per softmax block: 512, so that the rescaling of a row's output is paid once per
 * 512 keys; a block of a head fits in L2 between the passes over its keys and its values (smaller blocks were no
 * faster on the development VM). */
#define CHUNK 64
#define BLOCK 512

/* Tokens ahead whose rows (one head's keys or values) are requested while the current one is widened: a head's rows
 * are a stride apart (every head's keys and values of a token lie together), which the hardware prefetcher follows
 * late; asking explicitly doubled the GEMV of int8_gemv.c and helps here the same way. */
#define AHEAD 8

static inline void prefetch_row(const char *row, long bytes, int is_inside) {
    if (!is_inside) return;  /* never ask for lines past the tile: another thread may be writing them */
    for (long offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 0, 0);
}

typedef float v8 __attribute__((vector_size(32)));  /* one AVX register; two SSE ones */
typedef float v8u __attribute__((vector_size(32), aligned(4)));  /* the caller's memory: any float alignment */
typedef int32_t i8v __attribute__((vector_size(32)));

static inline v8 fold(v8 x, v8 y, i8v lo, i8v hi) {
    return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}

/* part[0..7] -> one vector whose lane j is the sum of part[j]'s lanes (a transpose-and-add tree). The tree leaves
 * lanes in the order 0 2 1 3 4 6 5 7, so the parts are taken in that order (the permutation is its own inverse). */
static inline v8 transpose_sum(const v8 *part) {
    const i8v a_lo = {0, 1, 2, 3, 8, 9, 10, 11}, a_hi = {4, 5, 6, 7, 12, 13, 14, 15};
    const i8v b_lo = {0, 1, 8, 9, 4, 5, 12, 13}, b_hi = {2, 3, 10, 11, 6, 7, 14, 15};
    const i8v c_lo = {0, 2, 4, 6, 8, 10, 12, 14}, c_hi = {1, 3, 5, 7, 9, 11, 13, 15};
    const v8 a0 = fold(part[0], part[1], a_lo, a_hi), a1 = fold(part[2], part[3], a_lo, a_hi);
    const v8 a2 = fold(part[4], part[5], a_lo, a_hi), a3 = fold(part[6], part[7], a_lo, a_hi);
    return fold(fold(a0, a1, b_lo, b_hi), fold(a2, a3, b_lo, b_hi), c_lo, c_hi);
}

/* Scores of one query row over the chunk's widened keys [count][dim]: 8 keys at a time, lanes over channels,
 * then one transpose-and-add per 8 keys (a horizontal sum per key would cost as much as its dot product). */
static inline void chunk_scores(const float *q, const float *keys, long stride, int count, int dim, float *s) {
    const int chunks = dim / 8;
    int j = 0;
    for (; j + 8 <= count; j += 8) {
        v8 part[8];
        for (int t = 0; t < 8; t++) {
            const v8u *k = (const v8u *)(keys + (j + t) * stride);
            v8 sum = ((const v8u *)q)[0] * k[0];
            for (int c = 1; c < chunks; c++) sum += ((const v8u *)q)[c] * k[c];
            part[t] = sum;
        }
        const v8 sorted[8] = {part[0], part[2], part[1], part[3], part[4], part[6], part[5], part[7]};
        *(v8u *)(s + j) = transpose_sum(sorted);
    }
    for (; j < count; j++) {
        float sum = 0.0f;
        for (int d = 0; d < dim; d++) sum += q[d] * keys[j * stride + d];
        s[j] = sum;
    }
}

/* One row's scores over a block -> probabilities in place, updating the row's (m, l) and rescaling its output.
 * Returns 0 when the row sees no key of the block (its probabilities are then not used). */
static inline int softmax_block(float *s, int count, int is_plain, long first, long q_pos, long window,
                                float softcap, float *m, float *l, float *acc, int dim) {
    float top = -INFINITY;
    if (is_plain) {  /* every key of the block visible, no softcap: the decode case */
#pragma omp simd reduction(max : top)
        for (int j = 0; j < count; j++) top = s[j] > top ? s[j] : top;
    } else {
        for (int j = 0; j < count; j++) {
            const long pos = first + j;
            if (pos > q_pos || (window > 0 && pos <= q_pos - window)) s[j] = -INFINITY;
            else if (softcap > 0.0f) s[j] = softcap * tanhf(s[j]);
            top = s[j] > top ? s[j] : top;
        }
    }
    if (top == -INFINITY) return 0;  /* nothing visible in this block: exp(-inf - -inf) would be NaN */
    if (top > *m) {
        const float scale = expf(*m - top);  /* 0 while m is still -inf */
        *l *= scale;
#pragma omp simd
        for (int d = 0; d < dim; d++) acc[d] *= scale;
        *m = top;
    }
    const float mx = *m;
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int j = 0; j < count; j++) {
        s[j] = expf(s[j] - mx);
        total += s[j];
    }
    *l += total;
    return 1;
}

/* One head's rows over one chunk of ``size`` tokens (keys or values ``stride`` floats apart): pass 0 takes each
 * row's scores into s[r * BLOCK ...]; pass 1 adds the values, weighted by those probabilities, into each row's
 * output acc[r * dim ...] (rows that see no key of the block skipped). */
static inline void chunk_rows(int pass, const float *src, long stride, int size, int dim, int rows,
                              const float *query, float *s, const char *seen, float *acc_out) {
    for (int r = 0; r < rows; r++) {
        if (pass == 0) {
            chunk_scores(query + r * dim, src, stride, size, dim, s + (long)r * BLOCK);
            continue;
        }
        if (!seen[r]) continue;
        const float *p = s + (long)r * BLOCK;
        float *acc = acc_out + r * dim;
        float o[256] __attribute__((aligned(64)));
        memcpy(o, acc, sizeof(float) * dim);
        for (int j = 0; j < size; j++) {
            const float pj = p[j];
            const float *v = src + j * stride;
#pragma omp simd
            for (int d = 0; d < dim; d++) o[d] += pj * v[d];
        }
        memcpy(acc, o, sizeof(float) * dim);
    }
}

/* Blocks of BLOCK tokens, in order; two passes over each block in chunks of CHUNK tokens: the first takes every
 * (KV head, query row)'s scores over a chunk's keys, then per row the masks, softcap and an online softmax in fp32
 * (running max m and sum l, kept per head and row in the caller's buffers, the output rescaled once per block); the
 * second adds the chunk's values, weighted, into the rows' unnormalised outputs. A block's keys and values are read
 * from memory once (the second pass mostly finds them in L2), and the softmax bookkeeping is paid once per block.
 *
 * How many heads go through a block together depends on the dtype (measured on SmolLM2's shape, 30 layers, 1 thread):
 * - fp32 keys and values are read where they lie, all heads together: chunk by chunk, every head of a chunk in
 *   turn, the next chunk's rows requested as one starts, so memory is read as it lies, a token's keys of every
 *   head at once (2K: 0.55 -> 0.36 ms a layer; head by head, each token's row was read in pieces a stride apart,
 *   at 5 GB/s where the int8 GEMV reads 8);
 * - bf16 and fp16 ones go head by head, widened into an L1 chunk, each row requested AHEAD tokens before it is
 *   widened: there the widening sets the pace, and all heads together ran 1.2x slower at 2K. */
#define DEFINE_TILE(DIM)                                                                                        \
static int tile_##DIM(const char *tile, int dtype, int elem_size, long n, int batch, int group,               \
                      const float *query, int rows, int q_len, long first, long past, long window,            \
                      float softcap, float *m_out, float *l_out, float *acc_out) {                            \
    const long token_bytes = (long)batch * 2 * group * DIM * elem_size;                                         \
    const long heads = (long)batch * group;                                                                     \
    const long head_bytes = (long)DIM * elem_size;                                                              \
    const long kv_bytes = (long)group * head_bytes;  /* one batch row's keys (or values) of a token */          \
    const long stride = token_bytes / elem_size;  /* elements from a token's row to the next one's */            \
    const int in_place = dtype == FP32;                                                                         \
    const long together = in_place ? heads : 1;  /* heads whose chunks are taken in turn */                    \
    float chunk[CHUNK * DIM] __attribute__((aligned(64)));                                                      \
    float *s = malloc(sizeof(float) * BLOCK * rows * heads);  /* [heads][rows][BLOCK] scores, probabilities */ \
    char *seen = malloc(rows * heads);  /* per head and row: whether it sees a key of the block */            \
    if (s == NULL || seen == NULL) { free(s); free(seen); return -2; }                                          \
    for (long r = 0; r < heads * rows; r++) { m_out[r] = -INFINITY; l_out[r] = 0.0f; }                         \
    memset(acc_out, 0, sizeof(float) * heads * rows * DIM);                                                     \
    for (long t0 = 0; t0 < n; t0 += BLOCK) {                                                                    \
        const int count = n - t0 < BLOCK ? (int)(n - t0) : BLOCK;                                               \
        const long chunks = (count + CHUNK - 1) / CHUNK;                                                        \
        /* every row sees every key of the block: the newest key is at most the first query's position,       \
           and the oldest is inside the last query's window */                                                 \
        const int is_plain = softcap <= 0.0f && first + t0 + count - 1 <= past &&                                \
                             (window <= 0 || first + t0 > past + q_len - 1 - window);                            \
        const char *block = tile + t0 * token_bytes;                                                            \
        for (long g0 = 0; g0 < heads; g0 += together)                                                           \
        for (int pass = 0; pass < 2; pass++) {  /* 0: keys and scores; 1: values */                           \
            if (pass == 1)                                                                                      \
                for (long hr = g0 * rows; hr < (g0 + together) * rows; hr++)                                    \
                    seen[hr] = (char)softmax_block(s + hr * BLOCK, count, is_plain, first + t0,                 \
                                                   past + (hr % rows) % q_len, window, softcap, m_out + hr,     \
                                                   l_out + hr, acc_out + hr * DIM, DIM);                        \
            for (long step = 0; step < chunks * together; step++) {                                             \
                const long c = step / together, head = g0 + step % together;                                    \
                const long b = head / group, h = head % group;                                                  \
                const int c0 = (int)c * CHUNK, size = count - c0 < CHUNK ? count - c0 : CHUNK;                  \
                const long half = (b * 2 + pass) * kv_bytes;  /* this batch row's keys or values */            \
                const char *rows0 = block + c0 * token_bytes + half + h * head_bytes;                           \
                const float *src = (const float *)rows0;                                                        \
                if (in_place) {                                                                                 \
                    if (head == g0)  /* the next chunk's rows, every batch row's keys or values of a token */    \
                        for (int j = c0 + CHUNK; j < c0 + 2 * CHUNK && t0 + j < n; j++)                          \
                            for (long bb = 0; bb < batch; bb++)                                                 \
                                prefetch_row(block + j * token_bytes + (bb * 2 + pass) * kv_bytes, kv_bytes, 1); \
                } else {                                                                                        \
                    for (int j = 0; j < size; j++) {                                                            \
                        prefetch_row(rows0 + (j + AHEAD) * token_bytes, head_bytes, t0 + c0 + j + AHEAD < n);   \
                        widen(rows0 + j * token_bytes, dtype, DIM, chunk + j * DIM);                            \
                    }                                                                                           \
                }                                                                                               \
                /* the widened chunk's stride is a constant: the inlined loops then address it directly */          \
                if (in_place)                                                                                   \
                    chunk_rows(pass, src, stride, size, DIM, rows, query + head * rows * DIM,                   \
                               s + head * rows * BLOCK + c0, seen + head * rows, acc_out + head * rows * DIM);  \
                else                                                                                            \
                    chunk_rows(pass, chunk, DIM, size, DIM, rows, query + head * rows * DIM,                    \
                               s + head * rows * BLOCK + c0, seen + head * rows, acc_out + head * rows * DIM);  \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    free(s);                                                                                                    \
    free(seen);                                                                                                 \
    return 0;                                                                                                   \
}

DEFINE_TILE(16)
DEFINE_TILE(32)
DEFINE_TILE(64)
DEFINE_TILE(128)
DEFINE_TILE(256)

/* Returns 0; -1 for a head dim without a specialisation (the caller then uses its torch tile); -2 out of memory. */
int host_attend_tile(const char *tile, int dtype, int elem_size, long n, int batch, int group, int dim,
                     const float *query, int rows, int q_len, long first, long past, long window, float softcap,
                     float *m_out, float *l_out, float *acc_out) {
#define CASE(DIM) case DIM: return tile_##DIM(tile, dtype, elem_size, n, batch, group, query, rows, q_len, first, \
                                              past, window, softcap, m_out, l_out, acc_out);
    switch (dim) { CASE(16) CASE(32) CASE(64) CASE(128) CASE(256) default: return -1; }
#undef CASE
}

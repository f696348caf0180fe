/* y[:, lo:hi] = x @ (codes * scales[:, None])[lo:hi].T (+ bias) for a few rows of x, in fp32: the int8 weight
 * layers of a CPU decode step (see int8_matmul.py).
 *
 * A decode step multiplies one activation row by every weight, so it is bound by reading the int8 codes once.
 * Each output row's codes are widened 8 at a time to fp32 and multiplied into fp32 sums: no activation is
 * quantized, so the result is the sum an fp32 matmul of the dequantized weights computes (in another order).
 * Four output rows at a time (the next four prefetched), so that an activation vector loaded once serves four
 * rows. The scale (a power of
 * two: exact) and the bias are applied to the finished sum. Callers split [lo, hi) across threads. */
#include <stdint.h>

#include "../native/common.h"
#if defined(__AVX2__) && defined(__FMA__) /* -march=x86-64-v3 and up; else the portable loop below */
#include <immintrin.h>

#ifndef PREFETCH_HINT  /* -DPREFETCH_HINT=0 builds the non-temporal hint this file had, to compare */
#define PREFETCH_HINT 3
#endif

static inline __m256 widen8(const int8_t *codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}

/* Four consecutive output rows (``stride`` codes apart) over ``n`` inputs, n a multiple of 8. */
static inline void dot4(const int8_t *c, long stride, const float *x, long n, float *out) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long i = 0; i < n; i += 8) {
        /* The next four rows' line at this offset: requested now, it arrives while these rows compute. Without it
         * the loop streams at ~4.5 GB/s; with it ~8.5 (one core of the development VM; a line further ahead did
         * worse). Reading past the matrix's last row only asks for a line: a prefetch never faults. Into every
         * cache level: the non-temporal hint it had measured 1.3-3.0x slower from DRAM (docs/benchmarks/
         * gemv-prefetch.md), most on rows wider than L1 holds the activations of. */
        if ((i & 63) == 0)
            for (int k = 4; k < 8; k++) __builtin_prefetch(c + k * stride + i, 0, PREFETCH_HINT);
        const __m256 xi = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(widen8(c + i), xi, s0);
        s1 = _mm256_fmadd_ps(widen8(c + stride + i), xi, s1);
        s2 = _mm256_fmadd_ps(widen8(c + 2 * stride + i), xi, s2);
        s3 = _mm256_fmadd_ps(widen8(c + 3 * stride + i), xi, s3);
    }
    out[0] = hc_hsum8(s0);
    out[1] = hc_hsum8(s1);
    out[2] = hc_hsum8(s2);
    out[3] = hc_hsum8(s3);
}
#endif

/* One row, portably: the sum in double, since one fp32 running sum over a row of hundreds drifts from the product of
 * the dequantized weight by far more than the 8 fp32 lanes above do (each code times x is exact in double). */
static inline float dot1(const int8_t *c, const float *x, long n) {
    double sum = 0.0;
    for (long i = 0; i < n; i++) sum += (double)c[i] * x[i];
    return (float)sum;
}

#if !(defined(__AVX2__) && defined(__FMA__))
static inline void dot4(const int8_t *c, long stride, const float *x, long n, float *out) {
    for (int k = 0; k < 4; k++) out[k] = dot1(c + k * stride, x, n);
}
#endif

/* x: [rows, in] fp32; codes: [out, in] int8; scales: [out] fp32; bias: [out] fp32 or NULL; y: [rows, out] fp32.
 * Computes output columns [lo, hi) only. Returns 0, or -1 when ``in`` is not a multiple of 8. */
int int8_gemv(const float *x, const int8_t *codes, const float *scales, const float *bias, float *y, long rows,
              long in, long out, long lo, long hi) {
    if (in % 8) return -1;
    for (long o = lo; o < hi; o += 4) {
        const int width = hi - o < 4 ? (int)(hi - o) : 4;
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * in;
            float *yr = y + r * out;
            float s[4];
            if (width == 4) {
                dot4(codes + o * in, in, xr, in, s);
            } else {
                for (int k = 0; k < width; k++) s[k] = dot1(codes + (o + k) * in, xr, in);
            }
            for (int k = 0; k < width; k++) yr[o + k] = s[k] * scales[o + k] + (bias ? bias[o + k] : 0.0f);
        }
    }
    return 0;
}

/* ---- decode rows split over cores (split_pool.h) ---- */
#include "../native/split_pool.h"

typedef struct {
    const float *x, *scales, *bias;
    const int8_t *codes;
    float *y;
    long rows, in, out;
} gemv_call;

static int gemv_range(const void *context, long lo, long hi) {
    const gemv_call *c = context;
    return int8_gemv(c->x, c->codes, c->scales, c->bias, c->y, c->rows, c->in, c->out, lo, hi);
}

/* int8_gemv over every output column, in ranges of whole groups of 4 on the caller and up to threads - 1 of this
 * library's pool workers. */
int int8_gemv_split(const float *x, const int8_t *codes, const float *scales, const float *bias, float *y, long rows,
                    long in, long out, int threads) {
    const gemv_call call = {x, scales, bias, codes, y, rows, in, out};
    return sp_run(gemv_range, &call, out, 4, threads);
}

/* The pool's idle spin in ns, set (returns the previous value), and the tasks its workers ran (see split_pool.h). */
long int8_split_spin_ns(long spin_ns) { return sp_set_spin_ns(spin_ns); }
long int8_split_worker_tasks(void) { return sp_worker_tasks(); }

/* The arithmetic ceilings of one core (benchmarks/cpu/cpu_ceilings.py), each timed on this thread:
 * - cc_fma_rate: 512-bit fused multiply-adds per second, 12 independent chains held in registers (no loads);
 * - cc_dpbf16_rate: the same for vdpbf16ps (32 bf16 products into 16 fp32 lanes), -1 without AVX512_BF16;
 * - cc_gemm_l1: GFLOPS of an fp32 GEMM micro-kernel (12 rows x 32 columns of C in 24 registers, a broadcast of A
 *   and two vectors of B per step) over packed panels that stay in L1: the pace an fp32 GEMM cannot beat here.
 * Each returns -1 where the CPU or compiler lacks AVX-512 (they are built with -march=native). */
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECLARE(i) __m512 a##i = _mm512_set1_ps(1.0f + (i) * 1e-7f);
#define SUM(i) total = _mm512_add_ps(total, a##i);
/* The body of a rate: 12 chains of STEP(i) (an instruction on a##i, m and c), ``steps`` times; instructions per
 * second. The chains' sum is used, so that nothing is optimised away. */
#define TIMED_CHAINS(STEP)                                                  \
    CHAINS(DECLARE)                                                         \
    const double begin = seconds();                                         \
    for (long n = 0; n < steps; n++) { CHAINS(STEP) }                       \
    const double elapsed = seconds() - begin;                               \
    __m512 total = _mm512_setzero_ps();                                     \
    CHAINS(SUM)                                                             \
    volatile float sink = _mm512_reduce_add_ps(total);                      \
    (void)sink;                                                             \
    return steps * 12.0 / elapsed;

double cc_fma_rate(long steps) {
#if defined(__AVX512F__)
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f * (float)(steps & 1));
#define FMA_STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    TIMED_CHAINS(FMA_STEP)
#else
    (void)steps;
    return -1.0;
#endif
}

double cc_dpbf16_rate(long steps) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3380 + (steps & 1));
#define DOT_STEP(i) a##i = _mm512_dpbf16_ps(a##i, m, c);
    TIMED_CHAINS(DOT_STEP)
#else
    (void)steps;
    return -1.0;
#endif
}

#if defined(__AVX512F__)
#define MR 12
#define NR 32
/* C[MR, NR] += A[MR, K] B[K, NR]; a: [K][MR] (a column of A per step), b: [K][NR]. */
__attribute__((noinline)) static void micro_kernel(const float *a, const float *b, float *c, long K) {
    __m512 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 b0 = _mm512_load_ps(b + NR * k), b1 = _mm512_load_ps(b + NR * k + 16);
        for (int i = 0; i < MR; i++) {
            const __m512 ai = _mm512_set1_ps(a[MR * k + i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(c + i * NR, _mm512_add_ps(_mm512_loadu_ps(c + i * NR), acc[i][0]));
        _mm512_storeu_ps(c + i * NR + 16, _mm512_add_ps(_mm512_loadu_ps(c + i * NR + 16), acc[i][1]));
    }
}
#endif

double cc_gemm_l1(long calls) {
#if defined(__AVX512F__)
    const long K = 256; /* A panel 12 KiB + B panel 32 KiB: both in a 48 KiB L1 */
    float *a = aligned_alloc(64, sizeof(float) * MR * K), *b = aligned_alloc(64, sizeof(float) * NR * K);
    float *c = aligned_alloc(64, sizeof(float) * MR * NR);
    if (a == NULL || b == NULL || c == NULL) {
        free(a), free(b), free(c);
        return -1.0;
    }
    for (long i = 0; i < MR * K; i++) a[i] = 1e-3f;
    for (long i = 0; i < NR * K; i++) b[i] = 1e-3f;
    for (long i = 0; i < MR * NR; i++) c[i] = 0.0f;
    micro_kernel(a, b, c, K); /* warm */
    const double begin = seconds();
    for (long r = 0; r < calls; r++) micro_kernel(a, b, c, K);
    const double elapsed = seconds() - begin;
    volatile float sink = c[0];
    (void)sink;
    free(a), free(b), free(c);
    return 2.0 * MR * NR * K * calls / elapsed / 1e9;
#else
    (void)calls;
    return -1.0;
#endif
}

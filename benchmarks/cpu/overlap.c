/* Does this core overlap arithmetic with reading memory? (benchmarks/cpu/overlap.py builds and runs it.)
 *
 * A stream of floats is read once, 64 bytes (one vector of 16) at a time, and each vector feeds K fused multiply-adds
 * into 16 independent sums (so the arithmetic is bound by its throughput, not by the latency of one chain). Timed:
 * - from L2: a 256 KiB buffer read over and over (the arithmetic's own pace, memory aside);
 * - from DRAM: a 512 MiB buffer read once a round, with no software prefetch, or with prefetches a distance ahead
 *   (T0: into L1; T2: into L2), on 4 KiB pages or on huge pages (madvise).
 * A core that overlaps the two runs a stream from DRAM at min(its L2 pace, the read's pace); one that does not, at
 * 1 / (1 / L2 pace + 1 / read pace). Output: one JSON object per line. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ``bytes`` of floats at x, K FMAs per 64 bytes, prefetching ``distance`` bytes ahead with ``hint`` (0: none) */
#define STREAM(NAME, HINT)                                                                                        \
    __attribute__((noinline)) static float NAME(const float *x, long bytes, int k, long distance) {                 \
        __m512 acc[16];                                                                                           \
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();                                                \
        const __m512 q = _mm512_set1_ps(1.0001f);                                                                 \
        for (long i = 0; i < bytes / 4; i += 64) {                                                                \
            if (distance)                                                                                         \
                for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(x + i + 16 * j) + distance, HINT);        \
            const __m512 v[4] = {_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i + 32), \
                                 _mm512_loadu_ps(x + i + 48)};                                                    \
            for (int r = 0; r < k; r++)                                                                           \
                for (int j = 0; j < 4; j++) acc[4 * (r & 3) + j] = _mm512_fmadd_ps(v[j], q, acc[4 * (r & 3) + j]); \
            if (k == 0)                                                                                           \
                for (int j = 0; j < 4; j++) acc[j] = _mm512_add_ps(acc[j], v[j]);                                 \
        }                                                                                                         \
        __m512 s = acc[0];                                                                                        \
        for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);                                                \
        return _mm512_reduce_add_ps(s);                                                                           \
    }
STREAM(stream_t0, _MM_HINT_T0)
STREAM(stream_t2, _MM_HINT_T2)

static float *buffer(long bytes, int huge) {
    const long aligned = (bytes + (2L << 20) - 1) / (2L << 20) * (2L << 20);
    float *x = aligned_alloc(2L << 20, aligned);
    if (x == NULL) exit(1);
    if (huge) madvise(x, aligned, MADV_HUGEPAGE);
    for (long i = 0; i < bytes / 4; i++) x[i] = (float)(i & 7);
    return x;
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 3;
    const long big = 512L << 20, small = 256L << 10;
    float *pages[2] = {buffer(big, 0), buffer(big, 1)};
    float *cached = buffer(small, 0);
    volatile float sink = 0.0f;
    const int ks[] = {0, 1, 2, 4, 8};
    const long distances[] = {0, 8192, 65536};
    for (unsigned ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        const int k = ks[ki];
        double best = 1e9;
        for (int r = 0; r < rounds + 2; r++) {
            const int repeats = 512;
            const double begin = now();
            for (int i = 0; i < repeats; i++) sink += stream_t0(cached, small, k, 0);
            const double seconds = (now() - begin) / repeats;
            if (seconds < best) best = seconds;
        }
        printf("{\"k\": %d, \"source\": \"L2\", \"bytes_per_s\": %.6g}\n", k, small / best);
        for (int huge = 0; huge < 2; huge++)
            for (unsigned di = 0; di < sizeof(distances) / sizeof(distances[0]); di++)
                for (int hint = 0; hint < (distances[di] ? 2 : 1); hint++) {
                    double most = 1e9;
                    for (int r = 0; r < rounds; r++) {
                        const double begin = now();
                        sink += (hint ? stream_t2 : stream_t0)(pages[huge], big, k, distances[di]);
                        const double seconds = now() - begin;
                        if (seconds < most) most = seconds;
                    }
                    printf("{\"k\": %d, \"source\": \"DRAM\", \"huge_pages\": %d, \"prefetch\": %ld, \"hint\": \"%s\", "
                           "\"bytes_per_s\": %.6g}\n", k, huge, distances[di], distances[di] ? (hint ? "T2" : "T0") : "",
                           big / most);
                    fflush(stdout);
                }
    }
    return sink == 12345.0f;
}

/* The helpers every C kernel here would otherwise repeat: the CPU weights' GEMVs (engine/cpu/gguf_gemv.c,
 * int8_gemv.c), their split pool (split_pool.h) and the host attention kernel (engine/kv/host_kernel.c,
 * host_pool.c). Header-only (static functions): each library keeps its own copy and state.
 *
 * A kernel includes it by its path from the kernel's folder ("../native/common.h"): native/library.py hashes the
 * included files with a source, and kv/native.py names it among the host kernel's sources, so an edit here rebuilds
 * every library that uses it. */
#ifndef HEADINFER_COMMON_H
#define HEADINFER_COMMON_H

#include <pthread.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* fp16 bits -> fp32 exactly with integer operations (normals, subnormals, infinities, NaNs): for compilers
 * without _Float16 (GCC < 12) and CPUs without F16C. */
static inline float hc_half_bits_to_float(uint16_t half) {
    union { uint32_t u; float f; } out = { (uint32_t)(half & 0x7fff) << 13 };
    const uint32_t exponent = out.u & 0x0f800000u;
    out.u += (uint32_t)(127 - 15) << 23;
    if (exponent == 0x0f800000u) {
        out.u += (uint32_t)(128 - 16) << 23; /* infinity or NaN */
    } else if (exponent == 0) {               /* zero or subnormal: renormalised by an exact fp32 subtraction */
        const union { uint32_t u; float f; } magic = { (uint32_t)113 << 23 };
        out.u += 1u << 23;
        out.f -= magic.f;
    }
    out.u |= (uint32_t)(half & 0x8000) << 16;
    return out.f;
}

#if defined(__AVX__)
/* The sum of 8 fp32 lanes, always in this order (halves, then pairs, then the last two): the GEMVs' results
 * depend on it bit for bit. */
static inline float hc_hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

/* A pool's worker start: detached threads running ``worker((void *)id)`` for ids *count, *count + 1, ... until
 * *count reaches ``wanted`` (at most ``limit``); returns *count (fewer if the system refuses a thread). Called under
 * the pool's call lock. The first call also registers ``forget`` to run in a forked child (fork copies only the
 * calling thread: the child must forget the parent's workers), once per pool (``*fork_handled``). */
static inline int hc_start_workers(int *count, int wanted, int limit, void *(*worker)(void *), int *fork_handled,
                                   void (*forget)(void)) {
    if (!*fork_handled) *fork_handled = pthread_atfork(NULL, NULL, forget) == 0;
    if (wanted > limit) wanted = limit;
    while (*count < wanted) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&thread, &attr, worker, (void *)(long)*count);
        pthread_attr_destroy(&attr);
        if (failed) break;
        (*count)++;
    }
    return *count;
}

#endif

/* One layer's host attention in one call (host_kernel.h): the queries folded, the tasks run on this library's own
 * thread pool, the partials merged by their log-sum-exp weights, the output written in the queries' dtype.
 *
 * Tasks are (head group, tile of at most tile_bytes of its home), taken in order from one atomic counter by the
 * caller and the pool's workers, so a worker the OS starts late only takes fewer tasks. Workers sleep on a
 * condition variable between calls; the caller never waits for one that has not started (it only waits for tasks
 * in progress), so the fixed cost of a call is its wake-up broadcast, the fold and the merge.
 *
 * The vector path (host_kernel.c compiled per path) is chosen once from cpuid, or forced by the call.
 *
 * host_use_split_pool(1) runs the same tasks on this library's copy of split_pool.h instead, whose workers spin
 * between calls (the A/B of docs/benchmarks/thread-pools.md; a call's ha_runner, another library's pool, goes first).
 */
#include "host_kernel.h"
#include "../native/common.h"
#include "../native/split_pool.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

long ha_bf16_dot_tasks = 0;
long ha_l1_prefetch_tasks = 0;

#define MAX_WORKERS 255
#define DEFAULT_TILE_BYTES (2L << 20) /* 2 MiB: the streamed home of a tile; calls of less use smaller tiles */
#define MIN_TILE_BYTES (64L << 10)    /* below this a task's fixed cost dominates */
#define TASKS_PER_THREAD 4            /* enough tasks that threads the OS pauses delay only a share of a call */
#define BYTES_PER_THREAD (256L << 10) /* a call of less wakes fewer workers: waking one costs ~10-20 us */

typedef int (*task_fn)(const ha_job *, long);
typedef float (*read_fn)(const char *, long);

typedef struct {
    const void *context;
    int (*run)(const void *context, long index);
    long num_tasks;
    long next;    /* atomic: the next task to take */
    int status;   /* atomic: the first nonzero task status */
    int threads;  /* workers of this call (the caller excluded) */
} call_state;

static struct {
    pthread_mutex_t call_lock; /* one call at a time uses the pool and the scratch */
    pthread_mutex_t lock;
    pthread_cond_t wake, idle;
    call_state *current;       /* NULL between calls */
    unsigned long generation;
    int num_workers, busy;
    float *scratch;
    long scratch_floats;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, NULL, 0};

static long own_worker_tasks; /* atomic: tasks the own pool's workers ran, ever (tests and benchmarks read it) */

/* Runs tasks of ``state`` until none is left; returns how many this thread ran. */
static long run_tasks(call_state *state) {
    for (long ran = 0;; ran++) {
        const long index = __atomic_fetch_add(&state->next, 1, __ATOMIC_RELAXED);
        if (index >= state->num_tasks) return ran;
        const int status = state->run(state->context, index);
        if (status != 0) __atomic_store_n(&state->status, status, __ATOMIC_RELAXED);
    }
}

static void *worker(void *arg) {
    const int id = (int)(long)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        call_state *state = pool.current;
        if (state == NULL || id >= state->threads) continue; /* a call already done, or not one of its workers */
        pool.busy++;
        pthread_mutex_unlock(&pool.lock);
        __atomic_fetch_add(&own_worker_tasks, run_tasks(state), __ATOMIC_RELAXED);
        pthread_mutex_lock(&pool.lock);
        if (--pool.busy == 0) pthread_cond_signal(&pool.idle);
    }
    return NULL;
}

/* In a child forked from a process with a pool: the parent's workers do not exist here (fork copies the calling
 * thread only), and a call another thread had in progress left call_lock held and busy counted; the child starts
 * its own workers at its first pooled call. The scratch, copied with the memory, stays the child's. */
static void forget_workers(void) {
    pthread_mutex_init(&pool.call_lock, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.idle, NULL);
    pool.current = NULL;
    pool.num_workers = pool.busy = 0;
}

/* Starts workers up to ``wanted`` (under call_lock); returns how many there are. */
static int ensure_workers(int wanted) {
    static int fork_handled;
    return hc_start_workers(&pool.num_workers, wanted, MAX_WORKERS, worker, &fork_handled, forget_workers);
}

static int cores(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* ---- the vector path ---- */
static int cpu_has_uncached(int variant) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (variant == HA_AVX512_BF16) { /* cpuid leaf 7, sub-leaf 1, EAX bit 5 (not every compiler's cpu_supports
                                        names it); the AVX-512 check below covers the OS's register state */
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        return cpu_has_uncached(HA_AVX512) && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 5 & 1);
    }
    if (variant == HA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
    if (variant == HA_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return variant == HA_PORTABLE;
}

/* Remembered per path: the cpuid instruction traps to the hypervisor in a virtual machine (measured ~7 us each, two
 * a call, on this EPYC VM). Concurrent first calls store the same answer. */
static int cpu_has(int variant) {
    static int known[HA_AVX512_BF16 + 1]; /* 0: not asked yet; 1: no; 2: yes */
    if (variant < 0 || variant > HA_AVX512_BF16) return 0;
    int answer = __atomic_load_n(&known[variant], __ATOMIC_RELAXED);
    if (answer == 0) {
        answer = cpu_has_uncached(variant) ? 2 : 1;
        __atomic_store_n(&known[variant], answer, __ATOMIC_RELAXED);
    }
    return answer == 2;
}

static task_fn variant_function(int variant) {
    switch (variant) {
#ifdef HA_HAS_AVX512BF16
        case HA_AVX512_BF16: return cpu_has(HA_AVX512_BF16) ? ha_task_avx512bf16 : NULL;
#endif
#ifdef HA_HAS_AVX512
        case HA_AVX512: return cpu_has(HA_AVX512) ? ha_task_avx512 : NULL;
#endif
#ifdef HA_HAS_AVX2
        case HA_AVX2: return cpu_has(HA_AVX2) ? ha_task_avx2 : NULL;
#endif
        case HA_PORTABLE: return ha_task_portable;
        default: return NULL;
    }
}

/* Whether cpuid names AMD (asked once: cpuid traps in a virtual machine). */
static int cpu_is_amd(void) {
    static int known; /* 0: not asked yet; 1: no; 2: yes */
    int answer = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (answer == 0) {
        answer = 1;
#if defined(__x86_64__) || defined(__i386__)
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u)
            answer = 2; /* "AuthenticAMD" */
#endif
        __atomic_store_n(&known, answer, __ATOMIC_RELAXED);
    }
    return answer == 2;
}

/* The level HA_PREFETCH_AUTO requests bf16/fp16/fp32 homes' lines into (host_kernel.c, HA_PREFETCH_HINT_L1): L1 on
 * AMD, L2 elsewhere; or the one asked for. */
int host_attend_prefetch(int requested) {
    if (requested == HA_PREFETCH_L1 || requested == HA_PREFETCH_L2) return requested;
    return cpu_is_amd() ? HA_PREFETCH_L1 : HA_PREFETCH_L2;
}

/* The path HA_AUTO runs (the widest this CPU has and this library was built with), or the one asked for if it
 * is available; 0 if it is not. */
int host_attend_variant(int requested) {
    if (requested != HA_AUTO) return variant_function(requested) ? requested : 0;
    for (int variant = HA_AVX512_BF16; variant >= HA_PORTABLE; variant--)
        if (variant_function(variant)) return variant;
    return 0;
}

/* ---- fold, merge ---- */
static float bf16_to_float(uint16_t bits) {
    union { uint32_t u; float f; } out = {(uint32_t)bits << 16};
    return out.f;
}

static uint16_t float_to_bf16(float value) { /* round to nearest even, as torch's .to(bfloat16) */
    union { float f; uint32_t u; } in = {value};
    if ((in.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((in.u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((in.u + 0x7fffu + ((in.u >> 16) & 1)) >> 16);
}

#if defined(__FLT16_MAX__) && !defined(HEADINFER_NO_FLOAT16)
static float half_to_float(uint16_t bits) {
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}
static uint16_t float_to_half(float value) {
    const _Float16 h = (_Float16)value;
    uint16_t bits;
    memcpy(&bits, &h, 2);
    return bits;
}
#else
/* Without _Float16 (GCC < 12): exact widening (common.h) and round-to-nearest-even narrowing with bit operations
 * (after Maratyszcza's FP16 library). */
static float half_to_float(uint16_t half) { return hc_half_bits_to_float(half); }
static uint16_t float_to_half(float value) {
    union { float f; uint32_t u; } in = {value}, base;
    const union { uint32_t u; float f; } to_inf = {0x77800000u}, to_zero = {0x08800000u}; /* 2^112, 2^-110 */
    base.f = (fabsf(value) * to_inf.f) * to_zero.f;
    const uint32_t shl1 = in.u + in.u, sign = in.u & 0x80000000u;
    uint32_t bias = shl1 & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    union { uint32_t u; float f; } rebias = {(bias >> 1) + 0x07800000u};
    base.f = rebias.f + base.f;
    const uint32_t exp_bits = (base.u >> 13) & 0x00007c00u, mantissa_bits = base.u & 0x00000fffu;
    return (uint16_t)((sign >> 16) | (shl1 > 0xff000000u ? 0x7e00u : exp_bits + mantissa_bits));
}
#endif

static float read_element(const void *base, long index, int dtype) {
    if (dtype == HA_FP32) return ((const float *)base)[index];
    if (dtype == HA_BF16) return bf16_to_float(((const uint16_t *)base)[index]);
    return half_to_float(((const uint16_t *)base)[index]);
}

static void write_element(void *base, long index, int dtype, float value) {
    if (dtype == HA_FP32) ((float *)base)[index] = value;
    else if (dtype == HA_BF16) ((uint16_t *)base)[index] = float_to_bf16(value);
    else ((uint16_t *)base)[index] = float_to_half(value);
}

/* Query head of (group, KV head h, row r) and its query index: heads are (group, KV head, repeat), rows
 * (repeat, query). */
#define HEAD_OF(c, grp, h, r) ((((long)(grp) * (c)->group + (h)) * (c)->n_rep) + (r) / (c)->q_len)

/* The queries times ``scale`` into ``folded``; where ``raw`` is given, also as bf16 bits unscaled (element order).
 * Returns whether every query was a bf16 value (so that ``raw`` holds them exactly). */
static int fold_queries(const ha_call *c, int rows, float scale, float *folded, uint16_t *raw) {
    uint32_t low_bits = 0; /* the low halves of every query's fp32 bits, or-ed: 0 iff all are bf16 values */
    for (int grp = 0; grp < c->num_groups; grp++)
        for (int b = 0; b < c->batch; b++)
            for (int h = 0; h < c->group; h++)
                for (int r = 0; r < rows; r++) {
                    const long head = HEAD_OF(c, grp, h, r), q = r % c->q_len;
                    const long at = b * c->q_strides[0] + head * c->q_strides[1] + q * c->q_strides[2];
                    const long row = (((long)grp * c->batch + b) * c->group + h) * rows + r;
                    float *out = folded + row * c->dim;
                    for (int d = 0; d < c->dim; d++) {
                        const float value = read_element(c->query, at + d * c->q_strides[3], c->query_dtype);
                        out[d] = value * scale;
                        if (raw != NULL) {
                            uint32_t bits;
                            memcpy(&bits, &value, 4);
                            low_bits |= bits & 0xffffu;
                            raw[row * c->dim + d] = (uint16_t)(bits >> 16);
                        }
                    }
                }
    return raw != NULL && low_bits == 0;
}

/* out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i over a group's tiles (M: the largest m; a tile a row
 * cannot see has m = -inf, weight 0). */
static void merge(const ha_call *c, const ha_job *job) {
    const long heads_rows = (long)c->batch * c->group * job->rows;
    const int tiles = job->tiles_per_group, dim = c->dim;
    float row[256];
    for (int grp = 0; grp < c->num_groups; grp++)
        for (long hr = 0; hr < heads_rows; hr++) {
            const long b = hr / (c->group * job->rows), h = hr / job->rows % c->group, r = hr % job->rows;
            const long first = (long)grp * tiles;
            float top = -INFINITY, total = 0.0f;
            for (int t = 0; t < tiles; t++) top = fmaxf(top, job->m[(first + t) * heads_rows + hr]);
            memset(row, 0, sizeof(float) * dim);
            for (int t = 0; t < tiles; t++) {
                const long slot = (first + t) * heads_rows + hr;
                if (job->m[slot] == -INFINITY) continue;
                const float weight = expf(job->m[slot] - top);
                total += weight * job->l[slot];
                const float *acc = job->acc + slot * dim;
                for (int d = 0; d < dim; d++) row[d] += weight * acc[d];
            }
            const long head = HEAD_OF(c, grp, h, r), q = r % c->q_len;
            const long at = b * c->out_strides[0] + head * c->out_strides[1] + q * c->out_strides[2];
            const float inverse = 1.0f / total;  /* > 0: every query sees its own key */
            for (int d = 0; d < dim; d++)
                write_element(c->out, at + d * c->out_strides[3], c->out_dtype, row[d] * inverse);
        }
}

static int element_bytes(int dtype) {
    return dtype == HA_FP32 ? 4 : (dtype == HA_BF16 || dtype == HA_FP16) ? 2 : 1;
}

static int use_split_pool; /* atomic: host_use_split_pool's */

/* Tasks of one call as split_pool.h's ranges. */
typedef struct {
    int (*run)(const void *context, long index);
    const void *context;
} task_range_context;

static int task_range(const void *context, long lo, long hi) {
    const task_range_context *t = context;
    int status = 0;
    for (long index = lo; index < hi; index++) {
        const int task_status = t->run(t->context, index);
        if (task_status != 0) status = task_status;
    }
    return status;
}

/* Runs tasks [0, num_tasks) on the caller and up to threads - 1 workers (under call_lock); the first nonzero
 * status. */
static int run_on_pool(int (*run)(const void *, long), const void *context, long num_tasks, int threads) {
    if (__atomic_load_n(&use_split_pool, __ATOMIC_RELAXED)) {
        const task_range_context ranges = {run, context};
        return sp_run(task_range, &ranges, num_tasks, 1, threads);
    }
    call_state state = {context, run, num_tasks, 0, 0, 0};
    const long helpers = (num_tasks < threads ? num_tasks : threads) - 1;
    if (helpers > 0) {
        state.threads = ensure_workers((int)helpers);
        if (state.threads > helpers) state.threads = (int)helpers;
        pthread_mutex_lock(&pool.lock);
        pool.current = &state;
        pool.generation++;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    run_tasks(&state);
    if (helpers > 0) { /* every task is taken: wait for those still running, never for a worker not yet awake */
        pthread_mutex_lock(&pool.lock);
        pool.current = NULL;
        while (pool.busy > 0) pthread_cond_wait(&pool.idle, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
    return __atomic_load_n(&state.status, __ATOMIC_RELAXED);
}

typedef struct {
    const ha_job *job;
    task_fn run;
} attention_context;

static int attention_task(const void *context, long index) {
    const attention_context *a = context;
    return a->run(a->job, index);
}

/* Tasks [lo, hi) of a call, as a runner's range (ha_runner). */
static int attention_range(const void *context, long lo, long hi) {
    int status = 0;
    for (long index = lo; index < hi; index++) {
        const int task_status = attention_task(context, index);
        if (task_status != 0) status = task_status;
    }
    return status;
}

/* 1: calls without a runner go to this library's split pool (spinning workers); 0: to its own sleeping pool.
 * Returns the previous setting. */
int host_use_split_pool(int on) { return __atomic_exchange_n(&use_split_pool, on != 0, __ATOMIC_RELAXED); }

/* Tasks (split pool: ranges of tasks) the workers of this library's split pool / own pool ran since it loaded
 * (tests: which pool ran). */
long host_split_worker_tasks(void) { return sp_worker_tasks(); }
long host_own_worker_tasks(void) { return __atomic_load_n(&own_worker_tasks, __ATOMIC_RELAXED); }

#define SCRATCH_KEEP_FLOATS (1L << 20) /* 4 MiB: a scratch this small is kept whatever the call */
#define DECODE_QUERY_LIMIT 16 /* query tokens of a decode step's call (native.CPU_QUERY_LIMIT, schedule.HOST_QUERY_LIMIT);
                                 the CPU prefill route's calls have more (kernels._cpu_prefill) */

/* Bytes of the scratch the pool keeps between calls (folded queries and the tasks' partials). */
long host_scratch_bytes(void) {
    pthread_mutex_lock(&pool.call_lock);
    const long bytes = pool.scratch_floats * (long)sizeof(float);
    pthread_mutex_unlock(&pool.call_lock);
    return bytes;
}

/* Returns 0; -1 a head dim without a specialisation; -2 out of memory; -3 the vector path is not available. */
int host_attend_layer(const ha_call *c) {
    if (c->dim != 16 && c->dim != 32 && c->dim != 64 && c->dim != 128 && c->dim != 256) return -1;
    const int variant = host_attend_variant(c->variant);
    const task_fn run = variant_function(variant);
    if (run == NULL) return -3;
    /* bf16 homes on the bf16 dot-product path: the queries as bf16 too, where they are bf16 values (a bf16 model's
       are): their products with the keys are then exact in fp32, as the widened path's */
    const int wants_raw = variant == HA_AVX512_BF16 && c->kv_dtype == HA_BF16 && c->dim == 128;
    ha_job job = {0};
    job.call = c;
    job.rows = c->n_rep * c->q_len;
    job.prefetch_l1 = host_attend_prefetch(c->prefetch) == HA_PREFETCH_L1;
    job.token_bytes = (long)c->batch * 2 * c->group * c->dim * element_bytes(c->kv_dtype);
    const long tokens = c->stop - c->start, total_bytes = tokens * job.token_bytes * c->num_groups;
    int threads = c->num_threads > 0 ? c->num_threads : cores();
    if (total_bytes / BYTES_PER_THREAD + 1 < threads) threads = (int)(total_bytes / BYTES_PER_THREAD + 1);
    long tile_bytes = c->tile_bytes > 0 ? c->tile_bytes : DEFAULT_TILE_BYTES;
    const long spread = total_bytes / ((long)threads * TASKS_PER_THREAD); /* every thread gets tasks */
    if (spread < tile_bytes) tile_bytes = spread > MIN_TILE_BYTES ? spread : MIN_TILE_BYTES;
    if (c->tile_bytes > 0 && c->tile_bytes < tile_bytes) tile_bytes = c->tile_bytes; /* tests: many tiles */
    job.tile_tokens = tile_bytes / job.token_bytes;
    if (job.tile_tokens < 16) job.tile_tokens = 16;
    job.tiles_per_group = (int)((tokens + job.tile_tokens - 1) / job.tile_tokens);
    const long num_tasks = (long)job.tiles_per_group * c->num_groups;
    const long heads_rows = (long)c->batch * c->group * job.rows;
    const long folded_floats = heads_rows * c->dim * c->num_groups;
    const long raw_floats = wants_raw ? (folded_floats + 1) / 2 + 16 : 0; /* bf16 halves, 64-byte aligned */
    const long needed = folded_floats + num_tasks * heads_rows * (c->dim + 2) + raw_floats;

    pthread_mutex_lock(&pool.call_lock);
    /* Grown for a prefill chunk's query blocks (every task keeps a partial of every row), the scratch would keep up to
       1/16 of a layer's home through every decode step after: a decode step's call that needs under a quarter of it,
       past SCRATCH_KEEP_FLOATS, gives it back. Only a decode step's: in a prefill, a sliding-window layer's blocks
       need little and the full layer's next to it much again, and shrinking between them would free and regrow the
       scratch every layer. */
    const int is_decode_step = c->q_len <= DECODE_QUERY_LIMIT;
    if (pool.scratch_floats < needed ||
        (is_decode_step && pool.scratch_floats > SCRATCH_KEEP_FLOATS && needed < pool.scratch_floats / 4)) {
        free(pool.scratch);
        pool.scratch = malloc(sizeof(float) * needed);
        pool.scratch_floats = pool.scratch == NULL ? 0 : needed;
        if (pool.scratch == NULL) {
            pthread_mutex_unlock(&pool.call_lock);
            return -2;
        }
    }
    float *folded = pool.scratch;
    job.folded = folded;
    job.m = folded + folded_floats;
    job.l = job.m + num_tasks * heads_rows;
    job.acc = job.l + num_tasks * heads_rows;
    uint16_t *raw = NULL;
    if (wants_raw) {
        const uintptr_t after = (uintptr_t)(job.acc + num_tasks * heads_rows * c->dim);
        raw = (uint16_t *)((after + 63) & ~(uintptr_t)63);
    }
    job.raw_scale = c->softcap > 0.0f ? c->scaling / c->softcap : c->scaling; /* the tile undoes 1/softcap */
    job.raw = fold_queries(c, job.rows, job.raw_scale, folded, raw) ? raw : NULL;

    const attention_context context = {&job, run};
    /* On the pool the decode step's GEMVs run on where the caller gives one (its workers spin between the step's
       calls: waking this pool's sleeping workers cost ~30 us of a 2K-token layer's ~180 us on two cores) */
    int status = c->runner != NULL ? c->runner(attention_range, &context, num_tasks, 1, threads)
                                   : run_on_pool(attention_task, &context, num_tasks, threads);
    if (status == 0) merge(c, &job);
    pthread_mutex_unlock(&pool.call_lock);
    return status;
}

typedef struct {
    const char *data;
    long bytes, slice;
    read_fn read;
    float *sums;
} read_context;

static int read_task(const void *context, long index) {
    const read_context *r = context;
    const long first = index * r->slice, size = first + r->slice < r->bytes ? r->slice : r->bytes - first;
    r->sums[index] = r->read(r->data + first, size);
    return 0;
}

/* The benchmark's yardstick: ``bytes`` of floats at ``data`` summed on ``num_threads`` threads of this pool, in
 * slices of 1 MiB, at the vector width of ``variant``; returns the sum (so that nothing is optimised away), NaN
 * if the path is not available. */
double host_read(const char *data, long bytes, int num_threads, int variant) {
    const int chosen = host_attend_variant(variant);
    const read_fn read = chosen == HA_PORTABLE ? ha_read_portable
#ifdef HA_HAS_AVX2
                         : chosen == HA_AVX2 ? ha_read_avx2
#endif
#ifdef HA_HAS_AVX512
                         : chosen == HA_AVX512 ? ha_read_avx512
#endif
#ifdef HA_HAS_AVX512BF16
                         : chosen == HA_AVX512_BF16 ? ha_read_avx512bf16
#endif
                         : NULL;
    if (read == NULL) return NAN;
    const long slice = 1L << 20, num_tasks = (bytes + slice - 1) / slice;
    float *sums = malloc(sizeof(float) * num_tasks);
    if (sums == NULL) return NAN;
    const read_context context = {data, bytes, slice, read, sums};
    pthread_mutex_lock(&pool.call_lock);
    run_on_pool(read_task, &context, num_tasks, num_threads > 0 ? num_threads : cores());
    pthread_mutex_unlock(&pool.call_lock);
    double total = 0.0;
    for (long i = 0; i < num_tasks; i++) total += sums[i];
    free(sums);
    return total;
}

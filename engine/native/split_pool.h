/* A range [0, total) split over the caller and a few pthreads that spin briefly between calls: the hand-off for
 * work of 0.1-1 ms, a decode step's GEMVs (engine/cpu/gguf_gemv.c, int8_gemv.c), where a Python thread pool's
 * hand-off (~70 us: a future, a condition variable, the GIL) cost as much as the second core saved.
 *
 * Header-only: each library that includes it has its own pool (static state), started on its first split call.
 *
 * The range is cut into tasks of whole ``align`` units, taken in order from one atomic counter by the caller and
 * every worker that has joined, so a worker the OS wakes late only takes fewer tasks; the caller waits only for
 * tasks in progress. Between calls a worker spins (yielding the core to any other runnable thread) for
 * ``sp_spin_ns``, then sleeps on a condition variable: a decode step's next GEMV comes within tens of microseconds,
 * and a sleeping worker costs a wake-up (~10-50 us) instead of the spin. The spin yields because on a machine of
 * few cores the host attention pool's workers and torch's threads run between GEMVs, on the same cores.
 *
 * One call at a time: a second thread's call while one runs is done by that thread alone (no waiting on the first).
 * A forked child forgets the parent's workers (pthread_atfork) and starts its own.
 *
 * Memory order: the caller publishes the call (``current``), then bumps ``generation``; a worker that sees the new
 * generation counts itself in ``joined`` before it reads ``current``, and the caller clears ``current`` before it
 * waits for ``joined`` to reach 0. All four are sequentially consistent, so a worker either reads NULL or is waited
 * for: the call's state, on the caller's stack, outlives every reader. The sleep path is the same handshake on
 * ``sleeping`` and ``generation`` (a worker counts itself asleep, then re-reads the generation under the lock the
 * caller takes to broadcast). */
#ifndef HEADINFER_SPLIT_POOL_H
#define HEADINFER_SPLIT_POOL_H

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "common.h"

#define SP_MAX_WORKERS 63
#ifndef SP_TASKS_PER_THREAD /* a benchmark builds others */
#define SP_TASKS_PER_THREAD 2 /* more tasks than threads: a late worker's share falls to the others */
#endif
#define SP_DEFAULT_SPIN_NS 50000L /* 0-1000 us measured alike (docs/benchmarks/split-pool.md); a little spin saves a wake-up */

typedef int (*sp_range_fn)(const void *context, long lo, long hi);

typedef struct {
    sp_range_fn run;
    const void *context;
    long total, step, num_tasks;
    long next;     /* atomic: the next task to take */
    long finished; /* atomic: tasks done */
    int status;    /* atomic: a nonzero task status (the last stored) */
    int threads;   /* workers that may join (the caller excluded) */
} sp_call;

static struct {
    pthread_mutex_t call_lock; /* held by the one call in progress */
    pthread_mutex_t lock;      /* the sleep path's */
    pthread_cond_t wake;
    sp_call *current;          /* atomic: the call in progress, or NULL */
    unsigned long generation;  /* atomic: bumped by each call */
    int sleeping, joined;      /* atomic */
    int num_workers;           /* under call_lock */
    long spin_ns;              /* atomic */
    long worker_tasks;         /* atomic: tasks the workers ran, ever (what tests and benchmarks read) */
} sp_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0,
             SP_DEFAULT_SPIN_NS, 0};

static inline void sp_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long sp_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000L + now.tv_nsec;
}

/* Runs tasks of ``call`` until none is left; returns how many this thread ran. */
static long sp_run_tasks(sp_call *call) {
    for (long ran = 0;; ran++) {
        const long index = __atomic_fetch_add(&call->next, 1, __ATOMIC_RELAXED);
        if (index >= call->num_tasks) return ran;
        const long lo = index * call->step;
        const long hi = lo + call->step < call->total ? lo + call->step : call->total;
        const int status = call->run(call->context, lo, hi);
        if (status != 0) __atomic_store_n(&call->status, status, __ATOMIC_RELAXED);
        __atomic_fetch_add(&call->finished, 1, __ATOMIC_RELEASE);
    }
}

/* The generation after ``seen``: spun for, then slept for. */
static unsigned long sp_next_generation(unsigned long seen) {
    const long spin = __atomic_load_n(&sp_pool.spin_ns, __ATOMIC_RELAXED);
    const long until = spin > 0 ? sp_now_ns() + spin : 0;
    for (long round = 0; spin > 0; round++) {
        const unsigned long generation = __atomic_load_n(&sp_pool.generation, __ATOMIC_ACQUIRE);
        if (generation != seen) return generation;
        if (round % 16 == 15) {
            if (sp_now_ns() > until) break;
            sched_yield(); /* another runnable thread on this core (host attention, torch) goes first */
        } else {
            sp_relax();
        }
    }
    unsigned long generation;
    pthread_mutex_lock(&sp_pool.lock);
    __atomic_fetch_add(&sp_pool.sleeping, 1, __ATOMIC_SEQ_CST);
    while ((generation = __atomic_load_n(&sp_pool.generation, __ATOMIC_SEQ_CST)) == seen)
        pthread_cond_wait(&sp_pool.wake, &sp_pool.lock);
    __atomic_fetch_sub(&sp_pool.sleeping, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&sp_pool.lock);
    return generation;
}

static void *sp_worker(void *arg) {
    const int id = (int)(long)arg;
    unsigned long seen = 0;
    for (;;) {
        seen = sp_next_generation(seen);
        __atomic_fetch_add(&sp_pool.joined, 1, __ATOMIC_SEQ_CST);
        sp_call *call = __atomic_load_n(&sp_pool.current, __ATOMIC_SEQ_CST);
        if (call != NULL && id < call->threads)
            __atomic_fetch_add(&sp_pool.worker_tasks, sp_run_tasks(call), __ATOMIC_RELAXED);
        __atomic_fetch_sub(&sp_pool.joined, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* In a child forked from a process with a pool: the parent's workers do not exist here (fork copies the calling
 * thread only), nor does any call in progress; the child starts its own workers at its first split. */
static void sp_forget_workers(void) {
    pthread_mutex_init(&sp_pool.call_lock, NULL);
    pthread_mutex_init(&sp_pool.lock, NULL);
    pthread_cond_init(&sp_pool.wake, NULL);
    sp_pool.current = NULL;
    sp_pool.sleeping = sp_pool.joined = sp_pool.num_workers = 0;
}

/* Starts workers up to ``wanted`` (under call_lock); returns how many there are. */
static int sp_ensure_workers(int wanted) {
    static int fork_handled;
    return hc_start_workers(&sp_pool.num_workers, wanted, SP_MAX_WORKERS, sp_worker, &fork_handled, sp_forget_workers);
}

/* ``run(context, lo, hi)`` over [0, total) in ranges of whole ``align`` units, on the caller and up to
 * ``threads - 1`` workers. Returns 0, or a nonzero status one of the ranges returned. */
static int sp_run(sp_range_fn run, const void *context, long total, long align, int threads) {
    if (threads <= 1 || total <= align || pthread_mutex_trylock(&sp_pool.call_lock) != 0)
        return run(context, 0, total);
    int workers = sp_ensure_workers(threads - 1); /* an earlier call may have started more than this one takes */
    if (workers > threads - 1) workers = threads - 1;
    const long tasks = (long)(workers + 1) * SP_TASKS_PER_THREAD;
    const long step = ((total + tasks - 1) / tasks + align - 1) / align * align;
    sp_call call = {run, context, total, step, (total + step - 1) / step, 0, 0, 0, workers};
    __atomic_store_n(&sp_pool.current, &call, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&sp_pool.generation, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sp_pool.sleeping, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&sp_pool.lock);
        pthread_cond_broadcast(&sp_pool.wake);
        pthread_mutex_unlock(&sp_pool.lock);
    }
    sp_run_tasks(&call);
    for (long round = 0; __atomic_load_n(&call.finished, __ATOMIC_ACQUIRE) < call.num_tasks; round++)
        round % 16 == 15 ? (void)sched_yield() : sp_relax();
    __atomic_store_n(&sp_pool.current, NULL, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&sp_pool.joined, __ATOMIC_SEQ_CST) > 0) sp_relax();
    pthread_mutex_unlock(&sp_pool.call_lock);
    return __atomic_load_n(&call.status, __ATOMIC_RELAXED);
}

/* Tasks the pool's workers have run since the library was loaded. */
static long sp_worker_tasks(void) { return __atomic_load_n(&sp_pool.worker_tasks, __ATOMIC_RELAXED); }

/* How long an idle worker spins before it sleeps, in ns (0: sleeps at once); returns the previous value. */
static long sp_set_spin_ns(long spin_ns) {
    return __atomic_exchange_n(&sp_pool.spin_ns, spin_ns < 0 ? 0 : spin_ns, __ATOMIC_RELAXED);
}

#endif

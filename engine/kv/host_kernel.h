/* One layer's host attention, as host_pool.c hands it to the compute tasks of host_kernel.c (see native.py).
 *
 * A call: the step's queries [B, H, Q, D] over tokens [start, stop) of every host-attended head group's home
 * ([capacity, B, 2, g, D] token-major, in its stored dtype; 8-bit homes: codes plus fp32 scale planes
 * [capacity, B, 2, g, 1]); H = num_groups * g * n_rep; row r of a KV head is query head rep = r / Q at query
 * r % Q. Output [B, H, Q, D] with out_strides, in out_dtype.
 */
#ifndef HEADINFER_HOST_KERNEL_H
#define HEADINFER_HOST_KERNEL_H

#include <stdint.h>

enum { HA_FP32 = 0, HA_BF16 = 1, HA_FP16 = 2, HA_INT8 = 3, HA_FP8 = 4 };
enum { HA_AUTO = 0, HA_PORTABLE = 1, HA_AVX2 = 2, HA_AVX512 = 3, HA_AVX512_BF16 = 4 };
/* Where bf16/fp16/fp32 homes' next lines are requested (int8 homes: always L1, HA_PREFETCH_HINT_INT8). */
enum { HA_PREFETCH_AUTO = 0, HA_PREFETCH_L1 = 1, HA_PREFETCH_L2 = 2 };

/* Another library's pool, where the call may run its tasks instead of this library's own: ``run(context, lo, hi)``
 * over [0, total) in ranges of whole ``align`` units on the caller and up to ``threads - 1`` workers; returns 0 or
 * a range's nonzero status (split_pool.h's sp_run, as gguf_gemv.c exports it). */
typedef int (*ha_runner)(int (*run)(const void *context, long lo, long hi), const void *context, long total,
                         long align, int threads);

/* Mirrored field for field by native.py's ctypes Structure: keep the two in step. */
typedef struct {
    const char *const *kv;      /* [num_groups] home base pointers (8-bit homes: their codes) */
    const float *const *scales; /* [num_groups] scale planes, or NULL (not 8-bit) */
    const void *query;          /* [B, H, Q, D] with q_strides (elements) */
    void *out;                  /* [B, H, Q, D] with out_strides (elements) */
    long q_strides[4];
    long out_strides[4];        /* a prefill chunk's query block writes into the chunk's output in place */
    long start, stop;           /* visible tokens of every home */
    long window;                /* > 0: a query at p sees keys > p - window */
    long tile_bytes;            /* most home bytes per task (0: the default) */
    float scaling, softcap;     /* scores = q.k * scaling; softcap > 0: softcap * tanh(scores / softcap) */
    int num_groups, batch, group, dim, n_rep, q_len;
    int kv_dtype, query_dtype, out_dtype;
    int num_threads;            /* threads of the call, the caller's included (<= 0: every core) */
    int variant;                /* HA_AUTO or a forced vector path */
    int prefetch;               /* HA_PREFETCH_AUTO or a forced level */
    ha_runner runner;           /* NULL: this library's pool */
} ha_call;

/* What a compute task reads: the call, its folded queries and where its partial goes. */
typedef struct {
    const ha_call *call;
    const float *folded;        /* [num_groups, B, g, R, D] fp32, pre-scaled (and divided by softcap) */
    long tile_tokens;           /* tokens per task */
    int tiles_per_group, rows;  /* rows R = n_rep * Q */
    long token_bytes;           /* bytes of one token of a home: B * 2 * g * D * element size */
    float *m, *l, *acc;         /* per task: [B * g * R] running max, sum; [B * g * R, D] unnormalised output */
    const uint16_t *raw;        /* [num_groups, B, g, R, D] the queries as bf16 bits, unscaled, in element order,
                                   where every query is a bf16 value and the path scores bf16 homes by bf16 dot
                                   products (HA_AVX512_BF16); else NULL */
    float raw_scale;            /* what folding multiplied the queries by: scores = (raw . k) * raw_scale */
    int prefetch_l1;            /* bf16/fp16/fp32 homes' lines requested into L1 (else into L2) */
} ha_job;

/* Tasks that scored their keys by bf16 dot products since the library loaded (tests: which path ran). */
extern long ha_bf16_dot_tasks;
/* Tasks over bf16/fp16/fp32 homes that requested their next lines into L1 (tests: the level reached the tasks). */
extern long ha_l1_prefetch_tasks;

/* Computes task ``index`` (group index / tiles_per_group, tile index % tiles_per_group) into its partial slot.
 * Returns 0, or -2 when a scratch buffer could not be allocated. One per compiled vector path. */
int ha_task_portable(const ha_job *job, long index);
int ha_task_avx2(const ha_job *job, long index);
int ha_task_avx512(const ha_job *job, long index);
int ha_task_avx512bf16(const ha_job *job, long index);

/* The sum of ``bytes`` of floats at ``data``: a plain read at the same vector width (the benchmark's yardstick). */
float ha_read_portable(const char *data, long bytes);
float ha_read_avx2(const char *data, long bytes);
float ha_read_avx512(const char *data, long bytes);
float ha_read_avx512bf16(const char *data, long bytes);

#endif

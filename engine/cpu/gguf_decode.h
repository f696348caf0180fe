/* A decode step's layer in two calls (engine/cpu/fused_decode.py): what a Llama-family decoder layer does around
 * its attention, for one token, on GGUF blocks. Included by gguf_gemv.c, so its GEMVs are that file's and its
 * splits go to that library's one pool.
 *
 * Why: a decode step streams ~1 GB of weight blocks through every cache level, so each small torch op after a GEMV
 * (a norm, RoPE, SiLU·mul, a residual add: ~15 between two attention calls) finds the interpreter's and torch's
 * dispatch state evicted and costs 50-100 us instead of 5-15 (measured: a norm right after a GEMV 100 us, the same
 * norm again 36 us). At 2K tokens on two cores that was a fifth of the step. Here those ops are a few loops over
 * 1-9K floats each, in the same call as the GEMVs around them.
 *
 *   gguf_decode_attention_in: x = RMSNorm(h) * w; [q | k | v] = projections of x (+ bias), split over the pool as
 *       one row range; Qwen3's per-head RMSNorm of q and k where given; RoPE (rotate-half, transformers' layout)
 *       on the q and k heads with the step's cos/sin.
 *   gguf_decode_mlp: h += o_proj(attention); x = RMSNorm(h) * w; a = SiLU(gate(x)) * up(x); h += down(a).
 *
 * Every product and sum is rounded as transformers' fp32 ops round it (this file is built with -ffp-contract=off):
 * RoPE's and the residual adds' results equal torch's bit for bit; the norms' sum of squares (accumulated in double
 * here) and SiLU's exp differ from torch's within fp32 rounding. */
#ifndef HEADINFER_GGUF_DECODE_H
#define HEADINFER_GGUF_DECODE_H

#include <math.h>

/* One projection: its blocks [out, in / block size blocks], type, output rows and bias ([out] fp32 or NULL). */
typedef struct {
    const uint8_t *raw;
    const float *bias;
    long out;
    int type;
} gd_projection;

/* out = w * (x * (1 / sqrt(mean(x^2) + eps))): LlamaRMSNorm / Qwen2RMSNorm in fp32 */
static void gd_rms_norm(const float *x, const float *w, float eps, long n, float *out) {
    double sum = 0.0;
    for (long i = 0; i < n; i++) sum += (double)x[i] * (double)x[i];
    const float variance = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(variance + eps);
    for (long i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* Each head of x [heads, dim] rotated in place: x * cos + rotate_half(x) * sin, cos/sin: [dim] */
static void gd_rope(float *x, long heads, long dim, const float *cos, const float *sin) {
    const long half = dim / 2;
    for (long h = 0; h < heads; h++) {
        float *v = x + h * dim;
        for (long i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cos[i] + (-b) * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/* Rows [lo, hi) of several projections of one input, as one range (projection 0's rows, then 1's, ...); each
 * projection's output follows the previous one's in y: q, k and v in one split (one projection alone is
 * gguf_gemv_split). */
typedef struct {
    const gv_input *x;  /* prepared once for every projection and range */
    const gd_projection *projections;
    float *y;
    int count;
} gd_rows_call;

static int gd_rows_range(const void *context, long lo, long hi) {
    const gd_rows_call *c = context;
    long base = 0;
    for (int p = 0; p < c->count && base < hi; p++) {
        const gd_projection *proj = c->projections + p;
        const long first = lo > base ? lo - base : 0, last = hi - base < proj->out ? hi - base : proj->out;
        if (first < last) gemv_rows(c->x, proj->raw, proj->type, proj->bias, c->y + base, proj->out, first, last);
        base += proj->out;
    }
    return 0;
}

/* gate and up rows [lo, hi), then g = SiLU(g) * u over them: the gated MLP's activation, per range */
typedef struct {
    const gv_input *x;  /* prepared once for both projections and every range */
    const gd_projection *gate, *up;
    float *g, *u;
} gd_swiglu_call;

static int gd_swiglu_range(const void *context, long lo, long hi) {
    const gd_swiglu_call *c = context;
    gemv_rows(c->x, c->gate->raw, c->gate->type, c->gate->bias, c->g, c->gate->out, lo, hi);
    gemv_rows(c->x, c->up->raw, c->up->type, c->up->bias, c->u, c->up->out, lo, hi);
    for (long i = lo; i < hi; i++) {
        const float g = c->g[i];
        c->g[i] = (g / (1.0f + expf(-g))) * c->u[i];
    }
    return 0;
}

/* h [in] -> y [q | k | v] (each projection's rows in turn), then on the query and key heads (of ``head_dim``): an
 * RMSNorm of each head where ``q_norm``/``k_norm`` ([head_dim], Qwen3's) are not NULL, and RoPE where cos is not
 * NULL. ``scratch``: [in] for the normed input. ``kv_row``: NULL, or where the token's k and v also go, [2, KVH, D]
 * (the cache home's row of this token: HeadInferLayer.decode_row). Returns 0 or gguf_gemv's status. */
int gguf_decode_attention_in(const float *h, const float *norm, float eps, long in, const gd_projection *qkv,
                             const float *q_norm, const float *k_norm, float head_eps, const float *cos,
                             const float *sin, long head_dim, float *y, float *scratch, int threads,
                             float *kv_row) {
    for (int p = 0; p < 3; p++)
        if (!fits(qkv[p].type, in)) return -1;
    gd_rms_norm(h, norm, eps, in, scratch);
    gv_input x;
    const int limbs = takes_limbs(qkv[0].type) || takes_limbs(qkv[1].type) || takes_limbs(qkv[2].type);
    if (gv_prepare(scratch, 1, in, limbs, &x) != 0) return -2;
    const gd_rows_call call = {&x, qkv, y, 3};
    const int status = sp_run(gd_rows_range, &call, qkv[0].out + qkv[1].out + qkv[2].out, 4, threads);
    gv_release(&x);
    if (status != 0) return status;
    float *q = y, *k = y + qkv[0].out;
    const long q_heads = qkv[0].out / head_dim, k_heads = qkv[1].out / head_dim;
    for (long head = 0; q_norm != NULL && head < q_heads; head++)
        gd_rms_norm(q + head * head_dim, q_norm, head_eps, head_dim, q + head * head_dim);  /* in place */
    for (long head = 0; k_norm != NULL && head < k_heads; head++)
        gd_rms_norm(k + head * head_dim, k_norm, head_eps, head_dim, k + head * head_dim);
    if (cos != NULL) {
        gd_rope(q, q_heads, head_dim, cos, sin);
        gd_rope(k, k_heads, head_dim, cos, sin);
    }
    if (kv_row != NULL) /* [2, KVH, D]: k and v lie together in y, in that order */
        memcpy(kv_row, k, sizeof(float) * (qkv[1].out + qkv[2].out));
    return 0;
}

/* h [hidden] updated in place: h += o(attention [o.in]); x = RMSNorm(h) * norm; h += down(SiLU(gate(x)) * up(x)).
 * ``gate_up``: gate then up; ``scratch``: [hidden + 2 * intermediate]. Returns 0 or gguf_gemv's status. */
int gguf_decode_mlp(float *h, const float *attention, long attention_width, const gd_projection *o,
                    const float *norm, float eps, const gd_projection *gate_up, const gd_projection *down,
                    float *scratch, int threads) {
    const long hidden = o->out, intermediate = gate_up[0].out;
    float *t = scratch, *g = scratch + hidden, *u = g + intermediate;
    int status = gguf_gemv_split(attention, o->raw, o->type, o->bias, t, 1, attention_width, hidden, threads);
    if (status != 0) return status;
    for (long i = 0; i < hidden; i++) h[i] = h[i] + t[i];
    for (int p = 0; p < 2; p++)
        if (!fits(gate_up[p].type, hidden)) return -1;
    gd_rms_norm(h, norm, eps, hidden, t);
    gv_input x;
    if (gv_prepare(t, 1, hidden, takes_limbs(gate_up[0].type) || takes_limbs(gate_up[1].type), &x) != 0) return -2;
    const gd_swiglu_call mlp = {&x, gate_up, gate_up + 1, g, u};
    status = sp_run(gd_swiglu_range, &mlp, intermediate, 4, threads);
    gv_release(&x);
    if (status != 0) return status;
    status = gguf_gemv_split(g, down->raw, down->type, down->bias, t, 1, intermediate, hidden, threads);
    if (status != 0) return status;
    for (long i = 0; i < hidden; i++) h[i] = h[i] + t[i];
    return 0;
}

#endif

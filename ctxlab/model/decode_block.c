/* A Llama-family decoder layer's decode-sized work in compiled calls.
 *
 * Python drives a layer as about a dozen small calls (two norms, four linears, RoPE, SwiGLU,
 * two residual adds, and the views between them); at a decode step each costs microseconds
 * of interpreter and dispatch, some 12 % of a 4-sequence step of SmolLM2. Here the same
 * kernels run in the same order on the same operands, called through the function pointers
 * their own libraries export (`gemv.c`, `rms_norm.c`, `elementwise.c`), so the results are
 * bit for bit the layer's own: `block_pre` is norm, q|k|v projection and RoPE; attention
 * stays with the engine; `block_post` is the output projection and residual, norm, gate|up,
 * SwiGLU, down and residual. At a pure decode step whose attention the engine describes
 * (`Attn`), `block_step` runs all of it, the cache write and the attention included, in
 * one call.
 *
 * Scratch rows live in a per-thread buffer grown on demand, so concurrent layers on two
 * threads never share one.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*NormFn)(const float *x, long rows, long dim, const float *w, float eps, float *y);
typedef void (*RopeFn)(float *x, long tokens, long heads, long dim, long ld, const float *cos,
                       const float *sin);
typedef void (*SiluFn)(const float *gu, long rows, long inter, long ld, float *out);
/* gemv.c's three call shapes (`gemv.FixedCall`): the loops, bf16 tiles, int8 tiles */
typedef void (*LoopFn)(const float *x, long M, long K, const void *W, long N, const float *bias,
                       float *y);
typedef void (*TilesFn)(const float *x, long M, long K, const void *W, long N, long ldy,
                        const float *bias, float *y);
typedef void (*Int8TilesFn)(const float *x, long M, long K, const void *W, const float *scales,
                            long N, long ldy, const float *bias, float *y, const float *rot,
                            long block);

enum { LOOP = 0, BF16_TILES = 1, INT8_TILES = 2 };

typedef struct {
    long kind;
    void *fn;
    long k, n;
    const void *w;
    const float *scale, *bias, *rot;
    long block;
} Linear;

typedef struct {
    NormFn norm;
    RopeFn rope;
    SiluFn silu;
    const float *norm1, *norm2;
    float eps;
    long hidden, qk_heads, head_dim, inter;
    Linear qkv, o, gate_up, down;
} Block;

static void linear(const Linear *l, const float *x, long m, float *y) {
    switch (l->kind) {
    case LOOP:
        ((LoopFn)l->fn)(x, m, l->k, l->w, l->n, l->bias, y);
        break;
    case BF16_TILES:
        ((TilesFn)l->fn)(x, m, l->k, l->w, l->n, l->n, l->bias, y);
        break;
    default:
        ((Int8TilesFn)l->fn)(x, m, l->k, l->w, l->scale, l->n, l->n, l->bias, y, l->rot, l->block);
    }
}

static _Thread_local float *scratch_rows;
static _Thread_local size_t scratch_floats;

/* At least n floats of this thread's scratch, or NULL when out of memory. */
static float *scratch(size_t n) {
    if (n > scratch_floats) {
        float *p = realloc(scratch_rows, n * sizeof(float));
        if (!p) return NULL;
        scratch_rows = p, scratch_floats = n;
    }
    return scratch_rows;
}

/* qkv [m, qkv.n] = qkv(norm1(x)), its q and k heads rotated (cos, sin: [m, head_dim]);
 * normed: m x hidden floats of scratch. */
static void pre_into(const Block *b, const float *x, long m, const float *cos, const float *sin,
                     float *qkv, float *normed) {
    b->norm(x, m, b->hidden, b->norm1, b->eps, normed);
    linear(&b->qkv, normed, m, qkv);
    b->rope(qkv, m, b->qk_heads, b->head_dim, b->qkv.n, cos, sin);
}

/* out [m, hidden] = h + down(silu(gate) * up) of norm2(h), where h = o(attn) + x; buf:
 * post_floats(b, m) floats of scratch. */
static long post_floats(const Block *b, long m) { return m * (2 * b->hidden + 3 * b->inter); }

static void post_into(const Block *b, const float *attn, const float *x, long m, float *out,
                      float *buf) {
    const long hid = m * b->hidden;
    float *proj = buf, *normed = buf + hid, *gate_up = buf + 2 * hid;
    float *act = gate_up + m * 2 * b->inter;
    linear(&b->o, attn, m, proj);
    for (long i = 0; i < hid; i++) out[i] = proj[i] + x[i];
    b->norm(out, m, b->hidden, b->norm2, b->eps, normed);
    linear(&b->gate_up, normed, m, gate_up);
    b->silu(gate_up, m, b->inter, 2 * b->inter, act);
    linear(&b->down, act, m, proj);
    for (long i = 0; i < hid; i++) out[i] = proj[i] + out[i];
}

int block_pre(const Block *b, const float *x, long m, const float *cos, const float *sin,
              float *qkv) {
    float *normed = scratch((size_t)(m * b->hidden));
    if (!normed) return -2;
    pre_into(b, x, m, cos, sin, qkv, normed);
    return 0;
}

int block_post(const Block *b, const float *attn, const float *x, long m, float *out) {
    float *buf = scratch((size_t)post_floats(b, m));
    if (!buf) return -2;
    post_into(b, attn, x, m, out, buf);
    return 0;
}

/* The engine's side of one layer's attention at a pure decode step (`PagedAttention`
 * fills it: `ctxlab/engine/compiled_decode.py`): the pool's row write and its decode
 * attention (`row_write.c`, `paged_decode.c`, float32 or bf16 pools), with this step's
 * rows, block tables and lengths. */
typedef int (*WriteFn)(void *kdst, void *vdst, long slots, long width, int elem,
                       const int64_t *rows, long tokens, long heads, const float *k, long ks,
                       const float *v, long vs);
typedef int (*DecodeFn)(const float *q, const void *kp, const void *vp, const int64_t *table,
                        const int64_t *lens, const uint8_t *mask, int use_mask, long mask_len,
                        float scale, float *out, long B, long H, long g, long d, long dv,
                        long bs, long nb, long kw, long vw);

typedef struct {
    WriteFn write;
    void *k_rows, *v_rows;
    long slots, width, elem;
    DecodeFn decode;
    const void *k_pool, *v_pool;
    float scale;
    long kv_heads, group, dv, bs, kw, vw;
    long seqs;             /* this step's: rows of x */
    const int64_t *rows;   /* [seqs, kv_heads] pool rows of the new k and v */
    const int64_t *table;  /* [seqs, kv_heads, nb] block ids */
    const int64_t *lens;   /* [seqs, kv_heads] slots each lane walks */
    const uint8_t *mask;   /* [seqs, kv_heads, mask_len] keys read, or NULL: every slot walked */
    long mask_len, nb;
} Attn;

/* The whole layer at a pure decode step: pre, the new k/v written, decode attention, post.
 * 0, or -1 (a pool row out of range: nothing written), -2 (no memory), -3 (rows or heads
 * other than the description's: nothing done), another value (the attention refused the
 * shapes). */
int block_step(const Block *b, const Attn *a, const float *x, long m, const float *cos,
               const float *sin, float *out) {
    const long d = b->head_dim, nkv = a->kv_heads, nq = nkv * a->group, qkv_n = b->qkv.n;
    if (a->seqs != m || nq + nkv != b->qk_heads) return -3;
    const long q_n = nq * d, attn_n = nq * a->dv;
    const long need = m * (qkv_n + q_n + attn_n) + (post_floats(b, m) > m * b->hidden
                                                        ? post_floats(b, m) : m * b->hidden);
    float *qkv = scratch((size_t)need);
    if (!qkv) return -2;
    float *q = qkv + m * qkv_n, *attn = q + m * q_n, *work = attn + m * attn_n;
    pre_into(b, x, m, cos, sin, qkv, work);
    int status = a->write(a->k_rows, a->v_rows, a->slots, a->width, (int)a->elem, a->rows, m, nkv,
                          qkv + q_n, qkv_n, qkv + q_n + nkv * d, qkv_n);
    if (status) return status;
    for (long i = 0; i < m; i++) memcpy(q + i * q_n, qkv + i * qkv_n, sizeof(float) * (size_t)q_n);
    status = a->decode(q, a->k_pool, a->v_pool, a->table, a->lens, a->mask, a->mask != NULL,
                       a->mask_len, a->scale, attn, m, nkv, a->group, d, a->dv, a->bs, a->nb,
                       a->kw, a->vw);
    if (status) return status == -2 ? -2 : -4;
    post_into(b, attn, x, m, out, work);
    return 0;
}

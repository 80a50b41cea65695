/* A Llama-family decoder layer's decode-sized work around its attention, in two calls.
 *
 * Python drives a layer as about a dozen small calls (two norms, four linears, RoPE, SwiGLU,
 * two residual adds, and the views between them); at a decode step each costs microseconds
 * of interpreter and dispatch, some 12 % of a 4-sequence step of SmolLM2. Here the same
 * kernels run in the same order on the same operands, called through the function pointers
 * their own libraries export (`gemv.c`, `rms_norm.c`, `elementwise.c`), so the results are
 * bit for bit the layer's own: `block_pre` is norm, q|k|v projection and RoPE; attention
 * stays with the engine; `block_post` is the output projection and residual, norm, gate|up,
 * SwiGLU, down and residual.
 *
 * Scratch rows live in a per-thread buffer grown on demand, so concurrent layers on two
 * threads never share one.
 */
#include <stdlib.h>

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

/* qkv [m, qkv.n] = qkv(norm1(x)), its q and k heads rotated (cos, sin: [m, head_dim]). */
int block_pre(const Block *b, const float *x, long m, const float *cos, const float *sin,
              float *qkv) {
    float *normed = scratch((size_t)(m * b->hidden));
    if (!normed) return -2;
    b->norm(x, m, b->hidden, b->norm1, b->eps, normed);
    linear(&b->qkv, normed, m, qkv);
    b->rope(qkv, m, b->qk_heads, b->head_dim, b->qkv.n, cos, sin);
    return 0;
}

/* out [m, hidden] = h + down(silu(gate) * up) of norm2(h), where h = o(attn) + x. */
int block_post(const Block *b, const float *attn, const float *x, long m, float *out) {
    const long hid = m * b->hidden;
    float *buf = scratch((size_t)(2 * hid + m * 3 * b->inter));
    if (!buf) return -2;
    float *proj = buf, *normed = buf + hid, *gate_up = buf + 2 * hid;
    float *act = gate_up + m * 2 * b->inter;
    linear(&b->o, attn, m, proj);
    for (long i = 0; i < hid; i++) out[i] = proj[i] + x[i];
    b->norm(out, m, b->hidden, b->norm2, b->eps, normed);
    linear(&b->gate_up, normed, m, gate_up);
    b->silu(gate_up, m, b->inter, 2 * b->inter, act);
    linear(&b->down, act, m, proj);
    for (long i = 0; i < hid; i++) out[i] = proj[i] + out[i];
    return 0;
}

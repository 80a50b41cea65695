/* The paged decode attention in C: the numba loops' arithmetic (numba_decode.py), laid out
 * so one core keeps up with the memory.
 *
 * Each (sequence, KV head) lane walks its block table; for every block it prefetches the next
 * block's K and V rows, then folds the block into an online softmax over the g query heads
 * that share the KV head (GQA without repeating K/V). Slots are taken 16 at a time: the 16
 * dot products of a query head end as 16 vectors of partial sums, which one transposing
 * reduction turns into one vector of 16 scores (no horizontal sum per score, the numba
 * loops' cost); the exponentials are a vector polynomial; the value sums keep one vector of
 * each head's output in a register across the 16 slots. bf16 pools are widened and int8
 * pools dequantized (code x row scale) one block at a time into a small float buffer.
 *
 * Written with GCC vector extensions (16 floats a vector): the same source compiles to
 * AVX-512, to pairs of AVX2 vectors, or to scalar code. Head sizes that are not a multiple of
 * 16, more than 16 query heads per KV head, or heads wider than 512 return -1 and the numba
 * loop runs instead.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define NEG (-3.0e38f) /* a finite "minus infinity", as in the numba loops */
#define MAX_G 16
#define MAX_D 512

static inline v16 vload(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, v16 v) { memcpy(p, &v, sizeof v); }
static inline v16 splat(float x) { return (v16){0} + x; }
/* a where m is set (all ones), else b: C has no vector ?: */
static inline v16 vselect(v16i m, v16 a, v16 b) { return (v16)(((v16i)a & m) | ((v16i)b & ~m)); }

/* out[i] = the sum of the 16 lanes of v[i]: a tree of shuffles and adds over all 16 at once. */
static inline v16 sum16(const v16 *v) {
    v16 r[8], s[4];
    for (int i = 0; i < 8; i++) {
        v16 a = v[2 * i], b = v[2 * i + 1];
        r[i] = __builtin_shufflevector(a, b, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29) +
               __builtin_shufflevector(a, b, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
    for (int i = 0; i < 4; i++) {
        v16 a = r[2 * i], b = r[2 * i + 1];
        s[i] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    /* s[i]: in each quarter q, the quarter-q partial sums of v[4i .. 4i+3] */
    v16 w01 = __builtin_shufflevector(s[0], s[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
              __builtin_shufflevector(s[0], s[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    v16 w23 = __builtin_shufflevector(s[2], s[3], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
              __builtin_shufflevector(s[2], s[3], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    return __builtin_shufflevector(w01, w23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(w01, w23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}

/* exp(x) for x <= 0 (scores minus their running max), within about 2 ulp; x below -87
 * gives about 1e-38 (the caller zeroes masked lanes itself). Range reduction to
 * x = n ln2 + r, |r| <= ln2 / 2, and a degree-6 polynomial for exp(r) (Cephes' coefficients). */
static inline v16 vexp(v16 x) {
    x = vselect(x < -87.0f, splat(-87.0f), x);
    v16 y = x * 1.44269504088896341f - 0.5f;
    v16i n = __builtin_convertvector(y, v16i); /* truncation of y - 0.5 (y <= 0): nearest */
    v16 nf = __builtin_convertvector(n, v16);
    v16 r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    v16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    v16i bits = (n + 127) << 23;
    v16 scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float hmax(v16 v) {
    v16 t = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v = vselect(v > t, v, t);
    t = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v = vselect(v > t, v, t);
    t = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v = vselect(v > t, v, t);
    t = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    v = vselect(v > t, v, t);
    return v[0];
}
static inline float hsum(v16 v) {
    v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return v[0];
}

typedef struct {
    int g, d, dv;
    /* scaled queries, aligned: a vector load of one never splits a cache line */
    float qs[MAX_G][MAX_D] __attribute__((aligned(64)));
    float m[MAX_G];
    v16 den[MAX_G]; /* lane-wise denominators, summed at the end */
    float acc[MAX_G][MAX_D];
} Lane;

/* Where the next block's raw rows are, so its lines are requested while this block is
 * computed (one row's lines per slot; all of them at once stalls on the fill buffers). */
typedef struct {
    const char *k, *v;
    long k_row, v_row; /* bytes per row */
} Next;

static inline void prefetch_row(const char *p, long bytes) {
    for (long off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

static const int32_t IOTA[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Fold slots [0, ns) of one block (K rows at k + s * ks, V rows at v + s * vs, float32) into
 * the lane's softmax; mrow (or NULL) says which of the block's slots are keys. DC / VC: the
 * head sizes in vectors (VMAX: at most VC); GB: query heads whose value sums are kept in registers together
 * (GB x VC accumulators: independent chains, so the sums run at the FMA units' rate rather
 * than at one FMA's latency). Constants in the specialised copies below. */
#define FOLD(NAME, DC_, VC_, VMAX, GB)                                                              \
    static void NAME(Lane *L, const float *k, long ks, const float *v, long vs, int ns,         \
                     const uint8_t *mrow, const Next *nx) {                                     \
        const int dc = (DC_), vc = (VC_), g = L->g;                                             \
        for (int s0 = 0; s0 < ns; s0 += 16) {                                                   \
            const int n16 = ns - s0 < 16 ? ns - s0 : 16;                                        \
            v16i iota;                                                                          \
            memcpy(&iota, IOTA, sizeof iota);                                                   \
            v16i keep = iota < n16;                                                             \
            if (mrow) {                                                                         \
                v16i on;                                                                        \
                for (int s = 0; s < 16; s++) on[s] = s < n16 ? mrow[s0 + s] : 0;                \
                keep &= on != 0;                                                                \
            }                                                                                   \
            float pl[MAX_G][16]; /* this group's probabilities, per query head */               \
            for (int gi = 0; gi < g; gi++) {                                                    \
                v16 part[16];                                                                   \
                const float *q = L->qs[gi];                                                     \
                for (int s = 0; s < 16; s++) {                                                  \
                    v16 a = splat(0.0f);                                                        \
                    if (s < n16) {                                                              \
                        const float *kr = k + (long)(s0 + s) * ks;                              \
                        for (int c = 0; c < dc; c++) a += vload(q + 16 * c) * vload(kr + 16 * c); \
                    }                                                                           \
                    part[s] = a;                                                                \
                }                                                                               \
                v16 sc = vselect(keep, sum16(part), splat(NEG));                                \
                const float bmax = hmax(sc);                                                    \
                if (bmax == NEG) { /* no key among these slots */                               \
                    vstore(pl[gi], splat(0.0f));                                                \
                    continue;                                                                   \
                }                                                                               \
                if (bmax > L->m[gi]) {                                                          \
                    const float corr = L->m[gi] == NEG ? 0.0f : vexp(splat(L->m[gi] - bmax))[0]; \
                    L->den[gi] *= corr;                                                         \
                    for (int c = 0; c < vc; c++)                                                \
                        vstore(L->acc[gi] + 16 * c, vload(L->acc[gi] + 16 * c) * corr);         \
                    L->m[gi] = bmax;                                                            \
                }                                                                               \
                const v16 p = vselect(keep, vexp(sc - L->m[gi]), splat(0.0f));                  \
                L->den[gi] += p;                                                                \
                vstore(pl[gi], p);                                                              \
            }                                                                                   \
            for (int g0 = 0; g0 < g; g0 += GB) {                                                \
                const int gn = g - g0 < GB ? g - g0 : GB;                                       \
                v16 acc[GB][VMAX];                                                              \
                for (int b = 0; b < GB; b++)                                                    \
                    for (int c = 0; c < vc; c++)                                                \
                        acc[b][c] = b < gn ? vload(L->acc[g0 + b] + 16 * c) : splat(0.0f);      \
                for (int s = 0; s < n16; s++) {                                                 \
                    if (nx && g0 == 0) { /* the next block's rows, one slot's at a time */      \
                        prefetch_row(nx->k + (s0 + s) * nx->k_row, nx->k_row);                  \
                        prefetch_row(nx->v + (s0 + s) * nx->v_row, nx->v_row);                  \
                    }                                                                           \
                    const float *vr = v + (long)(s0 + s) * vs;                                  \
                    v16 vv[VMAX];                                                               \
                    for (int c = 0; c < vc; c++) vv[c] = vload(vr + 16 * c);                    \
                    for (int b = 0; b < GB; b++) {                                              \
                        if (b >= gn) break;                                                     \
                        const float pb = pl[g0 + b][s];                                         \
                        for (int c = 0; c < vc; c++) acc[b][c] += pb * vv[c];                   \
                    }                                                                           \
                }                                                                               \
                for (int b = 0; b < gn; b++)                                                    \
                    for (int c = 0; c < vc; c++) vstore(L->acc[g0 + b] + 16 * c, acc[b][c]);    \
            }                                                                                   \
        }                                                                                       \
    }

FOLD(fold_4, 4, 4, 4, 4)     /* heads of 64 (SmolLM2, Llama 3.2 1B) */
FOLD(fold_8, 8, 8, 8, 2)     /* heads of 128 */
FOLD(fold_16, 16, 16, 16, 1) /* heads of 256 (Gemma 3) */
FOLD(fold_any, L->d / 16, L->dv / 16, MAX_D / 16, 1)

typedef void (*Fold)(Lane *, const float *, long, const float *, long, int, const uint8_t *,
                     const Next *);

static Fold fold_for(long d, long dv) {
    if (d == dv && d == 64) return fold_4;
    if (d == dv && d == 128) return fold_8;
    if (d == dv && d == 256) return fold_16;
    return fold_any;
}

static void finish_lane(const Lane *L, float *out) {
    for (int gi = 0; gi < L->g; gi++) {
        const float den = hsum(L->den[gi]);
        const float inv = den > 0.0f ? 1.0f / den : 0.0f;
        for (int c = 0; c < L->dv; c++) out[gi * L->dv + c] = L->acc[gi][c] * inv;
    }
}

static int unsupported(long g, long d, long dv) {
    return g < 1 || g > MAX_G || d % 16 || dv % 16 || d > MAX_D || dv > MAX_D || d < 16 || dv < 16;
}

/* Sequences that share leading blocks (a common prompt prefix, from the prefix cache) fold
 * those blocks once, together: their query heads stacked into one lane of up to MAX_G heads,
 * then each sequence's heads taken out of it to fold its own blocks. Every head's sums are
 * the ones it would get alone (heads never mix in a fold), so the output is bit for bit the
 * per-sequence walk's; a shared block is read once instead of once per sequence. A block is
 * shared when every member's table names it at the same place, it is full for each of them
 * and (with a mask) every one of its slots is a key for each. */
static long shared_blocks(const int64_t *table, const int64_t *lens, const uint8_t *mask,
                          int use_mask, long mask_len, const long *rows, int n_rows, long bs,
                          long nb) {
    long j = 0;
    for (; j < nb; j++) {
        const long blk = table[rows[0] * nb + j];
        for (int i = 0; i < n_rows; i++) {
            const long r = rows[i];
            if (table[r * nb + j] != blk || (j + 1) * bs > lens[r]) return j;
            if (use_mask) {
                if ((j + 1) * bs > mask_len) return j;
                for (long s = j * bs; s < (j + 1) * bs; s++)
                    if (!mask[r * mask_len + s]) return j;
            }
        }
    }
    return j;
}

/* A lane for rows `rows` (one, or a group): their g scaled queries each stacked, sums empty. */
static void start_group(Lane *S, const float *q, const long *rows, int n_rows, int g, int d,
                        int dv, float scale) {
    S->g = n_rows * g, S->d = d, S->dv = dv;
    for (int i = 0; i < n_rows; i++)
        for (int gi = 0; gi < g; gi++) {
            const int h = i * g + gi;
            const float *qr = q + (rows[i] * g + gi) * d;
            for (int c = 0; c < d; c++) S->qs[h][c] = qr[c] * scale;
            S->m[h] = NEG, S->den[h] = splat(0.0f);
            for (int c = 0; c < dv; c++) S->acc[h][c] = 0.0f;
        }
}

/* Heads [first, first + g) of `from` as a lane of their own in `to`. */
static void take_heads(const Lane *from, int first, int g, Lane *to) {
    to->g = g, to->d = from->d, to->dv = from->dv;
    for (int gi = 0; gi < g; gi++) {
        memcpy(to->qs[gi], from->qs[first + gi], sizeof(float) * (size_t)from->d);
        to->m[gi] = from->m[first + gi], to->den[gi] = from->den[first + gi];
        memcpy(to->acc[gi], from->acc[first + gi], sizeof(float) * (size_t)from->dv);
    }
}

/* The walk over every lane; STAGE(blk, ns) makes kb/vb (float rows, strides kstride/vstride)
 * for block blk; the next block's raw rows are at KRAW(blk), VRAW(blk), KROW / VROW bytes a
 * row. FOLD_BLOCKS(lane, row, j0, j1, masked) folds row `row`'s blocks [j0, j1) into `lane`
 * (its mask applied where `masked`). For each
 * KV head, the sequences whose first block is the same one are grouped (up to MAX_G / g),
 * their shared blocks folded once in `S`, then each goes on alone. */
#define FOLD_BLOCKS(LN, ROW, J0, J1, MASKED, STAGE, KRAW, VRAW, KROW, VROW)                    \
    do {                                                                                        \
        const long n = lens[ROW];                                                               \
        const int64_t *tb = table + (ROW) * nb;                                                 \
        const uint8_t *mrow = (MASKED) && use_mask ? mask + (ROW) * mask_len : NULL;            \
        for (long j = (J0); j < (J1) && j * bs < n; j++) {                                      \
            const long blk = tb[j];                                                             \
            const int ns = (int)(n - j * bs < bs ? n - j * bs : bs);                            \
            Next nx = {0, 0, (KROW), (VROW)};                                                   \
            if (j + 1 < (J1) && (j + 1) * bs < n)                                               \
                nx.k = (const char *)(KRAW(tb[j + 1])), nx.v = (const char *)(VRAW(tb[j + 1])); \
            STAGE(blk, ns);                                                                     \
            fold((LN), kb, kstride, vb, vstride, ns, mrow ? mrow + j * bs : NULL,               \
                 nx.k ? &nx : NULL);                                                            \
        }                                                                                       \
    } while (0)

#define WALK(STAGE, KRAW, VRAW, KROW, VROW)                                                     \
    const Fold fold = fold_for(d, dv);                                                          \
    const int per_group = (int)(MAX_G / g);                                                     \
    for (long h = 0; h < H; h++) {                                                              \
        for (long b = 0; b < B; b++) done[b] = 0;                                               \
        for (long b = 0; b < B; b++) {                                                          \
            if (done[b]) continue;                                                              \
            long rows[MAX_G];                                                                   \
            int n_rows = 0;                                                                     \
            for (long b2 = b; b2 < B && n_rows < per_group; b2++)                               \
                if (!done[b2] && table[(b2 * H + h) * nb] == table[(b * H + h) * nb])            \
                    rows[n_rows++] = b2 * H + h;                                                \
            long shared = 0;                                                                    \
            if (n_rows > 1)                                                                     \
                shared = shared_blocks(table, lens, mask, use_mask, mask_len, rows, n_rows, bs, nb); \
            if (shared == 0) n_rows = 1; /* nothing in common: b alone */                       \
            if (n_rows > 1) { /* the shared blocks, every key in them kept (shared_blocks) */  \
                start_group(S, q, rows, n_rows, (int)g, (int)d, (int)dv, scale);                \
                FOLD_BLOCKS(S, rows[0], 0, shared, 0, STAGE, KRAW, VRAW, KROW, VROW);           \
            }                                                                                   \
            for (int i = 0; i < n_rows; i++) {                                                  \
                const long row = rows[i]; /* rows[0] is b's own lane */                         \
                if (n_rows > 1)                                                                 \
                    take_heads(S, i * (int)g, (int)g, L);                                       \
                else                                                                            \
                    start_group(L, q, &rows[i], 1, (int)g, (int)d, (int)dv, scale);             \
                FOLD_BLOCKS(L, row, n_rows > 1 ? shared : 0, nb, 1, STAGE, KRAW, VRAW, KROW, VROW); \
                finish_lane(L, out + row * g * dv);                                             \
                done[row / H] = 1;                                                              \
            }                                                                                   \
        }                                                                                       \
    }

/* A lane's state and a float buffer for one block's widened K and V rows (bf16 and int8
 * pools); nonzero when out of memory. */
static int staged_lane(Lane **L, float **kb, long bs, long d, long dv) {
    *L = aligned_alloc(64, sizeof(Lane)); /* 64-byte vectors inside */
    *kb = malloc(sizeof(float) * (size_t)(bs * (d + dv)));
    if (*L && *kb) return 0;
    free(*L), free(*kb);
    return 1;
}

/* A walk's shared state: a group's lane and the per-sequence "done" marks; nonzero when out
 * of memory. */
static int group_state(Lane **S, char **done, long B) {
    *S = aligned_alloc(64, sizeof(Lane));
    *done = malloc((size_t)B + 1);
    if (*S && *done) return 0;
    free(*S), free(*done);
    return 1;
}

/* The start of a staged pool's loop: the shapes checked, the lane and its block buffer (kb,
 * vb: float rows of d and dv). */
#define STAGED_LANE                                                                             \
    if (unsupported(g, d, dv)) return -1;                                                       \
    Lane *L;                                                                                    \
    float *kb;                                                                                  \
    if (staged_lane(&L, &kb, bs, d, dv)) return -2;                                             \
    Lane *S;                                                                                    \
    char *done;                                                                                 \
    if (group_state(&S, &done, B)) return free(L), free(kb), -2;                                \
    float *vb = kb + bs * d;                                                                    \
    const long kstride = d, vstride = dv;

#define ARGS                                                                                    \
    const int64_t *table, const int64_t *lens, const uint8_t *mask, int use_mask, long mask_len, \
        float scale, float *out, long B, long H, long g, long d, long dv, long bs, long nb,       \
        long kw, long vw

/* float32 pool: K `[blocks, bs, kw]`, V `[blocks, bs, vw]`, read where they lie. */
int decode_f32(const float *q, const float *kp, const float *vp, ARGS) {
    if (unsupported(g, d, dv)) return -1;
    Lane *L = aligned_alloc(64, sizeof(Lane)); /* 64-byte vectors inside */
    if (!L) return -2;
    Lane *S;
    char *done;
    if (group_state(&S, &done, B)) return free(L), -2;
    const float *kb, *vb;
    const long kstride = kw, vstride = vw;
#define F32_STAGE(blk, ns) (kb = kp + (blk) * bs * kw, vb = vp + (blk) * bs * vw)
#define F32_K(blk) (kp + (blk) * bs * kw)
#define F32_V(blk) (vp + (blk) * bs * vw)
    WALK(F32_STAGE, F32_K, F32_V, kw * 4, vw * 4)
    free(L), free(S), free(done);
    return 0;
}

/* bfloat16 pool as 16-bit patterns, widened (exactly) one block at a time. */
int decode_bf16(const float *q, const uint16_t *kp, const uint16_t *vp, ARGS) {
    STAGED_LANE
#define BF16_STAGE(blk, ns)                                                                     \
    for (int s = 0; s < (ns); s++) {                                                            \
        const uint16_t *kr = kp + ((blk) * bs + s) * kw, *vr = vp + ((blk) * bs + s) * vw;      \
        for (long c = 0; c < d; c++) {                                                          \
            uint32_t u = (uint32_t)kr[c] << 16;                                                 \
            memcpy(kb + s * d + c, &u, 4);                                                      \
        }                                                                                       \
        for (long c = 0; c < dv; c++) {                                                         \
            uint32_t u = (uint32_t)vr[c] << 16;                                                 \
            memcpy(vb + s * dv + c, &u, 4);                                                     \
        }                                                                                       \
    }
#define BF16_K(blk) (kp + (blk) * bs * kw)
#define BF16_V(blk) (vp + (blk) * bs * vw)
    WALK(BF16_STAGE, BF16_K, BF16_V, kw * 2, vw * 2)
    free(L), free(kb), free(S), free(done);
    return 0;
}

/* int8 pool: codes `[blocks, bs, d]` with one float32 scale per row, dequantized one block
 * at a time. */
int decode_int8(const float *q, const int8_t *kq, const float *ksc, const int8_t *vq,
                const float *vsc, ARGS) {
    STAGED_LANE
#define INT8_STAGE(blk, ns)                                                                     \
    for (int s = 0; s < (ns); s++) {                                                            \
        const long row = (blk) * bs + s;                                                        \
        const int8_t *kr = kq + row * kw, *vr = vq + row * vw;                                  \
        const float a = ksc[row], c2 = vsc[row];                                                \
        for (long c = 0; c < d; c++) kb[s * d + c] = (float)kr[c] * a;                          \
        for (long c = 0; c < dv; c++) vb[s * dv + c] = (float)vr[c] * c2;                       \
    }
#define INT8_K(blk) (kq + (blk) * bs * kw)
#define INT8_V(blk) (vq + (blk) * bs * vw)
    WALK(INT8_STAGE, INT8_K, INT8_V, kw, vw) /* the scales: 64 bytes a block, left to the CPU */
    free(L), free(kb), free(S), free(done);
    return 0;
}

/* A prefill chunk's attention over its sequence's cached keys, on AMX tiles.
 *
 * Why: a chunk after a cached prefix (a shared system prompt, a resumed conversation) attends
 * over every cached key, and the torch path gathers the keys and values out of the pool,
 * widens or narrows them to bf16 and calls SDPA (about 0.5 ms a layer for 64 queries over
 * 576 keys on the AMX machine, most of a mixed step's attention). Here each KV head's keys
 * and values are read from the pool's blocks once, rounded to bf16 straight into the tiles'
 * layout, and both products run on AMX tiles (bf16 in, float32 sums); only the softmax runs
 * on vectors.
 *
 * Arithmetic: scores q.k in float32 sums of bf16 products, times `scale`, plus the additive
 * mask (bf16: 0 or -inf); softmax in float32 with the row's max subtracted; the unnormalized
 * weights rounded to bf16 for the second product (as torch's CPU flash attention does), its
 * float32 sums divided by the float32 sum of the weights, rounded to bf16 once at the end.
 *
 * Layout: q and out `[Hkv][R][d]` bf16 (R = query heads a KV head serves x queries); the pool
 * holds rows of `kw` (keys) and `vw` (values) elements, float32 or bf16, row
 * `block * bs + i` for the i-th key of a block; `table[h * nb + j]` is KV head h's j-th
 * block. The mask: `bias[(h * R + r) * L + l]` (bf16, additive), or with bias NULL, row r of
 * KV head h sees keys [lo[h * R + r], hi[h * R + r]) alone (a causal mask offset by the
 * prefix, a sliding window), which skips the keys outside and reads no mask. d a multiple of
 * 32, dv of 64.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int chunk_attention_ready(void) {
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

#if defined(__AMX_BF16__) && defined(__AVX512BF16__)

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* tiles 0-3: sums (16 x 16 float32), 4: A (16 rows x 32 bf16), 5-7: B (16 pairs x 16) */
static void tile_config(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* 16 elements of a pool row from element i, as bf16 (rounded to nearest even from float32) */
static inline __m256i row16(const void *pool, int bf16, long row, long width, long i) {
    if (bf16) return _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + row * width + i));
    return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)pool + row * width + i));
}

static inline long pool_row(const int64_t *blocks, long bs, long l) { return blocks[l / bs] * bs + l % bs; }

/* exp(x) for x <= 0, within about 2 ulp: x = n ln2 + r, a degree-6 polynomial for exp(r)
 * (Cephes' coefficients), scaled by 2^n. Masked lanes are zeroed by the caller. */
static inline __m512 exp_le0(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* Keys as the B operand of q.k^T (reduction over d): tile (key block kn, dim block kd) at
 * (kn * d/32 + kd) KiB; its row p holds, for each of the block's 16 keys, dims 2p and 2p + 1
 * (one 32-bit pair a key: a key's 32 dims are scattered down a column). */
static void pack_keys(const void *pool, int bf16, long kw, const int64_t *blocks, long bs, long L,
                      long Lp, long d, uint16_t *out) {
    const long kblocks = d / 32;
    const __m512i down = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
    for (long l = 0; l < Lp; l++) {
        const long kn = l / 16, n = l % 16;
        const long row = l < L ? pool_row(blocks, bs, l) : -1;
        for (long kd = 0; kd < kblocks; kd++) {
            int32_t *col = (int32_t *)(out + (kn * kblocks + kd) * 512) + n;
            __m512i pairs = _mm512_setzero_si512();
            if (row >= 0)
                pairs = _mm512_inserti64x4(_mm512_castsi256_si512(row16(pool, bf16, row, kw, kd * 32)),
                                           row16(pool, bf16, row, kw, kd * 32 + 16), 1);
            _mm512_i32scatter_epi32(col, down, pairs, 4);
        }
    }
}

/* Values as the B operand of p.v (reduction over keys): tile (dim block dn, key block kk) at
 * (dn * Lp/32 + kk) KiB; its row p holds, for each of the block's 16 dims, that dim of keys
 * 2p and 2p + 1. */
static void pack_values(const void *pool, int bf16, long vw, const int64_t *blocks, long bs, long L,
                        long Lp, long dv, uint16_t *out) {
    const long kblocks = Lp / 32;
    for (long l = 0; l < Lp; l += 2) {
        const long kk = l / 32, p = (l % 32) / 2;
        const long r0 = l < L ? pool_row(blocks, bs, l) : -1, r1 = l + 1 < L ? pool_row(blocks, bs, l + 1) : -1;
        for (long i = 0; i < dv; i += 16) {
            const __m512i zero = _mm512_setzero_si512();
            const __m512i a = r0 < 0 ? zero : _mm512_cvtepu16_epi32(row16(pool, bf16, r0, vw, i));
            const __m512i b = r1 < 0 ? zero : _mm512_cvtepu16_epi32(row16(pool, bf16, r1, vw, i));
            _mm512_store_si512(out + ((i / 16) * kblocks + kk) * 512 + p * 32,
                               _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
    }
}

/* Row r's weights under an additive mask (bias: bf16, 0 or -inf): exp(s * scale + bias -
 * max) rounded to bf16 into pr (0 where masked and past L); returns their float32 sum. */
static float weights_bias(float *sr, const uint16_t *br, long L, long Lp, float scale, uint16_t *pr) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (long l = 0; l < Lp; l += 16) {
        const __mmask16 in = l + 16 <= L ? 0xFFFF : l >= L ? 0 : (__mmask16)((1u << (L - l)) - 1);
        const __m256i b16 = _mm256_maskz_loadu_epi16(in, br + l);
        __m512 x = _mm512_fmadd_ps(_mm512_load_ps(sr + l), _mm512_set1_ps(scale),
                                   _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b16), 16)));
        x = _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), x);
        _mm512_store_ps(sr + l, x);
        vmax = _mm512_max_ps(vmax, x);
    }
    const float mx = _mm512_reduce_max_ps(vmax);
    if (mx == -INFINITY) return memset(pr, 0, (size_t)(Lp * 2)), 0.0f;
    __m512 vsum = _mm512_setzero_ps();
    for (long l = 0; l < Lp; l += 16) {
        const __m512 x = _mm512_load_ps(sr + l);
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m512 p = _mm512_maskz_mov_ps(live, exp_le0(_mm512_sub_ps(x, _mm512_set1_ps(mx))));
        vsum = _mm512_add_ps(vsum, p);
        _mm256_store_si256((__m256i *)(pr + l), (__m256i)_mm512_cvtneps_pbh(p));
    }
    return _mm512_reduce_add_ps(vsum);
}

/* lanes of the 16 keys from l that lie in [a, b) */
static inline __mmask16 span_lanes(long l, long a, long b) {
    const long first = a > l ? a - l : 0, end = b - l > 16 ? 16 : b - l;
    return end <= first ? 0 : (__mmask16)(((1u << end) - 1) & ~((1u << first) - 1));
}

/* Row r's weights when it sees keys [a, b) alone (a causal mask, a sliding window): the same
 * weights as `weights_bias` with the mask as -inf, without reading one: keys outside are
 * skipped, and the scale is applied inside the exponential. */
static float weights_span(const float *sr, long a, long b, long Lp, float scale, uint16_t *pr) {
    memset(pr, 0, (size_t)(Lp * 2));
    if (b <= a) return 0.0f;
    const long first = a / 16 * 16;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (long l = first; l < b; l += 16)
        vmax = _mm512_mask_max_ps(vmax, span_lanes(l, a, b), vmax, _mm512_load_ps(sr + l));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(vmax) * scale), vs = _mm512_set1_ps(scale);
    __m512 vsum = _mm512_setzero_ps();
    for (long l = first; l < b; l += 16) {
        const __m512 x = _mm512_fmsub_ps(_mm512_load_ps(sr + l), vs, top);
        const __m512 p = _mm512_maskz_mov_ps(span_lanes(l, a, b), exp_le0(x));
        vsum = _mm512_add_ps(vsum, p);
        _mm256_store_si256((__m256i *)(pr + l), (__m256i)_mm512_cvtneps_pbh(p));
    }
    return _mm512_reduce_add_ps(vsum);
}

/* Tiles 0-3 = A (16 rows, lda bytes apart) times four B operands of 16 columns each (`step`
 * elements apart), summed over `kblocks` blocks of 32 (A: 64 bytes a block, B: 1 KiB). */
static inline void four_tiles(const uint16_t *a, long lda, const uint16_t *b, long step, long kblocks) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long kb = 0; kb < kblocks; kb++) {
        const uint16_t *bk = b + kb * 512;
        _tile_loadd(4, a + kb * 32, lda);
        _tile_loadd(5, bk, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, bk + step, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, bk + 2 * step, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, bk + 3 * step, 64);
        _tile_dpbf16ps(3, 4, 5);
    }
}

int chunk_attention(const uint16_t *q, long Hkv, long R, long d, long dv, const void *kpool,
                    const void *vpool, int pool_bf16, long kw, long vw, const int64_t *table, long nb,
                    long bs, long L, const uint16_t *bias, const int32_t *lo, const int32_t *hi, float scale,
                    uint16_t *out) {
    if ((!bias && (!lo || !hi)) || d % 32 || dv % 64 || L < 1 || L > nb * bs) return -1;
    const long Lp = (L + 63) / 64 * 64;
    uint16_t *kt = aligned_alloc(64, (size_t)(Lp * d * 2));
    uint16_t *vt = aligned_alloc(64, (size_t)(Lp * dv * 2));
    float *s = aligned_alloc(64, (size_t)(16 * Lp * 4));
    uint16_t *pw = aligned_alloc(64, (size_t)(16 * Lp * 2));
    uint16_t *qpad = aligned_alloc(64, (size_t)(16 * d * 2));
    if (!kt || !vt || !s || !pw || !qpad) return free(kt), free(vt), free(s), free(pw), free(qpad), -2;
    float o[16][64] __attribute__((aligned(64)));
    float total[16];
    tile_config();
    for (long h = 0; h < Hkv; h++) {
        const int64_t *blocks = table + h * nb;
        pack_keys(kpool, pool_bf16, kw, blocks, bs, L, Lp, d, kt);
        pack_values(vpool, pool_bf16, vw, blocks, bs, L, Lp, dv, vt);
        for (long m0 = 0; m0 < R; m0 += 16) {
            const long rows = R - m0 < 16 ? R - m0 : 16;
            const uint16_t *qa = q + (h * R + m0) * d;
            if (rows < 16) { /* the last rows padded with zeros: the tiles take 16 */
                memset(qpad, 0, (size_t)(16 * d * 2));
                memcpy(qpad, qa, (size_t)(rows * d * 2));
                qa = qpad;
            }
            for (long n0 = 0; n0 < Lp; n0 += 64) { /* scores of 64 keys at a time */
                four_tiles(qa, d * 2, kt + (n0 / 16) * (d / 32) * 512, (d / 32) * 512, d / 32);
                _tile_stored(0, s + n0, Lp * 4);
                _tile_stored(1, s + n0 + 16, Lp * 4);
                _tile_stored(2, s + n0 + 32, Lp * 4);
                _tile_stored(3, s + n0 + 48, Lp * 4);
            }
            for (long r = 0; r < 16; r++) { /* softmax weights, unnormalized, in bf16 */
                uint16_t *pr = pw + r * Lp;
                if (r >= rows) {
                    memset(pr, 0, (size_t)(Lp * 2));
                    continue;
                }
                const long at = h * R + m0 + r;
                const long a = lo ? (lo[at] < 0 ? 0 : lo[at]) : 0, b = hi ? (hi[at] > L ? L : hi[at]) : 0;
                total[r] = bias ? weights_bias(s + r * Lp, bias + at * L, L, Lp, scale, pr)
                                : weights_span(s + r * Lp, a, b, Lp, scale, pr);
            }
            for (long dn0 = 0; dn0 < dv; dn0 += 64) { /* weights times values, 64 dims at a time */
                four_tiles(pw, Lp * 2, vt + (dn0 / 16) * (Lp / 32) * 512, (Lp / 32) * 512, Lp / 32);
                _tile_stored(0, &o[0][0], 256);
                _tile_stored(1, &o[0][16], 256);
                _tile_stored(2, &o[0][32], 256);
                _tile_stored(3, &o[0][48], 256);
                for (long r = 0; r < rows; r++) {
                    const __m512 inv = _mm512_set1_ps(total[r] > 0.0f ? 1.0f / total[r] : 0.0f);
                    uint16_t *dst = out + (h * R + m0 + r) * dv + dn0;
                    for (int c = 0; c < 64; c += 16) {
                        const __m512 y = _mm512_mul_ps(_mm512_load_ps(&o[r][c]), inv);
                        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(y));
                    }
                }
            }
        }
    }
    _tile_release();
    free(kt), free(vt), free(s), free(pw), free(qpad);
    return 0;
}

#else
int chunk_attention(const uint16_t *q, long Hkv, long R, long d, long dv, const void *kpool,
                    const void *vpool, int pool_bf16, long kw, long vw, const int64_t *table, long nb,
                    long bs, long L, const uint16_t *bias, const int32_t *lo, const int32_t *hi, float scale,
                    uint16_t *out) {
    (void)lo, (void)hi, (void)q, (void)Hkv, (void)R, (void)d, (void)dv, (void)kpool, (void)vpool;
    (void)pool_bf16;
    (void)kw, (void)vw, (void)table, (void)nb, (void)bs, (void)L, (void)bias, (void)scale, (void)out;
    return -1;
}
#endif

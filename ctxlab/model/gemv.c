/* Decode-sized matrix products y[M, N] = x[M, K] . W[N, K]^T (+ bias) for 1 <= M <= 8 rows.
 *
 * At decode the rows are few and every weight is read once a step, so the time is the bytes
 * of W over the memory bandwidth. Each block keeps all M rows' sums of a few output columns
 * in registers, streams those columns' weights once in their own dtype (float32, bfloat16,
 * int8 codes) and prefetches the next block's: without the prefetch the bf16 loop read
 * memory at 8 GB/s on the AMX machine, with it at 11-12, what a plain read reaches there.
 *
 * Arithmetic: float32 sums of exact products. bf16: x is rounded to bf16 (nearest even) once
 * a call, as oneDNN's and aten's bf16 kernels do, and multiplied by the bf16 weights with
 * the CPU's bf16 dot-product instruction where it has one (AVX512-BF16), else both widened
 * to float32. int8: the codes' products (the caller applies the rows' scales). Only the
 * order of the sums differs from torch's kernels.
 *
 * Built with -march=native for the machine it runs on (ctxlab/native.py); the same source
 * compiles to AVX-512, AVX2+FMA or scalar loops.
 */
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VLD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VLD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VLD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define NB_SMALL 4
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VLD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define VSUM(v) vsum8(v)
#define VLD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VLD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define NB_SMALL 2 /* 16 ymm registers: 4 rows x 2 columns of sums */
#else
#define VW 1
typedef float vf;
#define VZERO() 0.0f
#define VLD(p) (*(p))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSUM(v) (v)
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define VLD_BF16(p) bf16_to_f32(*(p))
#define VLD_I8(p) ((float)*(p))
#define NB_SMALL 4
#endif

static inline float f32_at(const float *p) { return *p; }
static inline float bf16_at(const uint16_t *p) {
    uint32_t u = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float i8_at(const int8_t *p) { return (float)*p; }

/* One block: MB rows of x against NB consecutive weight rows (output columns). */
#define BLOCK(NAME, WT, LOAD, AT, MB, NB)                                                        \
    static inline void NAME##_##MB##_##NB(const float *x, long K, const WT *w, long ldy, float *y) { \
        vf acc[MB][NB];                                                                          \
        for (int a = 0; a < MB; a++)                                                             \
            for (int b = 0; b < NB; b++) acc[a][b] = VZERO();                                    \
        const long step = 64 / (long)sizeof(WT);                                                 \
        long k = 0;                                                                              \
        for (; k + VW <= K; k += VW) {                                                           \
            vf wv[NB];                                                                           \
            for (int b = 0; b < NB; b++) {                                                       \
                wv[b] = LOAD(w + b * K + k);                                                     \
                if (k % step == 0) _mm_prefetch((const char *)(w + (NB + b) * K + k), _MM_HINT_T0); \
            }                                                                                    \
            for (int a = 0; a < MB; a++) {                                                       \
                vf xv = VLD(x + a * K + k);                                                      \
                for (int b = 0; b < NB; b++) acc[a][b] = VFMA(xv, wv[b], acc[a][b]);             \
            }                                                                                    \
        }                                                                                        \
        for (int a = 0; a < MB; a++)                                                             \
            for (int b = 0; b < NB; b++) {                                                       \
                float s = VSUM(acc[a][b]);                                                       \
                for (long t = k; t < K; t++) s += x[a * K + t] * AT(w + b * K + t);              \
                y[a * ldy + b] = s;                                                              \
            }                                                                                    \
    }

/* Blocks named NAME_MB_NB; X... expand their arguments first so NB_SMALL becomes a number. */
#define XBLOCK(...) BLOCK(__VA_ARGS__)
#define FN(NAME, MB, NB) NAME##_##MB##_##NB
#define XFN(NAME, MB, NB) FN(NAME, MB, NB)

/* Every (rows, columns) block of one loop: M = 1-4 rows with NB_SMALL columns a block,
 * 5-8 rows with 2, and single columns for what is left of N. */
#define ALL_BLOCKS(B, ...)                                                                       \
    B(__VA_ARGS__, 1, NB_SMALL) B(__VA_ARGS__, 2, NB_SMALL) B(__VA_ARGS__, 3, NB_SMALL)           \
    B(__VA_ARGS__, 4, NB_SMALL) B(__VA_ARGS__, 5, 2) B(__VA_ARGS__, 6, 2) B(__VA_ARGS__, 7, 2)    \
    B(__VA_ARGS__, 8, 2) B(__VA_ARGS__, 1, 1) B(__VA_ARGS__, 2, 1) B(__VA_ARGS__, 3, 1)           \
    B(__VA_ARGS__, 4, 1) B(__VA_ARGS__, 5, 1) B(__VA_ARGS__, 6, 1) B(__VA_ARGS__, 7, 1)           \
    B(__VA_ARGS__, 8, 1)

/* y[M, N] for 1 <= M <= 8 rows: the column blocks of NAME over all of W, then the bias. */
#define DRIVER(NAME, XT, WT)                                                                     \
    static void NAME##_all(const XT *x, long M, long K, const WT *W, long N, const float *bias, \
                           float *y) {                                                           \
        long n = 0;                                                                              \
        switch (M) {                                                                             \
        case 1: for (; n + NB_SMALL <= N; n += NB_SMALL) XFN(NAME, 1, NB_SMALL)(x, K, W + n * K, N, y + n); break; \
        case 2: for (; n + NB_SMALL <= N; n += NB_SMALL) XFN(NAME, 2, NB_SMALL)(x, K, W + n * K, N, y + n); break; \
        case 3: for (; n + NB_SMALL <= N; n += NB_SMALL) XFN(NAME, 3, NB_SMALL)(x, K, W + n * K, N, y + n); break; \
        case 4: for (; n + NB_SMALL <= N; n += NB_SMALL) XFN(NAME, 4, NB_SMALL)(x, K, W + n * K, N, y + n); break; \
        case 5: for (; n + 2 <= N; n += 2) NAME##_5_2(x, K, W + n * K, N, y + n); break;         \
        case 6: for (; n + 2 <= N; n += 2) NAME##_6_2(x, K, W + n * K, N, y + n); break;         \
        case 7: for (; n + 2 <= N; n += 2) NAME##_7_2(x, K, W + n * K, N, y + n); break;         \
        default: for (; n + 2 <= N; n += 2) NAME##_8_2(x, K, W + n * K, N, y + n); break;        \
        }                                                                                        \
        for (; n < N; n++) {                                                                     \
            switch (M) {                                                                         \
            case 1: NAME##_1_1(x, K, W + n * K, N, y + n); break;                               \
            case 2: NAME##_2_1(x, K, W + n * K, N, y + n); break;                               \
            case 3: NAME##_3_1(x, K, W + n * K, N, y + n); break;                               \
            case 4: NAME##_4_1(x, K, W + n * K, N, y + n); break;                               \
            case 5: NAME##_5_1(x, K, W + n * K, N, y + n); break;                               \
            case 6: NAME##_6_1(x, K, W + n * K, N, y + n); break;                               \
            case 7: NAME##_7_1(x, K, W + n * K, N, y + n); break;                               \
            default: NAME##_8_1(x, K, W + n * K, N, y + n); break;                              \
            }                                                                                    \
        }                                                                                        \
        if (bias)                                                                                \
            for (long a = 0; a < M; a++)                                                         \
                for (long j = 0; j < N; j++) y[a * N + j] += bias[j];                            \
    }

#define KERNELS(NAME, WT, LOAD, AT)                                                              \
    ALL_BLOCKS(XBLOCK, NAME, WT, LOAD, AT)                                                       \
    DRIVER(NAME, float, WT)                                                                      \
    void NAME(const float *x, long M, long K, const WT *W, long N, const float *bias, float *y) { \
        NAME##_all(x, M, K, W, N, bias, y);                                                      \
    }

KERNELS(gemv_f32, float, VLD, f32_at)
KERNELS(gemv_bf16_wide, uint16_t, VLD_BF16, bf16_at)
KERNELS(gemv_i8, int8_t, VLD_I8, i8_at)

/* x rounded to bf16 (round to nearest even, as oneDNN's and aten's bf16 kernels round their
 * input), kept as 16-bit patterns. */
static inline uint16_t round_one_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7F800000u) == 0x7F800000u) return (uint16_t)((u >> 16) | ((u & 0xFFFFu) ? 0x40u : 0u));
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 weights with the CPU's bf16 dot products: 32 products a step summed pairwise into
 * float32 lanes. Without them: x rounded the same way, widened back to float32, and the
 * widening loop (exact products of the same bf16 values, float32 sums). */
#if defined(__AVX512BF16__)
#define DP_BLOCK(NAME, MB, NB) XDP_BLOCK(NAME, MB, NB)
#define XDP_BLOCK(NAME, MB, NB)                                                                         \
    static inline void NAME##_##MB##_##NB(const uint16_t *xb, long K, const uint16_t *w, long ldy, float *y) { \
        __m512 acc[MB][NB];                                                                      \
        for (int a = 0; a < MB; a++)                                                             \
            for (int b = 0; b < NB; b++) acc[a][b] = _mm512_setzero_ps();                        \
        long k = 0;                                                                              \
        for (; k + 32 <= K; k += 32) {                                                           \
            __m512i wv[NB];                                                                      \
            for (int b = 0; b < NB; b++) {                                                       \
                wv[b] = _mm512_loadu_si512((const void *)(w + b * K + k));                       \
                _mm_prefetch((const char *)(w + (NB + b) * K + k), _MM_HINT_T0);                 \
            }                                                                                    \
            for (int a = 0; a < MB; a++) {                                                       \
                __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xb + a * K + k));      \
                for (int b = 0; b < NB; b++)                                                     \
                    acc[a][b] = _mm512_dpbf16_ps(acc[a][b], xv, (__m512bh)wv[b]);                \
            }                                                                                    \
        }                                                                                        \
        for (int a = 0; a < MB; a++)                                                             \
            for (int b = 0; b < NB; b++) {                                                       \
                float s = _mm512_reduce_add_ps(acc[a][b]);                                       \
                for (long t = k; t < K; t++) s += bf16_at(xb + a * K + t) * bf16_at(w + b * K + t); \
                y[a * ldy + b] = s;                                                              \
            }                                                                                    \
    }
ALL_BLOCKS(DP_BLOCK, dp)
DRIVER(dp, uint16_t, uint16_t)

static void round_bf16(const float *x, long n, uint16_t *out) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    for (; i < n; i++) out[i] = round_one_bf16(x[i]);
}

void gemv_bf16(const float *x, long M, long K, const uint16_t *W, long N, const float *bias, float *y) {
    uint16_t xb[M * K];
    round_bf16(x, M * K, xb);
    dp_all(xb, M, K, W, N, bias, y);
}
int gemv_bf16_dot_products(void) { return 1; }
#else
void gemv_bf16(const float *x, long M, long K, const uint16_t *W, long N, const float *bias, float *y) {
    float xr[M * K];
    for (long i = 0; i < M * K; i++) {
        uint32_t u = (uint32_t)round_one_bf16(x[i]) << 16;
        memcpy(xr + i, &u, 4);
    }
    gemv_bf16_wide(xr, M, K, W, N, bias, y);
}
int gemv_bf16_dot_products(void) { return 0; }
#endif

/* bf16 weights on AMX tiles (Intel Sapphire Rapids and later), for any number of rows: the
 * tile unit multiplies a 16 x 32 block of x by a 32 x 16 block of W in one instruction, so
 * even at 1 to 16 rows the loop is bound by reading W (1.6x oneDNN's prepacked kernel at
 * 1 to 16 rows on the AMX machine) and at prefill sizes by the tiles' own rate. W is packed
 * once into the tiles' layout (`bf16_amx_pack`); x is rounded to bf16 as above. Needs the
 * kernel's permission for the tile state (`bf16_amx_ready`, once per process); N a multiple
 * of 64 and K of 32 (the caller checks). y's rows are ldy floats apart, so a caller can split
 * the columns between threads (their weights are consecutive tiles). */
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__linux__)
#define HAVE_AMX 1
#include <math.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int bf16_amx_ready(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }

/* W [N, K] -> tiles [N / 16][K / 32][16 pairs of k][16 columns][2]: one B tile is 1 KiB of
 * consecutive bytes. */
void bf16_amx_pack(const uint16_t *W, long N, long K, uint16_t *out) {
    for (long nb = 0; nb < N / 16; nb++)
        for (long kb = 0; kb < K / 32; kb++) {
            uint16_t *t = out + (nb * (K / 32) + kb) * 512;
            for (int kp = 0; kp < 16; kp++)
                for (int n = 0; n < 16; n++) {
                    t[(kp * 16 + n) * 2] = W[(nb * 16 + n) * K + kb * 32 + kp * 2];
                    t[(kp * 16 + n) * 2 + 1] = W[(nb * 16 + n) * K + kb * 32 + kp * 2 + 1];
                }
        }
}

/* The inverse of bf16_amx_pack (weights back out, for copies and checks). */
void bf16_amx_unpack(const uint16_t *packed, long N, long K, uint16_t *W) {
    for (long nb = 0; nb < N / 16; nb++)
        for (long kb = 0; kb < K / 32; kb++) {
            const uint16_t *t = packed + (nb * (K / 32) + kb) * 512;
            for (int kp = 0; kp < 16; kp++)
                for (int n = 0; n < 16; n++) {
                    W[(nb * 16 + n) * K + kb * 32 + kp * 2] = t[(kp * 16 + n) * 2];
                    W[(nb * 16 + n) * K + kb * 32 + kp * 2 + 1] = t[(kp * 16 + n) * 2 + 1];
                }
        }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* tiles 0-3: C (rows x 16 float32), 4: A (rows x 32 bf16), 5-7: B (16 x 16 pairs) */
static void tile_config(int rows) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    for (int t = 5; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* Rows of x padded to whole tiles: as they are up to 16, else to a multiple of 16. */
static long tile_rows(long M) { return M <= 16 ? M : (M + 15) / 16 * 16; }

/* The tile loop, for either product (DP: _tile_dpbf16ps or _tile_dpbssd; CT: its sum type).
 * A: x's rows in bytes (lda a row, 64 bytes of K a tile row); B: the packed weights (1 KiB a
 * tile, bstep bytes to the next 16 columns). Each step multiplies one A tile (16 rows) by
 * four B tiles (64 columns): at decode sizes the weights stream from memory once; for more
 * rows the same 64 columns' tiles are reused from cache by every block of 16 rows. (Blocks of
 * 2 x 2 tiles, one load a product, were slower for bf16 here: 74 against 60 ms over the
 * model's linears at 128 rows.) A finished block's sums are stored to one of two buffers and
 * written out by EPI(buffer, first row, first column, rows [r0, r1)) a few rows at a time
 * inside the next block's products: the tiles are not renamed, so an epilogue between two
 * blocks left the tile unit idle (a quarter of the time at 64 rows). */
#define AMX_GEMM(DP, CT, A, lda, B, bstep, kblocks, rows_all, M, N, EPI)                          \
    do {                                                                                          \
        CT cbuf[2][4][16][16] __attribute__((aligned(64)));                                       \
        const long per_kb = (16 + (kblocks) - 1) / (kblocks);                                     \
        long done_m0 = -1, done_n0 = 0;                                                           \
        int buf = 0;                                                                              \
        tile_config((int)((rows_all) < 16 ? (rows_all) : 16));                                    \
        for (long n0 = 0; n0 < (N); n0 += 64) {                                                   \
            const char *Bn = (B) + (n0 / 16) * (bstep);                                           \
            for (long m0 = 0; m0 < (rows_all); m0 += 16) {                                        \
                const char *Am = (A) + m0 * (lda);                                                \
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);                       \
                for (long kb = 0; kb < (kblocks); kb++) {                                         \
                    _tile_loadd(4, Am + kb * 64, (lda));                                          \
                    _tile_loadd(5, Bn + kb * 1024, 64);                                           \
                    DP(0, 4, 5);                                                                  \
                    _tile_loadd(6, Bn + (bstep) + kb * 1024, 64);                                 \
                    DP(1, 4, 6);                                                                  \
                    _tile_loadd(7, Bn + 2 * (bstep) + kb * 1024, 64);                             \
                    DP(2, 4, 7);                                                                  \
                    _tile_loadd(5, Bn + 3 * (bstep) + kb * 1024, 64);                             \
                    DP(3, 4, 5);                                                                  \
                    if (done_m0 >= 0) EPI(cbuf[buf ^ 1], done_m0, done_n0, kb * per_kb, (kb + 1) * per_kb); \
                }                                                                                 \
                _tile_stored(0, cbuf[buf][0], 64); _tile_stored(1, cbuf[buf][1], 64);             \
                _tile_stored(2, cbuf[buf][2], 64); _tile_stored(3, cbuf[buf][3], 64);             \
                done_m0 = m0, done_n0 = n0, buf ^= 1;                                             \
            }                                                                                     \
        }                                                                                         \
        _tile_release();                                                                          \
        if (done_m0 >= 0) EPI(cbuf[buf ^ 1], done_m0, done_n0, 0, 16);                            \
    } while (0)

void bf16_amx(const float *x, long M, long K, const uint16_t *Wp, long N, long ldy, const float *bias,
              float *y) {
    const long rows_all = tile_rows(M);
    uint16_t *xb = aligned_alloc(64, (size_t)((rows_all * K * 2 + 63) / 64 * 64));
    if (!xb) return;
    long i = 0;
    for (; i + 16 <= M * K; i += 16)
        _mm256_storeu_si256((__m256i *)(xb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    for (; i < M * K; i++) xb[i] = round_one_bf16(x[i]);
    for (; i < rows_all * K; i++) xb[i] = 0;
#define BF16_EPI(cb, m0, n0, r0, r1)                                                              \
    do {                                                                                          \
        const long valid = M - (m0) < (r1) ? M - (m0) : (r1);                                     \
        if ((r0) >= valid) break;                                                                 \
        __m512 add[4];                                                                            \
        for (int j = 0; j < 4; j++)                                                               \
            add[j] = bias ? _mm512_loadu_ps(bias + (n0) + 16 * j) : _mm512_setzero_ps();          \
        for (long r = (r0); r < valid; r++)                                                       \
            for (int j = 0; j < 4; j++)                                                           \
                _mm512_storeu_ps(y + ((m0) + r) * ldy + (n0) + 16 * j,                            \
                                 _mm512_add_ps(_mm512_load_ps(cb[j][r]), add[j]));                \
    } while (0)
    AMX_GEMM(_tile_dpbf16ps, float, (const char *)xb, K * 2, (const char *)Wp, K / 32 * 1024, K / 32,
             rows_all, M, N, BF16_EPI);
    free(xb);
}

#else
int bf16_amx_ready(void) { return 0; }
void bf16_amx_pack(const uint16_t *W, long N, long K, uint16_t *out) { (void)W, (void)N, (void)K, (void)out; }
void bf16_amx_unpack(const uint16_t *p, long N, long K, uint16_t *W) { (void)p, (void)N, (void)K, (void)W; }
void bf16_amx(const float *x, long M, long K, const uint16_t *Wp, long N, long ldy, const float *bias,
              float *y) {
    (void)x, (void)M, (void)K, (void)Wp, (void)N, (void)ldy, (void)bias, (void)y;
}
#endif

/* int8 weights on AMX tiles: x quantized per row to int8 (symmetric: scale = max |x| / 127,
 * codes rounded to nearest even), exact int32 sums of code products, then each sum scaled
 * by its row's and its column's scale (+ bias). W: int8 codes packed once into the tiles'
 * layout (`int8_amx_pack`); N a multiple of 64 and K of 64 (the caller checks). */
#if defined(HAVE_AMX) && defined(__AMX_INT8__)
/* W [N, K] -> tiles [N / 16][K / 64][16 groups of 4 k][16 columns][4]: one B tile is 1 KiB. */
void int8_amx_pack(const int8_t *W, long N, long K, int8_t *out) {
    for (long nb = 0; nb < N / 16; nb++)
        for (long kb = 0; kb < K / 64; kb++) {
            int8_t *t = out + (nb * (K / 64) + kb) * 1024;
            for (int kq = 0; kq < 16; kq++)
                for (int n = 0; n < 16; n++)
                    for (int e = 0; e < 4; e++) t[(kq * 16 + n) * 4 + e] = W[(nb * 16 + n) * K + kb * 64 + kq * 4 + e];
        }
}

void int8_amx_unpack(const int8_t *packed, long N, long K, int8_t *W) {
    for (long nb = 0; nb < N / 16; nb++)
        for (long kb = 0; kb < K / 64; kb++) {
            const int8_t *t = packed + (nb * (K / 64) + kb) * 1024;
            for (int kq = 0; kq < 16; kq++)
                for (int n = 0; n < 16; n++)
                    for (int e = 0; e < 4; e++) W[(nb * 16 + n) * K + kb * 64 + kq * 4 + e] = t[(kq * 16 + n) * 4 + e];
        }
}

int int8_amx_available(void) { return 1; }

/* One row times blockdiag(S H, S H, ...): S = diag(signs), H the B x B Sylvester-Hadamard
 * matrix / sqrt(B) (B 16, 32 or 64), i.e. `rotation.signed_hadamard`. As a fast
 * Walsh-Hadamard transform of (row * signs): log2(B) butterfly stages, a permute and an FMA
 * per vector each, about a tenth of the B x B product's arithmetic (the product itself,
 * with MKL or in registers, took half as long again as the int8 tiles it fed). The sums
 * are the same terms in another order. */
static void rotate_row(const float *row, long K, const float *signs, long B, float *out) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i partner[4];
    __m512 sgn[4];
    for (int s = 0; s < 4; s++) { /* stage h = 1 << s inside a vector: (a, b) -> (a + b, a - b) */
        const __m512i h = _mm512_set1_epi32(1 << s);
        partner[s] = _mm512_xor_si512(lane, h);
        const __mmask16 high = _mm512_test_epi32_mask(lane, h);
        sgn[s] = _mm512_mask_blend_ps(high, _mm512_set1_ps(1.0f), _mm512_set1_ps(-1.0f));
    }
    const long nv = B / 16;
    const __m512 norm = _mm512_set1_ps(1.0f / sqrtf((float)B));
    for (long b = 0; b < K; b += B) {
        __m512 v[4];
        for (long j = 0; j < nv; j++) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(row + b + 16 * j), _mm512_loadu_ps(signs + 16 * j));
            for (int s = 0; s < 4; s++) x = _mm512_fmadd_ps(x, sgn[s], _mm512_permutexvar_ps(partner[s], x));
            v[j] = x;
        }
        for (long h = 1; h < nv; h *= 2) /* stages across vectors */
            for (long j = 0; j < nv; j++)
                if (!(j & h)) {
                    const __m512 a = v[j], c = v[j + h];
                    v[j] = _mm512_add_ps(a, c), v[j + h] = _mm512_sub_ps(a, c);
                }
        for (long j = 0; j < nv; j++) _mm512_storeu_ps(out + b + 16 * j, _mm512_mul_ps(v[j], norm));
    }
}

/* rot: NULL, or the signs of a signed Hadamard block each row of x is first multiplied by,
 * block by block (`rotate_row`: the int formats' online input rotation, `RotateInput`),
 * fused here so the rotated rows never go through memory. */
void int8_amx(const float *x, long M, long K, const int8_t *Wp, const float *wscale, long N, long ldy,
              const float *bias, float *y, const float *rot, long rot_block) {
    const long rows_all = tile_rows(M);
    int8_t *xq = aligned_alloc(64, (size_t)((rows_all * K + 63) / 64 * 64));
    float *xs = malloc(sizeof(float) * (size_t)rows_all);
    float *turned = rot ? malloc(sizeof(float) * (size_t)K) : NULL;
    if (!xq || !xs || (rot && !turned)) return free(xq), free(xs), free(turned);
    memset(xq + M * K, 0, (size_t)((rows_all - M) * K));
    for (long m = 0; m < M; m++) {
        const float *r = x + m * K;
        if (rot) {
            rotate_row(r, K, rot, rot_block, turned);
            r = turned;
        }
        __m512 vmax = _mm512_setzero_ps();
        long k = 0;
        for (; k + 16 <= K; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(r + k)));
        float amax = _mm512_reduce_max_ps(vmax);
        for (; k < K; k++) amax = fabsf(r[k]) > amax ? fabsf(r[k]) : amax;
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / scale;
        xs[m] = scale;
        const __m512 vinv = _mm512_set1_ps(inv);
        int8_t *q = xq + m * K;
        for (k = 0; k + 16 <= K; k += 16) /* rounded to nearest even, as lrintf below */
            _mm_storeu_si128((__m128i *)(q + k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(r + k), vinv))));
        for (; k < K; k++) q[k] = (int8_t)lrintf(r[k] * inv);
    }
#define INT8_EPI(cb, m0, n0, r0, r1)                                                              \
    do {                                                                                          \
        const long valid = M - (m0) < (r1) ? M - (m0) : (r1);                                     \
        if ((r0) >= valid) break;                                                                 \
        __m512 ws[4], add[4];                                                                     \
        for (int j = 0; j < 4; j++) {                                                             \
            ws[j] = _mm512_loadu_ps(wscale + (n0) + 16 * j);                                      \
            add[j] = bias ? _mm512_loadu_ps(bias + (n0) + 16 * j) : _mm512_setzero_ps();          \
        }                                                                                         \
        for (long r = (r0); r < valid; r++) {                                                     \
            const __m512 xr = _mm512_set1_ps(xs[(m0) + r]);                                       \
            for (int j = 0; j < 4; j++) {                                                         \
                const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(cb[j][r]));                 \
                _mm512_storeu_ps(y + ((m0) + r) * ldy + (n0) + 16 * j,                            \
                                 _mm512_fmadd_ps(_mm512_mul_ps(c, xr), ws[j], add[j]));           \
            }                                                                                     \
        }                                                                                         \
    } while (0)
    AMX_GEMM(_tile_dpbssd, int32_t, (const char *)xq, K, (const char *)Wp, K / 64 * 1024, K / 64,
             rows_all, M, N, INT8_EPI);
    free(xq), free(xs), free(turned);
}
#else
int int8_amx_available(void) { return 0; }
void int8_amx_pack(const int8_t *W, long N, long K, int8_t *out) { (void)W, (void)N, (void)K, (void)out; }
void int8_amx_unpack(const int8_t *p, long N, long K, int8_t *W) { (void)p, (void)N, (void)K, (void)W; }
void int8_amx(const float *x, long M, long K, const int8_t *Wp, const float *wscale, long N, long ldy,
              const float *bias, float *y, const float *rot, long rot_block) {
    (void)x, (void)M, (void)K, (void)Wp, (void)wscale, (void)N, (void)ldy, (void)bias, (void)y;
    (void)rot, (void)rot_block;
}
#endif

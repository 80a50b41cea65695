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

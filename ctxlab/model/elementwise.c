/* A decoder block's elementwise steps on float32 rows, each one pass over memory.
 *
 * aten runs each of them as several kernels with temporaries: SwiGLU's silu(gate) * up is
 * a silu pass and a product pass over a strided view (17.6 + 5 ms of a 4 x 128-token bf16
 * prefill step on the AMX machine), and RoPE's x * cos + rotate_half(x) * sin a flip, two
 * products and a sum (about 15 ms there). Decode steps pay their per-call cost instead:
 * 30 layers x 6 operators.
 *
 * exp is computed here, not called: Cody-Waite reduction by ln 2 and a degree-6 polynomial
 * on [-ln2/2, ln2/2] (Cephes' expf coefficients, within 2 ulp of the exact value), in
 * straight-line float code the compiler vectorizes; glibc's expf would keep the loop scalar.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline float exp_poly(float x) {
    /* clamped where float32's exp under- or overflows: silu(g) then gives g for g > 87
     * and a value under 1e-35 for g < -88, where float32 would hold a denormal or 0 */
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* out[m, i] = silu(gu[m, i]) * gu[m, inter + i] for gu rows of 2 * inter values (gate | up),
 * row stride `ld`; out is [rows, inter], contiguous. */
void silu_mul_f32(const float *gu, long rows, long inter, long ld, float *out) {
    for (long m = 0; m < rows; m++) {
        const float *g = gu + m * ld;
        const float *u = g + inter;
        float *o = out + m * inter;
        for (long i = 0; i < inter; i++) o[i] = g[i] / (1.0f + exp_poly(-g[i])) * u[i];
    }
}

/* RoPE in place on `heads` heads of `dim` values per token (the q and k heads of a fused
 * q|k|v row; row stride `ld`): x[i] = x[i] cos[i] + x[i + h] sin[i] and x[i + h] = x[i + h]
 * cos[i + h] + x[i] sin[i + h] for i < h = dim / 2, with rotate_half's sign folded into the
 * first half of `sin` (`layers.rope_tables`). cos and sin are [tokens, dim]. */
void rope_f32(float *x, long tokens, long heads, long dim, long ld, const float *cos,
              const float *sin) {
    const long h = dim / 2;
    for (long t = 0; t < tokens; t++) {
        const float *c = cos + t * dim;
        const float *s = sin + t * dim;
        for (long j = 0; j < heads; j++) {
            float *a = x + t * ld + j * dim;
            float *b = a + h;
            for (long i = 0; i < h; i++) {
                const float lo = a[i], hi = b[i];
                a[i] = lo * c[i] + hi * s[i];
                b[i] = hi * c[h + i] + lo * s[h + i];
            }
        }
    }
}

/* RMSNorm of float32 rows in one pass over each row and one over its output:
 * y = x * (1 / sqrt(mean(x^2) + eps)) * w, the product in aten's order.
 *
 * torch's `F.rms_norm` runs as five kernels with temporaries (square, mean, add, rsqrt,
 * two products): 19 ms of a 512-token prefill step's 61 norms on the AMX machine, 2-3 ms
 * of a 4-sequence decode step. The sum of squares is vectorised by the compiler
 * (-fassociative-math, ctxlab/native.py), so only its order differs from aten's.
 */
#include <math.h>

void rms_norm_f32(const float *x, long rows, long dim, const float *w, float eps, float *y) {
    for (long m = 0; m < rows; m++) {
        const float *xr = x + m * dim;
        float *yr = y + m * dim;
        float squares = 0.0f;
        for (long i = 0; i < dim; i++) squares += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(squares / (float)dim + eps);
        for (long i = 0; i < dim; i++) yr[i] = xr[i] * inv * w[i];
    }
}

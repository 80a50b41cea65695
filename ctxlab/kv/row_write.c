/* Writing a step's new K and V rows into the pool's slots in one call.
 *
 * The engine writes every layer's new keys and values at the slots its block table names:
 * in aten, reshapes, conversions and two index_copy_ calls: 525 us a layer for a 512-token
 * prefill of SmolLM2 (3 KV heads of 64), 16 ms over its 30 layers, and 10.8 us at a
 * 4-sequence decode step (AMX machine, 1 thread). Here one loop copies row by row (105 and
 * 6.3 us), rounding to bfloat16 for a bf16 pool as torch rounds (to
 * nearest even, NaN kept a quiet NaN). Every slot is checked against the pool's size before
 * anything is written, so a bad row changes nothing.
 */
#include <stdint.h>
#include <string.h>

static inline uint16_t to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* k and v: [tokens, heads, width] with token strides `ks`, `vs` (heads contiguous), rows:
 * [tokens * heads] slots below `slots`; kdst/vdst: [slots, width]. elem: 4 (float32 pool)
 * or 2 (bfloat16 pool). Returns 0, or -1 (nothing written) when a slot is out of range. */
int write_rows(void *kdst, void *vdst, long slots, long width, int elem, const int64_t *rows,
               long tokens, long heads, const float *k, long ks, const float *v, long vs) {
    for (long i = 0; i < tokens * heads; i++)
        if (rows[i] < 0 || rows[i] >= slots) return -1;
    for (long t = 0; t < tokens; t++) {
        for (long h = 0; h < heads; h++) {
            const int64_t r = rows[t * heads + h];
            const float *kr = k + t * ks + h * width;
            const float *vr = v + t * vs + h * width;
            if (elem == 4) {
                memcpy((float *)kdst + r * width, kr, width * sizeof(float));
                memcpy((float *)vdst + r * width, vr, width * sizeof(float));
            } else {
                uint16_t *kd = (uint16_t *)kdst + r * width, *vd = (uint16_t *)vdst + r * width;
                for (long i = 0; i < width; i++) kd[i] = to_bf16(kr[i]);
                for (long i = 0; i < width; i++) vd[i] = to_bf16(vr[i]);
            }
        }
    }
    return 0;
}

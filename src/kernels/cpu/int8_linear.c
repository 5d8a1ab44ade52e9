/* int8_linear - scalar first version of the int8 x int8 linear (per-row
 * weight scales, per-row activation scales, LLM.int8() outliers in f32,
 * SmoothQuant multipliers); the VNNI kernel replaces it. */
#include <math.h>
#include <stdlib.h>
#include "kernels/cpu/int8_linear.h"
zs_status zsk_quantize_rows_i8(const float *W, int64_t N, int64_t K, int8_t *q, float *scale)
{
    for (int64_t n = 0; n < N; n++) {
        float mx = 0;
        for (int64_t k = 0; k < K; k++) mx = fmaxf(mx, fabsf(W[n*K+k]));
        scale[n] = mx / 127;
        for (int64_t k = 0; k < K; k++) q[n*K+k] = mx ? (int8_t)roundf(W[n*K+k] / scale[n]) : 0;
    }
    return ZS_OK;
}
zs_status zsk_i8_linear(const int8_t *Wq, const float *w_scale, int64_t N, int64_t K,
                        const float *x, int64_t M, int64_t ldx, const zsk_i8_opts *o,
                        const float *bias, const float *residual, int64_t ldr, zsk_act act,
                        float *y, int64_t ldy)
{
    float *xs = malloc((size_t)K * 4); int8_t *xq = malloc((size_t)K);
    for (int64_t m = 0; m < M; m++) {
        float mx = 0;
        for (int64_t k = 0; k < K; k++) {
            xs[k] = x[m*ldx+k] * (o && o->smooth ? o->smooth[k] : 1.0f);
            if (!(o && o->threshold > 0 && fabsf(xs[k]) > o->threshold)) mx = fmaxf(mx, fabsf(xs[k]));
        }
        float sx = mx / 127;
        for (int64_t k = 0; k < K; k++) {
            bool out = o && o->threshold > 0 && fabsf(xs[k]) > o->threshold;
            xq[k] = out || !mx ? 0 : (int8_t)roundf(xs[k] / sx);
        }
        for (int64_t n = 0; n < N; n++) {
            int32_t d = 0; float f = 0;
            for (int64_t k = 0; k < K; k++) {
                d += xq[k] * Wq[n*K+k];
                if (o && o->threshold > 0 && fabsf(xs[k]) > o->threshold) f += xs[k] * (Wq[n*K+k] * w_scale[n]);
            }
            float acc = sx * w_scale[n] * (float)d + f;
            if (bias) acc += bias[n];
            if (act == ZSK_ACT_GELU_TANH)
                acc = 0.5f * acc * (1.0f + tanhf(0.7978845608f * (acc + 0.044715f * acc * acc * acc)));
            if (residual) acc += residual[m * ldr + n];
            y[m * ldy + n] = acc;
        }
    }
    free(xs); free(xq);
    return ZS_OK;
}

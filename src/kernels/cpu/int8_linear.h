/* int8_linear - scalar first version of the int8 x int8 linear (per-row
 * weight scales, per-row activation scales, LLM.int8() outliers in f32,
 * SmoothQuant multipliers); the VNNI kernel replaces it. */
#ifndef ZS_KERNELS_CPU_INT8_LINEAR_H
#define ZS_KERNELS_CPU_INT8_LINEAR_H
#include "kernels/cpu/packed_linear.h"
zs_status zsk_quantize_rows_i8(const float *W, int64_t N, int64_t K, int8_t *q, float *scale);
typedef struct zsk_i8_opts { const float *smooth; float threshold; } zsk_i8_opts;
zs_status zsk_i8_linear(const int8_t *Wq, const float *w_scale, int64_t N, int64_t K,
                        const float *x, int64_t M, int64_t ldx, const zsk_i8_opts *o,
                        const float *bias, const float *residual, int64_t ldr, zsk_act act,
                        float *y, int64_t ldy);
#endif

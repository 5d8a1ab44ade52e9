/*
 * fp8_linear.c - bench/fp8_linear: zs_linear_fp8 (FP8 with DeepSeek-V3
 * tile scales, ops/fp8.c) against zs_linear in f32 on the linear layers of
 * GPT small (width 384, 8 x 256 tokens) and GPT-2's MLP, forward alone
 * and forward + backward, best time over the rounds (interleaved: the
 * machine is shared). The FP8 forward includes quantizing x (1x128 tiles)
 * and w (128x128 blocks); its backward quantizes the gradient (e5m2) and
 * re-tiles x and g for dw. Columns: ms of each, f32/fp8 (> 1: FP8
 * faster), and the FP8 GEMM path. Usage: fp8_linear [rounds] (default 5).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/fp8.h"
#include "zs/zs.h"

typedef struct shape {
    const char *name;
    int64_t M, N, K;
} shape;

static const shape shapes[] = {
    {"gpt-s qkv 2048x1152x384", 2048, 1152, 384},
    {"gpt-s mlp up 2048x1536x384", 2048, 1536, 384},
    {"gpt-s mlp down 2048x384x1536", 2048, 384, 1536},
    {"gpt2 mlp up 1024x3072x768", 1024, 3072, 768},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds of one forward (and backward when bw) of f32 or fp8. */
static double run(bool fp8, bool bw, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                  zs_tensor *g)
{
    zs_scope_push();
    if (!bw)
        zs_no_grad_push();
    double t0 = now();
    zs_tensor *y = fp8 ? zs_linear_fp8(x, w, b) : zs_linear(x, w, b);
    if (bw && y)
        zs_backward(y, g, false);
    double t = now() - t0;
    if (!bw)
        zs_no_grad_pop();
    if (!y)
        fprintf(stderr, "fp8_linear: %s\n", zs_last_error());
    zs_zero_grad(x, true);
    zs_zero_grad(w, true);
    zs_zero_grad(b, true);
    zs_scope_pop();
    return t;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    printf("fp8 gemm path: %s, %d threads\n", zsk_gemm_fp8_path(), zs_num_threads());
    printf("%-30s %-8s %10s %10s %9s\n", "shape", "pass", "f32 ms", "fp8 ms", "f32/fp8");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const shape *sh = &shapes[s];
        zs_tensor *x = zs_uniform(ZS_F32, 2, (int64_t[]){sh->M, sh->K}, -1, 1, 1);
        zs_tensor *w = zs_uniform(ZS_F32, 2, (int64_t[]){sh->N, sh->K}, -0.05, 0.05, 2);
        zs_tensor *b = zs_uniform(ZS_F32, 1, (int64_t[]){sh->N}, -1, 1, 3);
        zs_tensor *g = zs_uniform(ZS_F32, 2, (int64_t[]){sh->M, sh->N}, -1, 1, 4);
        zs_set_requires_grad(x, true);
        zs_set_requires_grad(w, true);
        zs_set_requires_grad(b, true);
        for (int bw = 0; bw < 2; bw++) {
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < rounds; r++)
                for (int f = 0; f < 2; f++) {
                    double t = run(f, bw, x, w, b, g);
                    if (t < best[f])
                        best[f] = t;
                }
            printf("%-30s %-8s %10.2f %10.2f %9.2f\n", sh->name,
                   bw ? "fwd+bwd" : "fwd", 1e3 * best[0], 1e3 * best[1],
                   best[0] / best[1]);
        }
        zs_release(x);
        zs_release(w);
        zs_release(b);
        zs_release(g);
    }
    return 0;
}

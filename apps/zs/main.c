/*
 * main.c - the `zs` command: dispatches to subcommands.
 *
 *   zs sysinfo        CPU features, threads, measured peak and bandwidth
 *   zs ops            operators x devices x dtypes, forward and backward
 *   zs demo           a small autograd demo
 *   zs train          train LeNet-5 / a small ResNet on Fashion-MNIST
 *   zs eval           evaluate a checkpoint
 *   zs generate, quantize, serve   text from a GPT checkpoint
 */
#include <stdio.h>
#include <string.h>

#include "apps/zs/commands.h"
#include "zs/zs.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"sysinfo", cmd_sysinfo, "print CPU features, threads and measured peaks"},
    {"ops", cmd_ops, "print the operator table: kernels per device and dtype"},
    {"demo", cmd_demo, "fit a tiny model with autograd and print the losses"},
    {"train", cmd_train, "train a model: zs train lenet|resnet [flags]"},
    {"generate", cmd_generate, "sample text from a GPT checkpoint: many prompts, batched"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server on a GPT checkpoint"},
    {"quantize", cmd_quantize, "write a GPT checkpoint quantized: q8_0, q4_0, q4_1, int8, w8a8"},
    {"eval", cmd_eval, "evaluate a CNN checkpoint: accuracy, confusion matrix"},
    {"analyze", cmd_analyze, "FLOPs, memory, communication, roofline of a large model"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: zs COMMAND [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`zs COMMAND --help` describes a command's flags.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* Under mpirun every rank joins the world first (a no-op otherwise). */
    if (zs_dist_init(&argc, &argv) != ZS_OK) {
        fprintf(stderr, "zs: %s\n", zs_last_error());
        return 2;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            zs_dist_finalize();
            return rc;
        }
    }
    zs_dist_finalize();
    fprintf(stderr, "zs: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

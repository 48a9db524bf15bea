/* moh: command-line entry point. One subcommand per file (cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "moh.h"
#include "ops/gemm.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand SUBCOMMANDS[] = {
    {"train", cmd_train, "train any family: a MoH (or dense) LM on text (--init: continue-tune a pretrained one), a ViT or a DiT on IDX images"},
    {"eval", cmd_eval, "LM: bits per byte, head shares; ViT: accuracy, confusion; DiT: noise MSE, or class accuracy and FID of samples"},
    {"sample", cmd_sample, "generate text (KV cache, only selected heads run; .gguf, folders), or DiT images as a PNG grid"},
    {"chat", cmd_chat, "chat with a ChatML instruct model (.gguf: SmolLM2-Instruct, Qwen), streaming"},
    {"tokenize", cmd_tokenize, "the token ids of a text under a model's vocabulary (BPE from a GGUF, or bytes)"},
    {"convert", cmd_convert, "a model between moh / Hugging Face folders and GGUF (llama.cpp) files; --to-moh: MHA -> MoH"},
    {"analyze", cmd_analyze, "head load, routing scores, head similarity and rank over labelled data"},
    {"layer", cmd_layer, "run one MoH attention layer on safetensors inputs (parity with PyTorch)"},
    {"bench", cmd_bench, "benchmarks: attention layer, KV-cache decode, training of any model family (dense vs MoH)"},
};

static void usage(FILE *f) {
    fprintf(f, "moh %s: train, run and analyse Mixture-of-Head attention transformers\n\n", MOH_VERSION);
    fprintf(f, "usage: moh <command> [options]   (moh <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++)
        fprintf(f, "  %-8s %s\n", SUBCOMMANDS[i].name, SUBCOMMANDS[i].summary);
    fprintf(f, "\nmoh --list-configs   the named model configs (--config NAME)\nmoh --version        version and GEMM library\n");
}

int main(int argc, char **argv) {
    /* How OpenMP threads wait between parallel regions, unless the user chose (OMP_WAIT_POLICY or
     * GOMP_SPINCOUNT): a short spin, then sleep. Measured on a 2-core Xeon (docs/benchmarks.md,
     * Wait policy): against passive it decodes 1.7x faster on a quiet machine and 1.1-1.6x with
     * the other core busy, trains within 5%; spinning without bound (active, or libgomp's default
     * 300000) lost up to 21% and, once, decoded at 4.6 tokens/s on a busy machine. libgomp reads
     * the variable when it loads: re-exec once. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && argc > 0) {
        setenv("GOMP_SPINCOUNT", MOH_SPINCOUNT, 1);
        execv("/proc/self/exe", argv);
        /* exec failed (no /proc): carry on with libgomp's default */
    }
    if (argc == 3 && !strcmp(argv[1], "help")) /* moh help CMD = moh CMD --help */
        for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++)
            if (!strcmp(argv[2], SUBCOMMANDS[i].name)) {
                char *sub[] = {argv[2], "--help", NULL};
                return SUBCOMMANDS[i].run(2, sub);
            }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--list-configs")) return cli_list_configs(stdout);
    if (!strcmp(argv[1], "--version")) {
        printf("moh %s (GEMM: %s)\n", MOH_VERSION, gemm_library());
        return 0;
    }
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++)
        if (!strcmp(argv[1], SUBCOMMANDS[i].name)) return SUBCOMMANDS[i].run(argc - 1, argv + 1);
    const char *names[sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]];
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++) names[i] = SUBCOMMANDS[i].name;
    const int k = args_nearest(argv[1], names, (int)(sizeof names / sizeof names[0]));
    if (k >= 0)
        fprintf(stderr, "moh: unknown command '%s'; did you mean '%s'? (run 'moh --help' for the list)\n", argv[1], names[k]);
    else
        fprintf(stderr, "moh: unknown command '%s' (run 'moh --help' for the list)\n", argv[1]);
    return 2;
}

/* moh bench: the benchmarks behind every speed claim (sources in bench/; results in docs/benchmarks.md). */
#include <stdio.h>
#include <string.h>

#include "../bench/bench.h"
#include "args.h"
#include "cli.h"

int cmd_bench(int argc, char **argv) {
    static const char *usage =
        "usage: moh bench <attention|decode|train> [options]   (moh bench <name> --help)\n\n"
        "  attention  one MoH attention layer, dense MHA vs MoH at several active-head shares:\n"
        "             ms, GFLOP/s, speedup, ideal speedup, efficiency, memory\n"
        "  decode     tokens/s of KV-cache generation at contexts 512, 2048, 8192; with --model PATH, a\n"
        "             loaded model's prefill and decode tokens/s (a .gguf, a Hugging Face folder, a checkpoint)\n"
        "  train      training tokens/s of any model family (forward + backward + AdamW), dense vs MoH configs\n";
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "attention")) return bench_attention(argc - 1, argv + 1);
    if (!strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train")) return bench_train(argc - 1, argv + 1);
    static const char *const names[] = {"attention", "decode", "train"};
    const int j = args_nearest(argv[1], names, 3);
    if (j >= 0) fprintf(stderr, "moh bench: unknown benchmark '%s'; did you mean '%s'?\n", argv[1], names[j]);
    else fprintf(stderr, "moh bench: unknown benchmark '%s' (attention, decode or train)\n", argv[1]);
    return 2;
}

/* The benchmarks behind `moh bench` (cli/cmd_bench.c dispatches): every speed claim in
 * docs/benchmarks.md comes from one of these. Wall-clock timing with omp_get_wtime; configurations
 * compared with each other are interleaved repeat by repeat, so a slow period of a shared machine
 * hits all of them alike. Tables go to stdout (or a JSON array with --json), progress to stderr. */
#ifndef MOH_BENCH_H
#define MOH_BENCH_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* `moh bench attention|decode|train`: argc/argv start at the benchmark name. Exit codes as the
 * CLI: 0 ok, 1 runtime error, 2 usage error. */
int bench_attention(int argc, char **argv);
/* `moh bench attention --device cuda` (bench/attention_cuda.c; bench_attention hands over). */
int bench_attention_cuda(int argc, char **argv);
int bench_decode(int argc, char **argv);
int bench_train(int argc, char **argv);

/* `moh bench decode --model PATH ...` (bench/decode_model.c; bench_decode parses the options). */
#define BDM_MAX_CTX 8
#define BDM_MAX_MODELS 4
#define BDM_MAX_PREC 11 /* fp32, bf16, gguf and the 8 quantised types: each at most once */
typedef struct bdm_opts {
    const char *models[BDM_MAX_MODELS]; /* .gguf files, Hugging Face folders or moh checkpoints */
    int nmodels;
    int ctxs[BDM_MAX_CTX];              /* prompt lengths in tokens */
    int nc;
    int tokens;                         /* new tokens decoded after each prompt */
    int repeats;                        /* 1..64 */
    uint64_t seed;                      /* prompt ids: splitmix64(seed) % vocab */
    const char *text;                   /* or the tokens of this file, repeated (NULL: random) */
    bool json, profile;                 /* JSON rows; per-phase times (text: a table per row) */
    const char *prec[BDM_MAX_PREC];     /* precisions to run, interleaved (at least one): "fp32", "bf16",
                                         * "gguf" (the file's own quantised blocks), "q8_0" .. "q6_K" */
    int nprec;
} bdm_opts;
/* Prefill and decode tokens/s of each model (prints the table); 0 ok, 1 runtime error. */
int bench_decode_models(const bdm_opts *o);

/* A uniform draw with standard deviation sd from the splitmix64 state s (synthetic weights and inputs). */
float bench_rng_sd(uint64_t *s, double sd);

/* Timing statistics of one configuration: n samples in seconds. */
typedef struct bench_stats {
    double median, min, max;
} bench_stats;
/* Sorts t[0..n) in place and returns median / min / max (n >= 1). */
bench_stats bench_summarise(double *t, int n);

/* "model name" of /proc/cpuinfo (or "unknown") into out[cap]. */
void bench_cpu_model(char *out, size_t cap);
/* One line naming the GEMM library and, for oneDNN, the ISA its kernels run (e.g.
 * "oneDNN dnnl_sgemm (oneDNN 2.6.3, ISA avx512_core_bf16)") into out[cap]. */
void bench_gemm_line(char *out, size_t cap);
/* Best of `reps` float32 GEMMs M x N x K through gemm_f32 (all threads), in GFLOP/s. */
double bench_sgemm_gflops(int M, int N, int K, int reps);

/* The precisions a `--precision fp32|bf16|both` value asks for (*fp32, *bf16), bf16 dropped with
 * one line on stderr ("moh bench CMD: ... runs fp32 only: why") where the CPU lacks it; line[cap]
 * gets precision_describe's text for bf16 (else ""). */
void bench_precisions(const char *cmd, const char *value, bool *fp32, bool *bf16, char *line, size_t cap);

/* CPU seconds used by the whole process so far (all threads). With passive waits idle threads
 * sleep at once, with moh's default GOMP_SPINCOUNT after ~0.1 ms, so a run's CPU time is about its
 * work, whatever else the machine runs: a contention-robust companion of the wall time. */
double bench_cpu_seconds(void);
/* One line describing the conditions: threads, load average (1 min), OMP_WAIT_POLICY, GOMP_SPINCOUNT. */
void bench_conditions(char *out, size_t cap);

/* Parses a comma-separated list of positive integers / numbers into out[max]; returns the count,
 * or -1 on a malformed list. */
int bench_parse_ints(const char *s, int *out, int max);
int bench_parse_doubles(const char *s, double *out, int max);

/* Writes s as a JSON string literal (with quotes). */
void bench_json_str(FILE *f, const char *s);

#endif

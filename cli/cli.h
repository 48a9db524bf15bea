/* Subcommands of the moh CLI: each takes argc/argv after the subcommand name, returns an exit
 * code (0 success, 1 runtime error, 2 usage error) and prints errors as one line to stderr. */
#ifndef MOH_CLI_H
#define MOH_CLI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "ops/bf16.h"

int cmd_layer(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
/* moh sample on an image-generation checkpoint (cmd_sample hands it over). */
int cmd_sample_image(int argc, char **argv);
/* moh eval --classifier on an image-generation checkpoint (cmd_eval hands it over). */
int cmd_eval_image(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);

/* Classes of an image-generation model (DiT): rows of its label table minus the null class; 0 if
 * it has none. */
struct model;
int cli_image_classes(const struct model *m);
/* A generated pixel in [-1, 1] as a byte 0..255 (rounded, clipped), as PNG and IDX files hold it. */
unsigned char cli_pixel_byte(float v);

/* A config given as a file path, or as a NAME found as configs/NAME.json in the working directory
 * or beside the executable (../configs, or ../share/moh/configs once installed). Writes the path
 * found to out; false if none. */
bool cli_resolve_config(const char *name, char *out, size_t cap);

/* moh --list-configs: every named config, one line each (model, size, heads active), to f.
 * Returns 0, or 1 (message on stderr) when no config folder is found. */
int cli_list_configs(FILE *f);
/* The named config nearest to a mistyped name (moh75 -> moh-75) into out; false if none is close. */
bool cli_suggest_config(const char *name, char *out, size_t cap);
/* Prints "moh CMD: --config 'X': no such file ..." with the nearest named config, if any. */
void cli_config_not_found(const char *cmd, const char *config);

/* --precision fp32|bf16 (an ARG_CHOICE spec whose dst is a const char *): the help line, and the
 * value (NULL or "fp32": fp32). */
/* GOMP_SPINCOUNT moh runs with when the user sets neither it nor OMP_WAIT_POLICY (cli/moh.c):
 * OpenMP threads spin this many rounds (about 0.1 ms) at a barrier, then sleep. */
#define MOH_SPINCOUNT "10000"

#define CLI_PRECISION_HELP "compute precision: fp32, or bf16 (GEMMs and attention tiles in bf16 with fp32 accumulation and fp32 master weights; softmax, norms, router and losses fp32); a CPU without AVX512-BF16/AMX-BF16 runs fp32 and says so"
#define CLI_PRECISION_SPEC(dst) {"--precision", ARG_CHOICE, (dst), "fp32|bf16", CLI_PRECISION_HELP, false, ARG_ANY}
bool cli_precision_bf16(const char *value);
/* --precision auto|fp32|bf16 of the commands that choose by measurement (train, eval): the help
 * line, the spec (dst: const char *, NULL = auto) and the value. */
#define CLI_PRECISION_AUTO_HELP "compute precision: auto (default: the faster of fp32 and bf16 on this CPU for this model and batch shape, measured on a synthetic batch at the start and cached per CPU in ~/.cache/moh/precision.tsv; named with both times on the start line), fp32, or bf16 (GEMMs and attention tiles in bf16 with fp32 accumulation and fp32 master weights; softmax, norms, router and losses fp32; a CPU without AVX512-BF16/AMX-BF16 runs fp32 and says so)"
#define CLI_PRECISION_AUTO_SPEC(dst) {"--precision", ARG_CHOICE, (dst), "auto|fp32|bf16", CLI_PRECISION_AUTO_HELP, false, ARG_ANY}
moh_precision cli_precision_parse(const char *value);
/* --device auto|cpu|cuda (an ARG_CHOICE spec whose dst is a const char *; NULL: auto). */
#define CLI_DEVICE_HELP "compute device: auto (default: CUDA where moh was built with it, a GPU is present and the CUDA backend runs this model, else the CPU, train says why), cpu, or cuda (an error where it cannot run)"
#define CLI_DEVICE_SPEC(dst) {"--device", ARG_CHOICE, (dst), "auto|cpu|cuda", CLI_DEVICE_HELP, false, ARG_ANY}
/* The backend (src/backend/backend.h) that runs model_type for --device value: 0 with *be set (auto
 * falls back to the CPU silently; train's start line says why), or 1 after "moh CMD: --device
 * cuda: WHY" on stderr. */
struct moh_backend;
int cli_device(const char *cmd, const char *value, const char *model_type, const struct moh_backend **be);
/* The precision a command runs for --precision value (NULL: fp32), with one line on stderr when
 * bf16 was asked: "moh CMD: --precision bf16 runs fp32: WHY" (no bf16 hardware) or
 * "moh CMD: compute bf16 (...)" (precision_describe). */
moh_precision cli_precision_run(const char *cmd, const char *value);
/* Whether KV-cache decoding (moh sample, moh chat) runs bf16 for --precision value: false for
 * fp32, and with one line on stderr ("moh CMD: --precision bf16: decoding runs fp32 (WHY)") on a
 * CPU that cannot (attn_decode_precision). */
bool cli_decode_bf16(const char *cmd, const char *value);
/* --precision of KV-cache decoding (moh sample, moh chat): the spec, its help, and the cache. */
#define CLI_DECODE_PRECISION_HELP "decode with: fp32; bf16 (a bf16 copy of the weights and a bf16 KV cache, fp32 accumulation; fp32 on a CPU without AVX-512, said); q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K or q6_K (the matrix-vector weights quantised into ggml's blocks as moh convert --outtype writes them, multiplied on the CPU's integer units as llama.cpp does, bf16 KV cache). Default: a quantised .gguf decodes from its own blocks (its matrices of those types; others fp32), anything else fp32"
#define CLI_DECODE_PRECISION_SPEC(dst) {"--precision", ARG_CHOICE, (dst), "fp32|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_K|q5_K|q6_K", CLI_DECODE_PRECISION_HELP, false, ARG_ANY}
/* The KV cache of max_T tokens decoding model m (a text model) as --precision value asks
 * (CLI_DECODE_PRECISION_HELP): lm_kv_init, _bf16 or _quant; a table quantised here is held in
 * *own (quant_table_free it after lm_kv_free; zeroed otherwise). Says on stderr what decodes how
 * unless it is plain fp32. MOH_OK or the error in err (nothing to free). */
struct lm_kv_cache;
struct quant_table;
int cli_decode_kv(const char *cmd, const char *value, const struct model *m, struct lm_kv_cache *kv, int max_T,
                  struct quant_table *own, moh_error *err);
/* false, with "moh CMD: OPT OUT would overwrite ..., an input of this command: ..." on stderr, when
 * the output file path out (NULL: true) is one of inputs[n] or a file moh reads in an input folder
 * (fs_check_output), empty, a device or FIFO, or a folder (or ends in '/'). */
bool cli_output_ok(const char *cmd, const char *opt, const char *out, const char *const *inputs, int n);

/* `moh eval` / `moh analyze` progress on stderr: on a terminal a line updated in place and erased
 * at the end; otherwise a line only once the run has taken 2 s, then every 10 s, and a last line.
 * stdout is never written. done/total count `unit`s (e.g. "predictions", "images"). */
typedef struct eval_progress {
    double t0, last;
    bool tty, shown;
    const char *unit;
    const char *cmd;  /* the lines' prefix (NULL: "moh eval") */
    const char *detail; /* what the count is made of, after it (NULL: nothing) */
} eval_progress;
void eval_progress_start(eval_progress *pg, const char *unit);
void eval_progress_update(eval_progress *pg, long done, long total);
/* eval_progress_update as a moh_progress callback (pg: an eval_progress). */
void eval_progress_report(void *pg, long done, long total);
void eval_progress_end(eval_progress *pg, long total); /* total < 0: the run failed, no last line */
/* The detail of a DiT sampling count (steps of every batch): "S sampler steps x N batches of up to
 * B images", written to buf (returned). */
const char *cli_sampling_detail(char *buf, size_t size, int steps, long images, int batch);
#endif

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "train/train_util.h"
#include "core/fsutil.h"
#include "ops/bf16.h"
#include "attn/attn.h"
#include "backend/backend.h"
#include "models/lm_decode.h"
#include "models/model.h"

static bool readable(const char *p) { return access(p, R_OK) == 0; }

enum { CONFIG_DIRS = 3 };

/* The folders searched for named configs, in order: ./configs, then beside the executable
 * ../configs (a build tree) and ../share/moh/configs (make install). dirs[i] has PATH_MAX bytes;
 * an entry that cannot be formed is "". */
static void config_dirs(char dirs[CONFIG_DIRS][PATH_MAX]) {
    char exe[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
    }
    snprintf(dirs[0], PATH_MAX, "configs");
    dirs[1][0] = dirs[2][0] = 0;
    static const char *const rel[2] = {"/../configs", "/../share/moh/configs"};
    const size_t len = n > 0 ? strlen(exe) : 0;
    for (int i = 0; i < 2 && n > 0; i++) /* the checked length keeps -Wformat-truncation quiet */
        if (len + strlen(rel[i]) < PATH_MAX) {
            memcpy(dirs[1 + i], exe, len);
            memcpy(dirs[1 + i] + len, rel[i], strlen(rel[i]) + 1);
        }
}

bool cli_resolve_config(const char *name, char *out, size_t cap) {
    if (readable(name)) {
        snprintf(out, cap, "%s", name);
        return true;
    }
    char dirs[CONFIG_DIRS][PATH_MAX];
    config_dirs(dirs);
    for (int i = 0; i < CONFIG_DIRS; i++) {
        if (!dirs[i][0]) continue;
        snprintf(out, cap, "%s/%s.json", dirs[i], name);
        if (readable(out)) return true;
    }
    return false;
}

typedef struct named_config {
    char *name, *path;
} named_config;

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const named_config *)a)->name, ((const named_config *)b)->name);
}

/* One line for config file `path` named `name`: model, parameter count (from the model's tensor
 * registry), heads active per token; or the parser's error. */
static void describe_config(FILE *f, const char *name, const char *path) {
    moh_error err = {0};
    model m;
    if (model_from_config_file(&m, path, &err)) {
        fprintf(f, "  %-16s (%s)\n", name, err.msg);
        return;
    }
    char size[112];
    m.fam->describe(m.cfg, m.n, size, sizeof size);
    const moh_attn_config *a = model_attn(&m);
    const int heads = a->n_heads, hs = a->shared_heads, k = a->top_k;
    const moh_router router = a->router;
    const char *rname = attn_router_name(router);
    bool per_layer = false; /* layers differ in shared / top-k heads (DiT) */
    for (int l = 1; l < model_num_layers(&m); l++)
        per_layer = per_layer || model_attn_layer(&m, l)->shared_heads != model_attn_layer(&m, 0)->shared_heads ||
                    model_attn_layer(&m, l)->top_k != model_attn_layer(&m, 0)->top_k;
    if (per_layer)
        fprintf(f, "  %-16s %-58s %s per layer: %.2f/%d heads on average (%.1f%%)\n", name, size, rname,
                model_active_heads(&m), heads, 100.0 * model_active_heads(&m) / heads);
    else if (router == MOH_ROUTER_NONE)
        fprintf(f, "  %-16s %-58s dense: %d/%d heads\n", name, size, heads, heads);
    else
        fprintf(f, "  %-16s %-58s %s: %d shared + top-%d of %d = %d/%d heads (%.1f%%)\n", name, size, rname, hs, k,
                heads - hs, hs + k, heads, heads ? 100.0 * (hs + k) / heads : 0.0);
    model_free(&m);
}

/* The named configs of every config folder (an earlier folder's name wins, as in --config), at
 * most max, sorted by name; each name and path malloc'd (free with free_configs). */
static int scan_configs(named_config *cfgs, int max) {
    char dirs[CONFIG_DIRS][PATH_MAX];
    config_dirs(dirs);
    int n = 0;
    for (int i = 0; i < CONFIG_DIRS; i++) {
        DIR *d = dirs[i][0] ? opendir(dirs[i]) : NULL;
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d)) && n < max;) {
            const size_t len = strlen(e->d_name);
            if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
            bool seen = false;
            for (int k = 0; k < n && !seen; k++)
                seen = strlen(cfgs[k].name) == len - 5 && !strncmp(cfgs[k].name, e->d_name, len - 5);
            if (seen) continue;
            cfgs[n].name = strndup(e->d_name, len - 5);
            cfgs[n].path = malloc(strlen(dirs[i]) + len + 2);
            if (!cfgs[n].name || !cfgs[n].path) {
                free(cfgs[n].name);
                free(cfgs[n].path);
                break;
            }
            sprintf(cfgs[n].path, "%s/%s", dirs[i], e->d_name);
            n++;
        }
        closedir(d);
    }
    qsort(cfgs, (size_t)n, sizeof cfgs[0], cmp_named);
    return n;
}

static void free_configs(named_config *cfgs, int n) {
    for (int i = 0; i < n; i++) {
        free(cfgs[i].name);
        free(cfgs[i].path);
    }
}

enum { MAX_CONFIGS = 256 };

bool cli_suggest_config(const char *name, char *out, size_t cap) {
    named_config cfgs[MAX_CONFIGS];
    const int n = scan_configs(cfgs, MAX_CONFIGS);
    const char *names[MAX_CONFIGS];
    for (int i = 0; i < n; i++) names[i] = cfgs[i].name;
    const int k = args_nearest(name, names, n);
    if (k >= 0) snprintf(out, cap, "%s", cfgs[k].name);
    free_configs(cfgs, n);
    return k >= 0;
}

void cli_config_not_found(const char *cmd, const char *config) {
    char near[256];
    if (cli_suggest_config(config, near, sizeof near))
        fprintf(stderr, "moh %s: --config '%s': no such file, and no configs/%s.json; did you mean '%s'? "
                "(moh --list-configs)\n", cmd, config, config, near);
    else
        fprintf(stderr, "moh %s: --config '%s': no such file, and no configs/%s.json (moh --list-configs)\n", cmd,
                config, config);
}

int cli_list_configs(FILE *f) {
    named_config cfgs[MAX_CONFIGS];
    const int n = scan_configs(cfgs, MAX_CONFIGS);
    if (n == 0) {
        fprintf(stderr, "moh: no named configs found (looked in ./configs and beside the executable)\n");
        return 1;
    }
    fprintf(f, "named configs (moh train --config NAME; a JSON file path works too):\n");
    for (int i = 0; i < n; i++) describe_config(f, cfgs[i].name, cfgs[i].path);
    free_configs(cfgs, n);
    return 0;
}

void eval_progress_start(eval_progress *pg, const char *unit) {
    memset(pg, 0, sizeof *pg);
    pg->t0 = pg->last = train_now_s();
    pg->tty = isatty(2);
    pg->unit = unit;
}

void eval_progress_update(eval_progress *pg, long done, long total) {
    const double t = train_now_s(), el = t - pg->t0;
    if (pg->tty ? t - pg->last < 0.25 : el < 2.0 || (pg->shown && t - pg->last < 10.0)) return;
    char eta[32];
    const double rate = el > 0 ? (double)done / el : 0.0;
    train_fmt_time(eta, sizeof eta, rate > 0 ? (double)(total - done) / rate : 0.0);
    fprintf(stderr, "%s%s: %3.0f%% (%ld / %ld %s%s%s), %.0f %s/s, ETA %s%s", pg->tty ? "\r" : "",
            pg->cmd ? pg->cmd : "moh eval", total ? 100.0 * (double)done / (double)total : 100.0, done, total, pg->unit,
            pg->detail ? ": " : "", pg->detail ? pg->detail : "", rate, pg->unit, eta, pg->tty ? "\033[K" : "\n");
    fflush(stderr);
    pg->shown = true;
    pg->last = t;
}

void eval_progress_report(void *pg, long done, long total) { eval_progress_update(pg, done, total); }

void eval_progress_end(eval_progress *pg, long total) {
    if (!pg->shown) return;
    if (pg->tty || total < 0) {
        if (pg->tty) fputs("\r\033[K", stderr);
        return;
    }
    char el[32];
    train_fmt_time(el, sizeof el, train_now_s() - pg->t0);
    fprintf(stderr, "%s: 100%% (%ld %s%s%s) in %s\n", pg->cmd ? pg->cmd : "moh eval", total, pg->unit,
            pg->detail ? ": " : "", pg->detail ? pg->detail : "", el);
}

const char *cli_sampling_detail(char *buf, size_t size, int steps, long images, int batch) {
    const long nb = (images + batch - 1) / batch;
    snprintf(buf, size, "%d sampler steps x %ld batch%s of up to %d images", steps, nb, nb == 1 ? "" : "es", batch);
    return buf;
}

bool cli_precision_bf16(const char *value) { return value && !strcmp(value, "bf16"); }

moh_precision cli_precision_parse(const char *value) {
    return !value || !strcmp(value, "auto") ? MOH_PRECISION_AUTO
           : !strcmp(value, "bf16")         ? MOH_PRECISION_BF16
                                            : MOH_PRECISION_FP32;
}

bool cli_decode_bf16(const char *cmd, const char *value) {
    if (!cli_precision_bf16(value)) return false;
    char why[160];
    if (attn_decode_precision(MOH_PRECISION_BF16, why, sizeof why) == MOH_PRECISION_BF16) return true;
    fprintf(stderr, "moh %s: --precision bf16: decoding runs fp32 (%s)\n", cmd, why);
    return false;
}

int cli_decode_kv(const char *cmd, const char *value, const model *m, lm_kv_cache *kv, int max_T, quant_table *own,
                  moh_error *err) {
    const moh_lm_config *cfg = m->cfg;
    const lm_params_f32 *p = m->params;
    memset(own, 0, sizeof *own);
    int type = 0;
    const quant_table *qt = NULL;
    const char *from = "";
    if (value && strcmp(value, "fp32") && strcmp(value, "bf16")) {
        if (quant_type_parse(value, &type, err) || lm_quant_table(cfg, p, type, own, err)) return err->code;
        qt = own;
        from = "weights quantised here from the float ones: ";
        if (!own->n) {
            fprintf(stderr, "moh %s: --precision %s: no matrix has rows of whole 32-value blocks: decoding fp32\n", cmd,
                    value);
            quant_table_free(own);
            return lm_kv_init(kv, cfg, max_T, err);
        }
    } else if (!value && m->quant) {
        qt = m->quant;
        from = "the file's own blocks: ";
    }
    if (!qt && m->quant_only) /* (the commands open a model so only for the default) */
        return moh_fail(err, MOH_E_ARG, "--precision %s needs the float weights of a model opened for its blocks only",
                        value ? value : "fp32");
    int rc;
    if (qt) rc = lm_kv_init_quant(kv, cfg, p, qt, max_T, err);
    else if (cli_decode_bf16(cmd, value)) rc = lm_kv_init_bf16(kv, cfg, p, max_T, err);
    else return lm_kv_init(kv, cfg, max_T, err);
    if (rc) {
        quant_table_free(own);
        return rc;
    }
    char d[400];
    attn_decode_describe(&kv->dc, d, sizeof d);
    fprintf(stderr, "moh %s: decoding with %s%s%s\n", cmd, from, d, qt && !value ? " (--precision fp32 for float32)" : "");
    return MOH_OK;
}

int cli_device(const char *cmd, const char *value, const char *model_type, const moh_backend **be) {
    moh_error err = {0};
    moh_device d = MOH_DEVICE_AUTO;
    char note[224];
    if (backend_parse_device(value, &d, &err) || backend_resolve(d, model_type, be, note, sizeof note, &err)) {
        fprintf(stderr, "moh %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

moh_precision cli_precision_run(const char *cmd, const char *value) {
    if (!cli_precision_bf16(value)) return MOH_PRECISION_FP32;
    char why[160], line[256];
    const moh_precision p = precision_resolve(MOH_PRECISION_BF16, why, sizeof why);
    if (p != MOH_PRECISION_BF16) {
        fprintf(stderr, "moh %s: --precision bf16 runs fp32: %s\n", cmd, why);
        return p;
    }
    precision_describe(p, line, sizeof line);
    fprintf(stderr, "moh %s: compute %s\n", cmd, line);
    return p;
}


bool cli_output_ok(const char *cmd, const char *opt, const char *out, const char *const *inputs, int n) {
    moh_error err = {0};
    if (!out) return true;
    struct stat st;
    const size_t len = strlen(out);
    if ((len && out[len - 1] == '/') || (stat(out, &st) == 0 && S_ISDIR(st.st_mode)))
        moh_fail(&err, MOH_E_ARG, "%s %s names a folder (expected a file path)", opt, out);
    else if (fs_check_output(opt, out, inputs, n, &err) == MOH_OK)
        return true;
    fprintf(stderr, "moh %s: %s\n", cmd, err.msg);
    return false;
}

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "models/lm.h"
#include "models/vit.h"
#include "train/vit_checkpoint.h"

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
    if (n > 0 && strlen(exe) + 32 < PATH_MAX) {
        snprintf(dirs[1], PATH_MAX, "%s/../configs", exe);
        snprintf(dirs[2], PATH_MAX, "%s/../share/moh/configs", exe);
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
    size_t len = 0;
    char *text = fs_read_file(path, 1 << 20, &len, &err);
    if (!text) {
        fprintf(f, "  %-16s (%s)\n", name, err.msg);
        return;
    }
    const bool vit = moh_config_is_vit(text, len);
    char size[112];
    size_t params = 0;
    int heads = 0, hs = 0, k = 0;
    moh_router router = MOH_ROUTER_NONE;
    if (vit) {
        moh_vit_config c;
        if (vit_config_load(path, &c, &err)) {
            fprintf(f, "  %-16s (%s)\n", name, err.msg);
            free(text);
            return;
        }
        int nt = 0;
        vit_tensor *ts = vit_tensors(&c, &nt);
        for (int i = 0; ts && i < nt; i++) params += ts[i].numel;
        free(ts);
        heads = c.num_heads, hs = c.shared_heads, k = c.top_k, router = c.router;
        snprintf(size, sizeof size, "ViT %.2fM, %dx%d patch %d, D %d, %d blocks", params / 1e6, c.img_size,
                 c.img_size, c.patch_size, c.embed_dim, c.depth);
    } else {
        moh_lm_config c;
        if (moh_lm_config_parse_json(&c, text, len, path, &err)) {
            fprintf(f, "  %-16s (%s)\n", name, err.msg);
            free(text);
            return;
        }
        int nt = 0;
        lm_tensor *ts = lm_tensors(&c, &nt);
        for (int i = 0; ts && i < nt; i++) params += ts[i].numel;
        free(ts);
        heads = c.num_attention_heads, hs = c.shared_heads, k = c.top_k, router = c.router;
        snprintf(size, sizeof size, "LM %.2fM, hidden %d, %d layers, vocab %d, context %d", params / 1e6,
                 c.hidden_size, c.num_hidden_layers, c.vocab_size, c.max_position_embeddings);
    }
    free(text);
    const char *rname = router == MOH_ROUTER_LEARNED ? "learned" : router == MOH_ROUTER_QUERY_NORM ? "query_norm" : "none";
    if (router == MOH_ROUTER_NONE)
        fprintf(f, "  %-16s %-58s dense: %d/%d heads\n", name, size, heads, heads);
    else
        fprintf(f, "  %-16s %-58s %s: %d shared + top-%d of %d = %d/%d heads (%.1f%%)\n", name, size, rname, hs, k,
                heads - hs, hs + k, heads, heads ? 100.0 * (hs + k) / heads : 0.0);
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

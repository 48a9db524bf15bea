#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

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

static int json_int(const cJSON *j, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valueint : dflt;
}

/* One line for config file `path` named `name`: model type, size, heads active per token. */
static void describe_config(FILE *f, const char *name, const char *path) {
    FILE *in = fopen(path, "rb");
    char buf[1 << 16];
    size_t n = in ? fread(buf, 1, sizeof buf - 1, in) : 0;
    if (in) fclose(in);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j) {
        fprintf(f, "  %-16s (%s: not valid JSON)\n", name, path);
        return;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(j, "router");
    const bool vit = cJSON_IsString(mt) && !strcmp(mt->valuestring, "vit");
    const bool dense = cJSON_IsString(rt) && !strcmp(rt->valuestring, "none");
    const int heads = json_int(j, vit ? "num_heads" : "num_attention_heads", 0);
    const int hs = json_int(j, "shared_heads", 0), k = json_int(j, "top_k", 0);
    const int active = dense ? heads : hs + k;
    char size[96];
    if (vit)
        snprintf(size, sizeof size, "ViT %dx%d patch %d, D %d, %d blocks", json_int(j, "img_size", 0),
                 json_int(j, "img_size", 0), json_int(j, "patch_size", 0), json_int(j, "embed_dim", 0),
                 json_int(j, "depth", 0));
    else
        snprintf(size, sizeof size, "LM hidden %d, %d layers, vocab %d, context %d", json_int(j, "hidden_size", 0),
                 json_int(j, "num_hidden_layers", 0), json_int(j, "vocab_size", 0),
                 json_int(j, "max_position_embeddings", 0));
    if (dense)
        fprintf(f, "  %-16s %-48s dense: %d/%d heads\n", name, size, heads, heads);
    else
        fprintf(f, "  %-16s %-48s %s: %d shared + top-%d of %d = %d/%d heads (%.1f%%)\n", name, size,
                cJSON_IsString(rt) ? rt->valuestring : "?", hs, k, heads - hs, active, heads,
                heads ? 100.0 * active / heads : 0.0);
    cJSON_Delete(j);
}

int cli_list_configs(FILE *f) {
    char dirs[CONFIG_DIRS][PATH_MAX];
    config_dirs(dirs);
    enum { MAX_NAMES = 256 };
    named_config cfgs[MAX_NAMES];
    int n = 0;
    for (int i = 0; i < CONFIG_DIRS; i++) {
        DIR *d = dirs[i][0] ? opendir(dirs[i]) : NULL;
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d)) && n < MAX_NAMES;) {
            const size_t len = strlen(e->d_name);
            if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
            bool seen = false; /* an earlier folder's config of the same name wins, as in --config */
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
    if (n == 0) {
        fprintf(stderr, "moh: no named configs found (looked in ./configs and beside the executable)\n");
        return 1;
    }
    qsort(cfgs, (size_t)n, sizeof cfgs[0], cmp_named);
    fprintf(f, "named configs (moh train --config NAME; a JSON file path works too):\n");
    for (int i = 0; i < n; i++) {
        describe_config(f, cfgs[i].name, cfgs[i].path);
        free(cfgs[i].name);
        free(cfgs[i].path);
    }
    return 0;
}

/* libFuzzer target: moh_dit_config_parse_json on arbitrary bytes (not NUL-terminated).
 * Invariants (trap on violation): a parsed config finalizes again unchanged, is recognised by
 * model_family_of_json as the DiT family, has consistent derived fields (tokens, per-layer heads,
 * routing layers) and round-trips through moh_dit_config_to_json; every error message is one
 * NUL-terminated line that starts with the label, with the code returned. */
#include "models/dit.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moh_dit_config c, c2, c3;
    moh_error err;
    memset(&err, 0, sizeof err);
    int rc = moh_dit_config_parse_json(&c, (const char *)data, size, "fuzz.json", &err);
    if (rc == MOH_OK) {
        c2 = c;
        if (moh_dit_config_finalize(&c2, "fuzz.json", &err) != MOH_OK) __builtin_trap();
        if (memcmp(&c, &c2, sizeof c) != 0) __builtin_trap();
        const model_family *fam = NULL;
        if (model_family_of_json((const char *)data, size, "fuzz.json", &fam, &err) != MOH_OK ||
            strcmp(fam->model_type, "dit"))
            __builtin_trap();
        if (c.num_patches != c.grid * c.grid || c.grid * c.patch_size != c.input_size || c.hidden_size % 4)
            __builtin_trap();
        int routing = 0;
        for (int l = 0; l < c.depth; l++) {
            const moh_attn_config *a = &c.attn[l];
            if (a->n_heads != c.num_heads || a->head_dim * c.num_heads != c.hidden_size) __builtin_trap();
            if (a->router == MOH_ROUTER_LEARNED && a->top_k == 0 && a->shared_heads != a->n_heads) __builtin_trap();
            routing += a->top_k > 0 && a->n_heads > a->shared_heads;
        }
        if (routing != c.routing_layers || dit_active_head_layers(&c) > c.depth * c.num_heads) __builtin_trap();
        char *json = moh_dit_config_to_json(&c);
        if (!json) return 0; /* out of memory */
        rc = moh_dit_config_parse_json(&c3, json, strlen(json), "round.json", &err);
        free(json);
        if (rc != MOH_OK || memcmp(&c, &c3, sizeof c) != 0) __builtin_trap();
        return 0;
    }
    if (err.code != rc || !memchr(err.msg, '\0', sizeof err.msg)) __builtin_trap();
    if (strchr(err.msg, '\n') || strncmp(err.msg, "fuzz.json: ", 11) != 0) __builtin_trap();
    return 0;
}

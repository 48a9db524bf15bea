/* libFuzzer target: moh_st_parse on arbitrary bytes, then moh_st_read_f32 on every small tensor
 * (with its own shape and with a wrong one), moh_st_find on every name, moh_st_meta on every
 * metadata key, then close.
 * Invariants checked (trap on violation): a successful parse yields in-bounds, consistent entries;
 * every error message is one NUL-terminated line that starts with the label. */
#include "moh.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_msg(const moh_error *err, int rc) {
    if (err->code != rc) __builtin_trap();
    if (!memchr(err->msg, '\0', sizeof err->msg)) __builtin_trap();
    if (strchr(err->msg, '\n')) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moh_safetensors st;
    moh_error err;
    memset(&err, 0, sizeof err);
    int rc = moh_st_parse(&st, data, size, "fuzz.safetensors", &err);
    if (rc != MOH_OK) {
        check_msg(&err, rc);
        if (strncmp(err.msg, "fuzz.safetensors: ", 18) != 0) __builtin_trap();
        if (st.tensors || st.path || st.n_tensors || st.meta || st.n_meta) __builtin_trap();
        return 0;
    }
    if (size < 8 || st.data < data || st.data + st.data_size != data + size) __builtin_trap();
    for (int i = 0; i < st.n_tensors; i++) {
        const moh_st_tensor *t = &st.tensors[i];
        if (t->begin > t->end || t->end > st.data_size) __builtin_trap();
        if (t->ndim < 0 || t->ndim > MOH_ST_MAX_DIMS || t->numel < 0) __builtin_trap();
        if (moh_st_find(&st, t->name) == NULL) __builtin_trap();
        if (t->numel > (1 << 16)) continue;
        float *out = malloc(((size_t)t->numel + 1) * sizeof *out);
        if (!out) continue;
        rc = moh_st_read_f32(&st, t->name, t->ndim, t->shape, out, &err);
        int readable = t->dtype == MOH_DT_F32 || t->dtype == MOH_DT_F64 ||
                       t->dtype == MOH_DT_BF16 || t->dtype == MOH_DT_F16;
        if (readable != (rc == MOH_OK)) __builtin_trap();
        if (rc != MOH_OK) check_msg(&err, rc);
        /* a wrong expected shape must be refused */
        int64_t wrong[MOH_ST_MAX_DIMS + 1];
        memcpy(wrong, t->shape, sizeof t->shape);
        wrong[0] = t->ndim > 0 ? t->shape[0] + 1 : 1;
        rc = moh_st_read_f32(&st, t->name, t->ndim > 0 ? t->ndim : 1, wrong, out, &err);
        if (rc != MOH_E_SHAPE) __builtin_trap();
        check_msg(&err, rc);
        free(out);
    }
    /* metadata: every key finds its own value (keys are unique); pointers stay inside st */
    if (st.n_meta < 0 || (st.n_meta > 0) != (st.meta != NULL)) __builtin_trap();
    for (int i = 0; i < st.n_meta && i < 256; i++) { /* quadratic: bounded */
        const char *k = st.meta[2 * i], *v = st.meta[2 * i + 1];
        if (!k || !v || moh_st_meta(&st, k) != v) __builtin_trap();
        for (int j = 0; j < i; j++)
            if (strcmp(st.meta[2 * j], k) == 0) __builtin_trap();
        (void)strlen(v);
    }
    (void)moh_st_meta(&st, "format");
    if (moh_st_meta(&st, NULL) != NULL) __builtin_trap();
    rc = moh_st_read_f32(&st, "\x01no such tensor", 0, NULL, NULL, &err);
    if (rc != MOH_E_SHAPE) __builtin_trap();
    check_msg(&err, rc);
    moh_st_close(&st);
    return 0;
}

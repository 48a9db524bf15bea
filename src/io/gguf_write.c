/* GGUF writer (layout in gguf.h): metadata and F32 / F16 / Q8_0 / Q4_0 / Q4_1 tensors, written as gguf-py's GGUFWriter
 * writes version 3 files (alignment 32, tensors in the order added, each padded), streamed to a
 * temporary file that is fsynced and renamed over the target (a crash leaves the old file). */
#include "io/gguf_write.h"

#include "ops/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 32

typedef struct kv {
    char *key;
    int type;             /* moh_gguf_type */
    int elem;             /* array element type */
    uint64_t n;           /* array length */
    void *val;            /* scalar bytes, string, or array (strings: char *[n]) */
    size_t size;          /* scalar / string bytes */
} kv;

typedef struct tensor {
    char *name;
    int n_dims, type;
    int64_t ne[MOH_GGUF_MAX_DIMS];
    const float *data;    /* borrowed until moh_gguf_write */
    uint64_t nbytes, offset;
} tensor;

struct moh_gguf_writer {
    kv *kvs;
    int n_kv, cap_kv;
    tensor *ts;
    int n_t, cap_t;
    bool oom;
};

int moh_gguf_writer_new(moh_gguf_writer **out, moh_error *err) {
    *out = calloc(1, sizeof **out);
    return *out ? MOH_OK : moh_fail(err, MOH_E_NOMEM, "gguf writer: out of memory");
}

void moh_gguf_writer_free(moh_gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) {
        if (w->kvs[i].type == MOH_GGUF_ARRAY && w->kvs[i].elem == MOH_GGUF_STRING)
            for (uint64_t j = 0; j < w->kvs[i].n; j++) free(((char **)w->kvs[i].val)[j]);
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (int i = 0; i < w->n_t; i++) free(w->ts[i].name);
    free(w->kvs);
    free(w->ts);
    free(w);
}

static kv *new_kv(moh_gguf_writer *w, const char *key, int type) {
    if (w->n_kv == w->cap_kv) {
        const int cap = w->cap_kv ? 2 * w->cap_kv : 16;
        kv *k = realloc(w->kvs, sizeof *k * (size_t)cap);
        if (!k) return NULL;
        w->kvs = k;
        w->cap_kv = cap;
    }
    kv *e = &w->kvs[w->n_kv];
    memset(e, 0, sizeof *e);
    if (!(e->key = strdup(key))) return NULL;
    e->type = type;
    w->n_kv++;
    return e;
}

static void add_scalar(moh_gguf_writer *w, const char *key, int type, const void *v, size_t size) {
    kv *e = new_kv(w, key, type);
    if (!e || !(e->val = malloc(size))) {
        w->oom = true;
        return;
    }
    memcpy(e->val, v, size);
    e->size = size;
}

void moh_gguf_add_u32(moh_gguf_writer *w, const char *key, uint32_t v) { add_scalar(w, key, MOH_GGUF_U32, &v, 4); }
void moh_gguf_add_i32(moh_gguf_writer *w, const char *key, int32_t v) { add_scalar(w, key, MOH_GGUF_I32, &v, 4); }
void moh_gguf_add_f32(moh_gguf_writer *w, const char *key, float v) { add_scalar(w, key, MOH_GGUF_F32, &v, 4); }
void moh_gguf_add_bool(moh_gguf_writer *w, const char *key, bool v) {
    const uint8_t b = v;
    add_scalar(w, key, MOH_GGUF_BOOL, &b, 1);
}
void moh_gguf_add_str(moh_gguf_writer *w, const char *key, const char *s) {
    add_scalar(w, key, MOH_GGUF_STRING, s, strlen(s));
}

void moh_gguf_add_arr_str(moh_gguf_writer *w, const char *key, const char *const *s, uint64_t n) {
    kv *e = new_kv(w, key, MOH_GGUF_ARRAY);
    char **a = e ? calloc(n ? n : 1, sizeof *a) : NULL;
    if (!a) {
        w->oom = true;
        return;
    }
    e->elem = MOH_GGUF_STRING;
    e->val = a;
    for (uint64_t i = 0; i < n; i++) {
        if (!(a[i] = strdup(s[i]))) {
            w->oom = true;
            e->n = i;
            return;
        }
    }
    e->n = n;
}

static void add_arr(moh_gguf_writer *w, const char *key, int elem, const void *v, uint64_t n, size_t esize) {
    kv *e = new_kv(w, key, MOH_GGUF_ARRAY);
    if (!e || !(e->val = malloc(n ? n * esize : 1))) {
        w->oom = true;
        return;
    }
    memcpy(e->val, v, n * esize);
    e->elem = elem;
    e->n = n;
    e->size = esize;
}
void moh_gguf_add_arr_i32(moh_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    add_arr(w, key, MOH_GGUF_I32, v, n, 4);
}
void moh_gguf_add_arr_f32(moh_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    add_arr(w, key, MOH_GGUF_F32, v, n, 4);
}

int moh_gguf_add_tensor(moh_gguf_writer *w, const char *name, int n_dims, const int64_t *ne, int type,
                        const float *data, moh_error *err) {
    const bool quant = quant_supported(type);
    if ((type != MOH_GGML_F32 && type != MOH_GGML_F16 && !quant) || n_dims < 1 || n_dims > MOH_GGUF_MAX_DIMS ||
        strlen(name) >= 64)
        return moh_fail(err, MOH_E_ARG, "gguf writer: tensor '%s': expected f32, f16, " QUANT_TYPE_LIST ", 1..4 dims, a "
                        "name under 64 bytes", name);
    if (quant && ne[0] % quant_block_size(type))
        return moh_fail(err, MOH_E_ARG, "gguf writer: tensor '%s': rows of %lld values, expected a multiple of %d for %s",
                        name, (long long)ne[0], quant_block_size(type), quant_type_name(type));
    if (w->n_t == w->cap_t) {
        const int cap = w->cap_t ? 2 * w->cap_t : 64;
        tensor *t = realloc(w->ts, sizeof *t * (size_t)cap);
        if (!t) return moh_fail(err, MOH_E_NOMEM, "gguf writer: out of memory");
        w->ts = t;
        w->cap_t = cap;
    }
    uint64_t count = 1;
    for (int d = 0; d < n_dims; d++) count *= (uint64_t)ne[d];
    for (uint64_t i = 0; (type == MOH_GGML_F16 || quant) && i < count; i++)
        if (!(fabsf(data[i]) < 65520.0f)) /* (a block's scale is an f16 too) */ /* rounds to float16's infinity (or is not finite) */
            return moh_fail(err, MOH_E_ARG, "gguf writer: tensor '%s' holds %g at element %" PRIu64 ", beyond float16's "
                            "range (+-65504): write it as F32 (--outtype f32)", name, (double)data[i], i);
    tensor *t = &w->ts[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return moh_fail(err, MOH_E_NOMEM, "gguf writer: out of memory");
    t->n_dims = n_dims;
    t->type = type;
    uint64_t numel = 1;
    for (int d = 0; d < MOH_GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        numel *= (uint64_t)t->ne[d];
    }
    t->data = data;
    t->nbytes = quant ? numel / quant_block_size(type) * quant_block_bytes(type) : numel * (type == MOH_GGML_F32 ? 4 : 2);
    w->n_t++;
    return MOH_OK;
}

static bool put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }
static bool put_str(FILE *f, const char *s, size_t n) {
    const uint64_t len = n;
    return put(f, &len, 8) && put(f, s, n);
}
static bool pad(FILE *f, uint64_t at) {
    static const char zeros[ALIGN] = {0};
    const uint64_t p = (ALIGN - at % ALIGN) % ALIGN;
    return put(f, zeros, (size_t)p);
}

int moh_gguf_write(const moh_gguf_writer *w, const char *path, moh_error *err) {
    if (w->oom) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory while building the GGUF", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return moh_fail(err, MOH_E_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    }
    bool ok = put(f, "GGUF", 4);
    const uint32_t version = 3;
    const int64_t nt = w->n_t, nkv = w->n_kv;
    ok = ok && put(f, &version, 4) && put(f, &nt, 8) && put(f, &nkv, 8);
    for (int i = 0; ok && i < w->n_kv; i++) {
        const kv *e = &w->kvs[i];
        const int32_t type = e->type;
        ok = put_str(f, e->key, strlen(e->key)) && put(f, &type, 4);
        if (!ok) break;
        if (e->type == MOH_GGUF_STRING) ok = put_str(f, e->val, e->size);
        else if (e->type != MOH_GGUF_ARRAY) ok = put(f, e->val, e->size);
        else {
            const int32_t et = e->elem;
            ok = put(f, &et, 4) && put(f, &e->n, 8);
            for (uint64_t j = 0; ok && j < e->n; j++)
                ok = e->elem == MOH_GGUF_STRING ? put_str(f, ((char **)e->val)[j], strlen(((char **)e->val)[j]))
                                                : put(f, (const char *)e->val + j * e->size, e->size);
        }
    }
    uint64_t off = 0;
    for (int i = 0; ok && i < w->n_t; i++) { /* offsets: running sum of the padded sizes */
        tensor *t = &w->ts[i];
        t->offset = off;
        off += (t->nbytes + ALIGN - 1) / ALIGN * ALIGN;
        const uint32_t nd = (uint32_t)t->n_dims;
        const int32_t type = t->type;
        ok = put_str(f, t->name, strlen(t->name)) && put(f, &nd, 4) && put(f, t->ne, 8 * (size_t)nd) &&
             put(f, &type, 4) && put(f, &t->offset, 8);
    }
    long pos = ftell(f);
    ok = ok && pos >= 0 && pad(f, (uint64_t)pos);
    uint16_t buf[4096];
    for (int i = 0; ok && i < w->n_t; i++) {
        const tensor *t = &w->ts[i];
        const uint64_t numel = t->nbytes / (t->type == MOH_GGML_F32 ? 4 : 2);
        if (t->type == MOH_GGML_F32) ok = put(f, t->data, (size_t)t->nbytes);
        else if (quant_supported(t->type)) { /* row by row, as ggml's quantize_row_*_ref */
            const size_t rb = quant_row_bytes(t->type, t->ne[0]);
            uint8_t *row = malloc(rb);
            ok = row != NULL;
            for (uint64_t r = 0; ok && r < t->nbytes / rb; r++) {
                quant_row(t->type, t->data + r * (uint64_t)t->ne[0], t->ne[0], row);
                ok = put(f, row, rb);
            }
            free(row);
        } else
            for (uint64_t j = 0; ok && j < numel; j += 4096) {
                const uint64_t k = numel - j < 4096 ? numel - j : 4096;
                for (uint64_t q = 0; q < k; q++) buf[q] = quant_f2h(t->data[j + q]); /* as numpy astype(float16) */
                ok = put(f, buf, (size_t)k * 2);
            }
        ok = ok && pad(f, t->nbytes);
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    const int e = errno;
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return moh_fail(err, MOH_E_IO, "%s: cannot write: %s", path, strerror(ok ? errno : e));
    }
    return MOH_OK;
}

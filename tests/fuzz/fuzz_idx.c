/* libFuzzer target: the IDX reader (src/data/idx.c) on arbitrary bytes, plain or gzip.
 * Input: byte 0 -> num_classes = 1 + b0 % 16 and where the input is cut into an image file and a
 * label file (split at (size - 1) * b0 / 256); each file is also parsed whole as images and as
 * labels. Decoded gzip is capped at 4 MiB. Invariants (trap on violation): success gives sizes in
 * range whose data fits the cap; an error leaves the output empty with a one-line message starting
 * with the label; a split has matching counts and every label < num_classes; normalising an image
 * gives finite values. */
#include "data/idx.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP ((size_t)4 << 20)

static void check_err(int rc, const moh_error *err, const char *label) {
    if (rc >= 0 || err->code != rc || !memchr(err->msg, '\0', sizeof err->msg)) __builtin_trap();
    if (strchr(err->msg, '\n') || strncmp(err->msg, label, strlen(label)) != 0) __builtin_trap();
}

static void one_file(const uint8_t *d, size_t n) {
    moh_error err;
    memset(&err, 0, sizeof err);
    idx_images im;
    int rc = idx_parse_images(&im, d, n, CAP, "f", &err);
    if (rc == MOH_OK) {
        if (im.n < 1 || im.rows < 1 || im.cols < 1 || im.rows > IDX_MAX_SIDE || im.cols > IDX_MAX_SIDE ||
            (size_t)im.n * im.rows * im.cols > CAP || !im.pixels)
            __builtin_trap();
        idx_images_free(&im);
    } else {
        if (im.pixels || im.n) __builtin_trap();
        check_err(rc, &err, "f");
    }
    idx_labels lb;
    rc = idx_parse_labels(&lb, d, n, CAP, "f", &err);
    if (rc == MOH_OK) {
        if (lb.n < 1 || (size_t)lb.n > CAP || !lb.labels) __builtin_trap();
        idx_labels_free(&lb);
    } else {
        if (lb.labels || lb.n) __builtin_trap();
        check_err(rc, &err, "f");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int K = 1 + data[0] % 16;
    const uint8_t *rest = data + 1;
    const size_t n = size - 1, cut = n * data[0] / 256;
    one_file(rest, n);
    moh_error err;
    memset(&err, 0, sizeof err);
    idx_split s;
    int rc = idx_split_from_buffers(&s, rest, cut, rest + cut, n - cut, K, CAP, "mem", &err);
    if (rc != MOH_OK) {
        if (s.images || s.labels || s.n) __builtin_trap();
        check_err(rc, &err, "mem");
        return 0;
    }
    for (int i = 0; i < s.n; i++)
        if (s.labels[i] >= K) __builtin_trap();
    double mean, sd;
    idx_mean_std(&s, &mean, &sd);
    if (!(mean >= 0 && mean <= 1) || !(sd >= 0 && sd <= 1)) __builtin_trap();
    if (s.rows * s.cols <= 4096) {
        float out[4096];
        const idx_augment aug = {2, true};
        idx_image_to_float(&s, s.n - 1, mean, sd > 0 ? sd : 1.0, &aug, 3, (uint64_t)size, out);
        for (int i = 0; i < s.rows * s.cols; i++)
            if (!isfinite(out[i])) __builtin_trap();
    }
    idx_split_free(&s);
    return 0;
}

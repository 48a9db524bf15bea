/* IDX image data (the MNIST / Fashion-MNIST file format, yann.lecun.com/exdb/mnist): reading
 * plain or gzip files, a split = images + labels, normalisation statistics, the seeded epoch
 * order and the training augmentation (random crop with zero padding, horizontal flip).
 *
 * Format: a 4-byte big-endian magic 0x000008NN (0x08 = unsigned bytes, NN = number of dims),
 * then NN big-endian uint32 sizes, then the values. Images: magic 0x00000803, sizes [n, rows,
 * cols], n*rows*cols bytes (row-major, 0 = background). Labels: magic 0x00000801, size [n], n
 * bytes. A file starting with the gzip magic 1f 8b is inflated first (zlib). */
#ifndef MOH_DATA_IDX_H
#define MOH_DATA_IDX_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
/* Largest accepted image side and image count: moh's resource caps, not limits of the format. */
#define IDX_MAX_SIDE 4096
#define IDX_MAX_COUNT 100000000
/* Largest decoded (inflated) file accepted from disk: 2 GiB. */
#define IDX_MAX_FILE_BYTES ((size_t)2 << 30)

typedef struct idx_images {
    int n, rows, cols;
    uint8_t *pixels; /* [n, rows, cols], owned */
} idx_images;

typedef struct idx_labels {
    int n;
    uint8_t *labels; /* [n], owned */
} idx_labels;

/* Parses an IDX image file held in memory (buf[0..len), plain or gzip; a gzip stream may inflate
 * to at most max_bytes). label names the data in messages. Errors (MOH_E_FORMAT, one line naming
 * label and the expected value): gzip corrupt or larger than max_bytes, header shorter than 16
 * bytes, magic other than 0x00000803, a zero or absurd size (n > IDX_MAX_COUNT, side >
 * IDX_MAX_SIDE), fewer data bytes than n*rows*cols (truncated) or trailing bytes; MOH_E_NOMEM.
 * On error out is empty (NULL pixels). */
int idx_parse_images(idx_images *out, const uint8_t *buf, size_t len, size_t max_bytes,
                     const char *label, moh_error *err);
/* Same for a label file (magic 0x00000801, [n]). Label values are not checked here. */
int idx_parse_labels(idx_labels *out, const uint8_t *buf, size_t len, size_t max_bytes,
                     const char *label, moh_error *err);
void idx_images_free(idx_images *im);
void idx_labels_free(idx_labels *lb);

/* Inflates a gzip stream (concatenated members allowed) into a malloc'd buffer (*out, *out_len).
 * MOH_E_FORMAT when corrupt, truncated or larger than max_bytes; MOH_E_NOMEM. */
int idx_gunzip(const uint8_t *buf, size_t len, size_t max_bytes, uint8_t **out, size_t *out_len,
               const char *label, moh_error *err);

/* One split: n images of rows x cols pixels and their labels (each < num_classes). */
typedef struct idx_split {
    int n, rows, cols, num_classes;
    uint8_t *images; /* [n, rows, cols], owned */
    uint8_t *labels; /* [n], owned */
} idx_split;

/* Loads DIR/<prefix>-images-idx3-ubyte and DIR/<prefix>-labels-idx1-ubyte, each plain or with a
 * .gz suffix (plain preferred when both exist); prefix is "train" or "t10k" for MNIST-style dirs.
 * Errors: a missing file names both paths tried (MOH_E_IO); parse errors as above; the label file
 * has a different count than the image file, or a label >= num_classes (MOH_E_FORMAT, naming the
 * index and value). On error s is empty. */
int idx_split_load(idx_split *s, const char *dir, const char *prefix, int num_classes, moh_error *err);
/* Same checks on files already in memory (tests, fuzzing). */
int idx_split_from_buffers(idx_split *s, const uint8_t *img, size_t img_len, const uint8_t *lab,
                           size_t lab_len, int num_classes, size_t max_bytes, const char *label,
                           moh_error *err);
void idx_split_free(idx_split *s);
/* crc (zlib CRC-32) continued over the first n images of s, then their n labels. */
uint32_t idx_split_crc(const idx_split *s, int n, uint32_t crc);

/* Mean and standard deviation (population) of pixel / 255 over every pixel of s, accumulated in
 * double in a fixed order. */
void idx_mean_std(const idx_split *s, double *mean, double *std);
/* idx_mean_std of DIR's training split (train-images/-labels, as idx_split_load). Errors: those of
 * idx_split_load; *mean and *std untouched then. Used when a checkpoint's config has no mean/std. */
int idx_train_mean_std(const char *dir, int num_classes, double *mean, double *std, moh_error *err);

/* The 10 Fashion-MNIST class names (index = label) when num_classes is 10 and the data dir's path
 * says "fashion" (any case), else NULL: names for tables and plots. */
const char *const *idx_fashion_names(const char *dir, int num_classes);

/* The order of epoch `epoch` (0-based): a Fisher-Yates permutation of 0..n-1 drawn from
 * splitmix64 seeded by (seed, epoch) with rejection sampling (no modulo bias). Depends only on
 * (n, seed, epoch), so a resumed run recomputes it. */
void idx_epoch_order(int *perm, int n, uint64_t seed, long epoch);

/* Training augmentation. pad = 0 and hflip = false: none. */
typedef struct idx_augment {
    int pad;     /* random crop: shift by (dy, dx) uniform in [-pad, pad]^2, pixels shifted in
                  * from outside are 0 (torchvision RandomCrop(size, padding=pad), fill 0) */
    bool hflip;  /* horizontal flip with probability 1/2 (torchvision RandomHorizontalFlip) */
} idx_augment;

/* Writes image i of s into out [rows * cols] as (pixel / 255 - mean) / std in float, row-major
 * (one channel, NCHW with C = 1). With aug (may be NULL), the crop offset and flip come from a hash
 * of (seed, key) only, where the caller passes a key unique to this draw (for example
 * epoch * n + position), so results do not depend on batch order or threads. */
void idx_image_to_float(const idx_split *s, int i, double mean, double std, const idx_augment *aug,
                        uint64_t seed, uint64_t key, float *out);
/* Writes n images [n, rows, cols] (bytes) as an IDX image file (magic 0x00000803) at path,
 * atomically; and labels [n] (may be NULL) as an IDX label file at label_path. MOH_E_IO naming the
 * path, MOH_E_NOMEM. */
int idx_write(const char *path, const uint8_t *images, int n, int rows, int cols, const char *label_path,
              const uint8_t *labels, moh_error *err);
#endif

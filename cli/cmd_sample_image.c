/* moh sample on an image-generation checkpoint (DiT): N images per class with the family's sampler
 * (DDPM ancestral or DDIM, classifier-free guidance), written as a PNG grid (one row per class)
 * and / or an IDX image file (+ its label file). Every argument is checked before sampling, and
 * each file is written atomically: a failed run leaves nothing behind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "analysis/analysis.h"
#include "args.h"
#include "cli.h"
#include "core/fsutil.h"
#include "data/idx.h"
#include "io/png.h"
#include "models/model.h"
#include "text/bpe.h"

/* true when the folder that would hold path exists */
static bool parent_exists(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return true;
    if (slash == dir) return true;
    *slash = '\0';
    struct stat sb;
    return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
}

uint8_t cli_pixel_byte(float v) {
    const double x = (v + 1.0) * 127.5 + 0.5;
    return (uint8_t)(x < 0 ? 0 : x > 255 ? 255 : x);
}

int cli_image_classes(const model *m) {
    int K = 0, nt = 0; /* the label table has num_classes + 1 rows (the null class last) */
    model_tensor *ts = model_tensors(m, &nt);
    for (int i = 0; ts && i < nt; i++)
        if (strstr(ts[i].name, "embedding_table")) K = (int)ts[i].shape[0] - 1;
    free(ts);
    return K;
}

/* The grid's row labels: "k: name" from a file of names (one per line), Fashion-MNIST's (auto, for a
 * 10-class 28 x 28 grey model, the shape moh's DiT recipe trains on) or "class k". names[K] get
 * malloc'd strings (the caller frees them). */
static int class_names(const char *arg, int K, int C, int H, int W, char **names, moh_error *err) {
    static const char *const fashion[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
    const bool fmnist = !strcmp(arg, "auto") && K == 10 && C == 1 && H == 28 && W == 28;
    char **file = NULL;
    int nf = 0;
    if (strcmp(arg, "auto") && strcmp(arg, "index")) {
        size_t len = 0;
        char *text = fs_read_file(arg, 1 << 20, &len, err);
        if (!text) return err->code;
        if (!(file = calloc((size_t)K + 1, sizeof *file))) {
            free(text);
            return moh_fail(err, MOH_E_NOMEM, "out of memory");
        }
        for (char *p = text, *nl; p < text + len && nf <= K; p = nl + 1) {
            nl = memchr(p, '\n', (size_t)(text + len - p));
            if (!nl) nl = text + len;
            const size_t l = (size_t)(nl - p) - (nl > p && nl[-1] == '\r');
            size_t keep = 0; /* UTF-8 text without control bytes; names cut to 64 bytes at a character */
            for (size_t i = 0; i < l;) {
                const int cl = bpe_utf8_len((const uint8_t *)p + i, l - i);
                if (cl == 0 || (cl == 1 && ((unsigned char)p[i] < 0x20 || p[i] == 0x7f))) {
                    const unsigned bad = (unsigned char)p[i];
                    for (int k = 0; k < nf && k < K; k++) free(file[k]);
                    free(file);
                    free(text);
                    return moh_fail(err, MOH_E_FORMAT, "%s: line %d: byte 0x%02x at column %zu: expected UTF-8 text "
                                    "without control characters (one class name per line)", arg, nf + 1, bad, i + 1);
                }
                if (i + (size_t)cl <= 64) keep = i + (size_t)cl;
                i += (size_t)cl;
            }
            if (nf < K) file[nf] = strndup(p, keep);
            nf++;
        }
        free(text);
        if (nf != K) {
            for (int i = 0; i < K; i++) free(file[i]);
            free(file);
            return moh_fail(err, MOH_E_FORMAT, "%s: --class-names file has %s%d line%s, expected %d (one name per class)",
                            arg, nf > K ? "more than " : "", nf > K ? K : nf, nf == 1 ? "" : "s", K);
        }
    }
    for (int k = 0; k < K; k++) {
        char buf[96];
        if (file) snprintf(buf, sizeof buf, "%d: %s", k, file[k] ? file[k] : "");
        else if (fmnist) snprintf(buf, sizeof buf, "%d: %s", k, fashion[k]);
        else snprintf(buf, sizeof buf, "class %d", k);
        if (!(names[k] = strdup(buf))) break;
    }
    if (file)
        for (int i = 0; i < K; i++) free(file[i]);
    free(file);
    return names[K - 1] ? MOH_OK : moh_fail(err, MOH_E_NOMEM, "out of memory");
}

/* The PNG grid: nc rows (classes c0..) x n columns of the images in bytes (class-major, C x H x W
 * each; channel 0 drawn), each `scale` times larger, rows labelled (cairo; without it, unlabelled
 * with a note). */
static int write_grid(const char *out, const uint8_t *bytes, int nc, int n, int C, int H, int W, int scale, int c0,
                      char *const *names, moh_error *err) {
    const size_t hw = (size_t)H * W, chw = (size_t)C * hw, total = (size_t)nc * n;
    uint8_t *g0 = malloc(hw * total);
    int rc = !g0 ? moh_fail(err, MOH_E_NOMEM, "%s: out of memory", out) : MOH_OK;
    for (size_t i = 0; !rc && i < total; i++) memcpy(g0 + i * hw, bytes + i * chw, hw);
    if (!rc) rc = plot_image_grid(out, g0, nc, n, H, W, scale, (const char *const *)names, err);
    if (rc == MOH_E_CONFIG) { /* no cairo: the same grid without labels */
        fprintf(stderr, "moh sample: note: built without cairo: the grid's rows are not labelled (classes %d..%d, top "
                        "to bottom)\n", c0, c0 + nc - 1);
        const int gap = 2 * scale, GW = n * (W * scale + gap) + gap, GH = nc * (H * scale + gap) + gap;
        uint8_t *grid = malloc((size_t)GW * GH);
        if (!grid) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", out);
        else {
            memset(grid, 64, (size_t)GW * GH);
            for (size_t i = 0; i < total; i++) {
                const int r = (int)(i / (size_t)n), c = (int)(i % (size_t)n);
                for (int y = 0; y < H * scale; y++)
                    for (int x = 0; x < W * scale; x++)
                        grid[(size_t)(gap + r * (H * scale + gap) + y) * GW + gap + c * (W * scale + gap) + x] =
                            g0[i * hw + (size_t)(y / scale) * W + x / scale];
            }
            rc = png_write(out, grid, GW, GH, 1, err);
            free(grid);
        }
    }
    free(g0);
    return rc;
}

int cmd_sample_image(int argc, char **argv) {
    const char *ckpt = NULL, *cls = "all", *out = NULL, *out_idx = NULL, *sampler = "ddpm", *sigma = "large", *precision = NULL, *device = NULL;
    const char *names_arg = "auto";
    int n = 8, steps = 0, batch = 64, scale = 4;
    double cfg = 4.0;
    uint64_t seed = 1;
    bool sparse = false, reference = false;
    const arg_spec specs[] = {
        {"--checkpoint", ARG_STR, &ckpt, "DIR", "DiT checkpoint dir (config.json + model.safetensors: the EMA weights)", true, ARG_ANY},
        {"--class", ARG_STR, &cls, "K|all", "class to draw (0..num_classes-1), or all (default): one grid row per class", false, ARG_ANY},
        {"--n", ARG_INT, &n, "N", "images per class (default 8)", false, ARG_IN(1, 100000)},
        {"--steps", ARG_INT, &steps, "S", "sampling steps, respaced from the training schedule (default 250 ddpm, 50 ddim)", false, ARG_IN(1, 100000)},
        {"--cfg", ARG_DOUBLE, &cfg, "W", "classifier-free guidance scale: eps = uncond + W (cond - uncond); 1 = none (default 4, as DiT's sample.py)", false, ARG_IN(0, 1000)},
        {"--sampler", ARG_CHOICE, &sampler, "ddpm|ddim", "DDPM ancestral (default) or DDIM with eta 0", false, ARG_ANY},
        {"--sigma", ARG_CHOICE, &sigma, "large|small", "DDPM variance: beta (large, DiT's default without learned sigma) or the posterior variance (small)", false, ARG_ANY},
        {"--seed", ARG_U64, &seed, "S", "noise seed (default 1); image i draws from (S, i) alone", false, ARG_ANY},
        {"--batch", ARG_INT, &batch, "B", "images per forward pass (default 64; x2 with guidance)", false, ARG_IN(1, 4096)},
        {"--out", ARG_STR, &out, "FILE.png", "PNG grid: one row per class, N columns, each row labelled with its class", false, ARG_ANY},
        {"--scale", ARG_INT, &scale, "S", "grid: each image S times its size (default 4: 112 px for 28 px images)", false, ARG_IN(1, 32)},
        {"--class-names", ARG_STR, &names_arg, "auto|index|FILE", "grid labels: auto (default: Fashion-MNIST's names for a 10-class 28 x 28 grey model, else the class index), index, or a text file with one name per line", false, ARG_ANY},
        {"--out-idx", ARG_STR, &out_idx, "FILE", "the images as an IDX ubyte file (class-major order); labels beside it (FILE with images-idx3 -> labels-idx1, else FILE.labels)", false, ARG_ANY},
        {"--sparse-attn", ARG_FLAG, &sparse, NULL, "attention on the head-sparse path (only the selected heads)", false, ARG_ANY},
        {"--reference-attention", ARG_FLAG, &reference, NULL, "every head computed then gated (the default)", false, ARG_ANY},
        CLI_PRECISION_SPEC(&precision),
        CLI_DEVICE_SPEC(&device),
    };
    int rc = args_parse("sample", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "--checkpoint DIR [--class K|all] [--n N] [--steps S] [--cfg W] [--sampler ddpm|ddim]\n"
                        "                  [--seed S] [--out FILE.png] [--out-idx FILE] [--precision fp32|bf16]",
                        "Image models (model_type \"dit\"): generates N images per class from noise with the\n"
                        "checkpoint's weights (the EMA of training) and writes a PNG grid and/or IDX files.\n"
                        "Pixels: model output in [-1, 1] mapped to 0..255. Speed on stderr.\n");
    if (rc) return rc == 1 ? 0 : rc;
    if (!out && (args_value(argc, argv, "--scale") || args_value(argc, argv, "--class-names"))) {
        fprintf(stderr, "moh sample: %s shapes the PNG grid of --out, which is not given (expected --out FILE.png, or "
                        "no %s)\n", args_value(argc, argv, "--scale") ? "--scale" : "--class-names",
                args_value(argc, argv, "--scale") ? "--scale" : "--class-names");
        return 2;
    }
    if (!out && !out_idx) {
        fprintf(stderr, "moh sample: give --out FILE.png and/or --out-idx FILE (where the images go)\n");
        return 2;
    }
    if (sparse && reference) {
        fprintf(stderr, "moh sample: --sparse-attn and --reference-attention exclude each other\n");
        return 2;
    }
    const bool ddim = !strcmp(sampler, "ddim");
    if (steps == 0) steps = ddim ? 50 : 250;
    char lpath[4200] = ""; /* --out-idx's labels file */
    if (out_idx) {
        const char *hit = strstr(out_idx, "images-idx3");
        if (hit) snprintf(lpath, sizeof lpath, "%.*slabels-idx1%s", (int)(hit - out_idx), out_idx, hit + 11);
        else snprintf(lpath, sizeof lpath, "%s.labels", out_idx);
    }
    const char *inputs[] = {ckpt, names_arg};
    for (int i = 0; i < 2; i++) {
        const char *p = i ? out_idx : out;
        if (p && !parent_exists(p)) {
            fprintf(stderr, "moh sample: %s %s: its folder does not exist\n", i ? "--out-idx" : "--out", p);
            return 2;
        }
        if (!cli_output_ok("sample", i ? "--out-idx" : "--out", p, inputs, 2)) return 2;
    }
    if (out_idx && !cli_output_ok("sample", "--out-idx (its labels file)", lpath, inputs, 2)) return 2;
    if (out && out_idx && (!strcmp(out, out_idx) || !strcmp(out, lpath))) {
        fprintf(stderr, "moh sample: --out %s and --out-idx %s name the same file: expected two paths\n", out, out_idx);
        return 2;
    }
    const moh_precision prec = cli_precision_run("sample", precision);
    moh_error err = {0};
    model m;
    if (model_load(&m, ckpt, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        return 1;
    }
    const struct moh_backend *be = NULL;
    if (cli_device("sample", device, m.fam->model_type, &be)) {
        model_free(&m);
        return 1;
    }
    int C = 0, H = 0, W = 0;
    m.fam->image_shape(m.cfg, &C, &H, &W);
    const int K = cli_image_classes(&m);
    int c0 = 0, nc = K;
    if (strcmp(cls, "all")) {
        char *end = NULL;
        const long v = strtol(cls, &end, 10);
        if (!*cls || *end || v < 0 || v >= K) {
            fprintf(stderr, "moh sample: --class %s: expected 0..%d or all (the model has %d classes)\n", cls, K - 1, K);
            model_free(&m);
            return 2;
        }
        c0 = (int)v;
        nc = 1;
    }
    const long total = (long)nc * n;
    const size_t chw = (size_t)C * H * W;
    if (out_idx && C != 1) {
        fprintf(stderr, "moh sample: --out-idx: IDX holds 1-channel images, the model has %d channels\n", C);
        model_free(&m);
        return 2;
    }
    if (out) { /* the grid's pixels (cairo draws at most 32767 a side; up to 1000 of the width for labels) */
        const long gw = (long)n * (W + 2) * scale + 2L * scale, gh = (long)nc * (H + 2) * scale + 2L * scale;
        if (gw > 32767 - 1000 || gh > 32767) {
            fprintf(stderr, "moh sample: --out: a grid of %ld x %ld pixels (--n %d, --scale %d): expected at most %d "
                            "x %d (lower --scale or --n)\n", gw, gh, n, scale, 32767 - 1000, 32767);
            model_free(&m);
            return 2;
        }
    }
    char **names = calloc((size_t)K, sizeof *names); /* the grid's row labels, read before sampling */
    if (names && out && (rc = class_names(names_arg, K, C, H, W, names, &err))) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        for (int k = 0; k < K; k++) free(names[k]);
        free(names);
        model_free(&m);
        return rc == MOH_E_NOMEM ? 1 : 2;
    }
    int *labels = malloc(sizeof(int) * (size_t)total);
    float *img = malloc(sizeof(float) * chw * (size_t)total);
    uint8_t *bytes = malloc(chw * (size_t)total + (size_t)total);
    if (!names || !labels || !img || !bytes || total > (1L << 24)) {
        fprintf(stderr, "moh sample: %ld images do not fit in memory\n", total);
        for (int k = 0; names && k < K; k++) free(names[k]);
        free(names);
        free(labels);
        free(img);
        free(bytes);
        model_free(&m);
        return 1;
    }
    for (long i = 0; i < total; i++) labels[i] = c0 + (int)(i / n);
    eval_progress pg; /* counted in sampler steps of each batch: steps x batches in all */
    char detail[96];
    eval_progress_start(&pg, "steps");
    pg.cmd = "moh sample";
    pg.detail = cli_sampling_detail(detail, sizeof detail, steps, total, batch);
    const image_gen_request req = {.labels = labels, .n = (int)total, .steps = steps, .cfg_scale = cfg,
                                   .sampler = ddim ? 1 : 0, .variance = !strcmp(sigma, "small"), .seed = seed,
                                   .batch = batch, .sparse = sparse, .precision = prec, .progress = eval_progress_report, .ctx = &pg};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = m.fam->generate(&m, &req, img, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    eval_progress_end(&pg, rc ? -1 : (long)steps * ((total + batch - 1) / batch));
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int status = 0;
    if (rc) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        status = rc == MOH_E_ARG ? 2 : 1;
    }
    uint8_t *lab8 = bytes + chw * (size_t)total;
    for (size_t q = 0; !status && q < chw * (size_t)total; q++) bytes[q] = cli_pixel_byte(img[q]);
    for (long i = 0; i < total; i++) lab8[i] = (uint8_t)labels[i];
    /* each output on its own: one that fails does not cost the other the sampling run */
    const bool sampled = status == 0;
    if (sampled && out_idx) {
        if (idx_write(out_idx, bytes, (int)total, H, W, lpath, lab8, &err)) {
            fprintf(stderr, "moh sample: %s\n", err.msg);
            status = 1;
            out_idx = NULL;
        }
    }
    if (sampled && out && write_grid(out, bytes, nc, n, C, H, W, scale, c0, names + c0, &err)) {
        fprintf(stderr, "moh sample: %s\n", err.msg);
        status = 1;
        out = NULL;
    }
    if (sampled) {
        fprintf(stderr, "moh sample: %ld images (%d class%s x %d) in %.1f s (%.2f img/s), %s %d steps, cfg %g, seed %llu\n",
                total, nc, nc == 1 ? "" : "es", n, secs, total / secs, ddim ? "DDIM" : "DDPM", steps, cfg,
                (unsigned long long)seed);
        if (out) printf("wrote %s (one row per class)\n", out);
        if (out_idx) printf("wrote %s and its labels\n", out_idx);
    }
    for (int k = 0; k < K; k++) free(names[k]);
    free(names);
    free(labels);
    free(img);
    free(bytes);
    model_free(&m);
    return status;
}

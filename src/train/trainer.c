/* The one trainer (trainer.h): batch source -> shards forward/backward -> accumulation ->
 * non-finite guard -> clip -> AdamW -> checkpoint, with periodic validation, a progress line and
 * metrics.jsonl. Everything family-specific goes through model.h. */
#include "train/trainer.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "ops/adamw.h"
#include "train/optim.h"
#include "train/dist.h"
#include "io/manifest.h"
#include "train/train_util.h"

void train_hparams_unset(train_hparams *h) {
    *h = (train_hparams){.lr = NAN, .min_lr_ratio = NAN, .weight_decay = NAN, .beta1 = NAN, .beta2 = NAN,
                         .grad_clip = NAN, .warmup = LONG_MIN, .batch_size = INT_MIN, .seq_len = INT_MIN,
                         .grad_accum = INT_MIN, .shards = INT_MIN, .seed = 0, .val_fraction = NAN,
                         .train_limit = LONG_MIN, .crop_pad = INT_MIN, .hflip = INT_MIN, .epochs = NAN,
                         .eval_every = LONG_MIN, .eval_limit = LONG_MIN, .log_every = LONG_MIN,
                         .attention = INT_MIN, .ema_decay = NAN, .optimizer = INT_MIN,
                         .muon_lr = NAN, .save_every = LONG_MIN, .precision = INT_MIN};
}

void train_options_defaults(train_options *o) {
    memset(o, 0, sizeof *o);
    train_hparams_unset(&o->flags);
    o->max_bad_steps = 3;
    o->comm_timeout = 300;
}

/* ---- hyperparameters: family defaults, checkpoint, command line ---------------------------- */

static bool key_in_hp(const train_key *k) { return k->offset >= offsetof(train_state, hp); }
static char *hp_field(train_hparams *h, const train_key *k) {
    return (char *)h + (k->offset - offsetof(train_state, hp));
}

/* true when the command line set key k (k in train_hparams) */
static bool flag_given(const train_options *o, const train_key *k) {
    const char *p = hp_field((train_hparams *)&o->flags, k);
    switch (k->type) {
    case 'd': return !isnan(*(const double *)p);
    case 'i': return *(const int *)p != INT_MIN;
    case 'l': return *(const long *)p != LONG_MIN;
    default: return o->seed_given; /* 'u': the seed */
    }
}

static void fmt_value(const train_key *k, const char *p, char *out, size_t cap) {
    if (!strcmp(k->key, "muon_lr") && *(const double *)p == 0) {
        snprintf(out, cap, "0 (= lr)");
        return;
    }
    if (!strcmp(k->key, "precision")) {
        const int v = *(const int *)p;
        snprintf(out, cap, "%s", v == MOH_PRECISION_AUTO ? "auto" : v == MOH_PRECISION_BF16 ? "bf16" : "fp32");
        return;
    }
    if (!strcmp(k->key, "optimizer")) {
        snprintf(out, cap, "%s", *(const int *)p == 1 ? "muon" : "adamw");
        return;
    }
    if (!strcmp(k->key, "attention") || !strcmp(k->key, "hflip")) {
        const int v = *(const int *)p;
        snprintf(out, cap, "%s", k->key[0] == 'a' ? (v == 1 ? "head-sparse" : "reference") : v ? "on" : "off");
        return;
    }
    switch (k->type) {
    case 'd': snprintf(out, cap, "%g", *(const double *)p); break;
    case 'i': snprintf(out, cap, "%d", *(const int *)p); break;
    case 'l': snprintf(out, cap, "%ld", *(const long *)p); break;
    default: snprintf(out, cap, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    }
}

static size_t key_size(const train_key *k) {
    return k->type == 'd' ? sizeof(double) : k->type == 'i' ? sizeof(int) : k->type == 'l' ? sizeof(long) : sizeof(uint64_t);
}

/* true when the family's data has no use for train-state key `key` */
static bool key_unused(const model_family *fam, const char *key) {
    const size_t n = strlen(key);
    for (const char *p = fam->unused_keys; p && (p = strstr(p, key)); p += n)
        if ((p == fam->unused_keys || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
    return false;
}

/* The run's hyperparameters: family defaults, then (resume) the checkpoint's, then the command
 * line's. On resume a flag contradicting a saved value is applied with a note ('a' keys) or
 * refused ('r' keys); keys an older checkpoint does not record take the flag or the default, with
 * a note. */
static int merge_hparams(const train_options *o, const model_family *fam, int max_T, train_state *st,
                         train_keys_present present, moh_error *err) {
    train_hparams hp;
    fam->train_defaults(&hp);
    if (o->init_path && !o->resume) {
        /* continue-tuning a pretrained model: fine-tuning defaults, not those of training from
         * scratch (a from-scratch lr wrecks pretrained weights; the model's whole context is
         * rarely affordable) */
        hp.lr = 5e-5;
        hp.batch_size = 4;
        if (max_T > 0) hp.seq_len = max_T < 512 ? max_T : 512;
    }
    int nk = 0;
    const train_key *keys = train_state_keys(&nk);
    char missing[512] = "";
    /* the optimizer in force (flag, else checkpoint, else default), before any note is printed */
    const int ko = train_state_key_index("optimizer");
    const int opt = o->flags.optimizer != INT_MIN                   ? o->flags.optimizer
                    : o->resume && ko >= 0 && (present >> ko & 1) ? st->hp.optimizer
                                                                    : hp.optimizer;
    if (!isnan(o->flags.muon_lr) && opt != 1)
        return moh_fail(err, MOH_E_ARG, "--muon-lr %g applies to --optimizer muon; this run uses adamw (expected "
                        "--optimizer muon, or no --muon-lr)", o->flags.muon_lr);
    for (int i = 0; i < nk; i++) {
        const train_key *k = &keys[i];
        if (!key_in_hp(k)) continue;
        char *dst = hp_field(&hp, k);
        const char *saved = hp_field(&st->hp, k), *flag = hp_field((train_hparams *)&o->flags, k);
        const bool given = flag_given(o, k), have = o->resume && (present >> i & 1);
        const bool aug = !strcmp(k->key, "crop_pad") || !strcmp(k->key, "hflip");
        const char *flag_name = aug && o->no_augment ? "--no-augment" : k->flag; /* the option actually given */
        if (given && key_unused(fam, k->key))
            return moh_fail(err, MOH_E_ARG, "%s does not apply to a %s (model_type \"%s\"): its data has no %s", flag_name,
                            fam->summary, fam->model_type, k->key);
        if (have) memcpy(dst, saved, key_size(k));
        if (given && have && memcmp(saved, flag, key_size(k))) {
            char a[48], b[96];
            fmt_value(k, saved, a, sizeof a);
            fmt_value(k, flag, b, sizeof b);
            if (!strcmp(k->key, "hflip") || !strcmp(k->key, "attention") || (aug && o->no_augment))
                snprintf(b, sizeof b, "%s", aug ? flag_name : *(const int *)flag == 1 ? "--sparse-attn"
                                                                                     : "--reference-attention");
            else {
                char v[sizeof b];
                snprintf(v, sizeof v, "%s", b);
                snprintf(b, sizeof b, "%.40s %.40s", k->flag, v);
            }
            if (k->on_resume == 'r')
                return moh_fail(err, MOH_E_ARG, "%s contradicts the checkpoint in %s (%s %s): a resume continues "
                                "the same run; drop the flag, or start a new run in a fresh --out", b, o->out_dir,
                                k->key, a);
            if (!o->quiet)
                printf("note: %s replaces the checkpoint's %s %s from step %ld on\n", b, k->key, a,
                       st->step + 1);
        }
        if (given) memcpy(dst, flag, key_size(k));
        else if (o->resume && !have && !key_unused(fam, k->key)) {
            if (!strcmp(k->key, "attention")) *(int *)dst = fam->default_sparse ? 1 : 2;
            char v[48];
            fmt_value(k, dst, v, sizeof v);
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s %s", *missing ? ", " : "",
                     k->key, v);
        }
    }
    if (o->flags.warmup != LONG_MIN) {
        if (o->resume && st->total_steps > 0 && o->flags.warmup != st->warmup && !o->quiet)
            printf("note: --warmup %ld replaces the checkpoint's warmup %ld from step %ld on\n", o->flags.warmup,
                   st->warmup, st->step + 1);
        hp.warmup = o->flags.warmup;
    }
    if (!isnan(o->flags.epochs)) hp.epochs = o->flags.epochs;
    else if (o->steps > 0 || (o->resume && st->total_steps > 0)) hp.epochs = 0;
    if (o->flags.log_every != LONG_MIN) hp.log_every = o->flags.log_every;
    if (*missing && !o->quiet)
        printf("note: %s/optimizer.safetensors (an older format) does not record every hyperparameter: using %s\n",
               o->out_dir, missing);
    if (!(hp.lr > 0 && isfinite(hp.lr)) || !(hp.beta1 >= 0 && hp.beta1 < 1) || !(hp.beta2 >= 0 && hp.beta2 < 1) ||
        !(hp.weight_decay >= 0) || !(hp.min_lr_ratio >= 0 && hp.min_lr_ratio <= 1) || !(hp.grad_clip >= 0) ||
        !(hp.muon_lr >= 0 && isfinite(hp.muon_lr)))
        return moh_fail(err, MOH_E_ARG, "--lr %g, --beta1 %g, --beta2 %g, --weight-decay %g, --min-lr-ratio %g, "
                        "--grad-clip %g, --muon-lr %g: expected lr > 0, betas in [0, 1), min-lr-ratio in [0, 1], "
                        "the others >= 0", hp.lr, hp.beta1, hp.beta2, hp.weight_decay, hp.min_lr_ratio,
                        hp.grad_clip, hp.muon_lr);
    if (hp.batch_size < 1 || hp.grad_accum < 1)
        return moh_fail(err, MOH_E_ARG, "--batch-size %d, --grad-accum %d: expected >= 1", hp.batch_size, hp.grad_accum);
    if (hp.shards > hp.batch_size) /* shards set the load-balance statistics: never change them silently */
        return moh_fail(err, MOH_E_ARG, "--shards is %d, more than --batch-size %d (each shard needs at least one "
                        "example)", hp.shards, hp.batch_size);
    if (hp.shards <= 0) hp.shards = model_default_shards(hp.batch_size);
    if (hp.attention != 1 && hp.attention != 2) hp.attention = fam->default_sparse ? 1 : 2;
    if (!o->resume && o->flags.precision == INT_MIN) hp.precision = MOH_PRECISION_AUTO; /* a resume: the checkpoint's */
    st->hp = hp;
    return MOH_OK;
}

/* ---- the trainer ----------------------------------------------------------------------------- */

typedef struct trainer {
    const train_options *o;
    dist_ctx *d;             /* the ranks of a multi-process run (size 1: one process) */
    model m;
    batch_source train, eval;
    model_shards w;
    void *g;                 /* gradient (family params struct) over gdata [m.n] */
    float *gdata;
    size_t gn;
    float *m1, *m2;          /* AdamW moments [m.n] */
    float *ema;              /* EMA of the weights [m.n] (hp.ema_decay > 0), else NULL */
    optim opt;               /* AdamW, or Muon + AdamW (hp.optimizer) */
    train_state st;
    const char *data;        /* --data, or on resume without it the checkpoint's data path */
    FILE *metrics;
    const moh_backend *be;   /* the device the run computes on (--device) */
    char device_note[224];   /* why --device auto fell back to the CPU ("" when nothing fell back) */
    char precision_note[224]; /* --precision auto: what it chose and the two times ("" otherwise) */
} trainer;

static int dump_grads(trainer *tr, const moh_batch *b, const float *init, moh_error *err) {
    int nt = 0;
    model_tensor *ts = model_tensors(&tr->m, &nt);
    const size_t nb = b->tokens ? (size_t)b->B * b->T : (size_t)b->B;
    float *in = malloc(sizeof(float) * nb * 2);
    moh_st_entry *e = calloc((size_t)nt * 2 + 2, sizeof *e);
    char (*names)[112] = calloc((size_t)nt * 2, sizeof *names);
    int rc = MOH_OK;
    if (!ts || !in || !e || !names) rc = moh_fail(err, MOH_E_NOMEM, "dump-grads: out of memory");
    if (!rc) {
        int n = 0;
        if (b->tokens) {
            for (size_t i = 0; i < nb; i++) {
                in[i] = (float)b->tokens[i];
                in[nb + i] = (float)b->targets[i];
            }
            e[n++] = (moh_st_entry){"tokens", 2, {b->B, b->T}, in};
            e[n++] = (moh_st_entry){"targets", 2, {b->B, b->T}, in + nb};
        } else {
            for (int j = 0; j < b->B; j++) in[j] = (float)b->labels[j];
            e[n++] = (moh_st_entry){"images", 4, {b->B, b->C, b->H, b->W}, b->images};
            e[n++] = (moh_st_entry){"labels", 1, {b->B}, in};
        }
        for (int i = 0; i < nt; i++) {
            snprintf(names[2 * i], sizeof names[0], "grad.%s", ts[i].name);
            snprintf(names[2 * i + 1], sizeof names[0], "init.%s", ts[i].name);
            moh_st_entry a = {names[2 * i], ts[i].ndim, {0}, tr->gdata + ts[i].offset};
            for (int d = 0; d < ts[i].ndim; d++) a.shape[d] = ts[i].shape[d];
            e[n++] = a;
            a.name = names[2 * i + 1];
            a.data = init + ts[i].offset;
            e[n++] = a;
        }
        rc = moh_st_write(tr->o->dump_grads, e, n, err);
    }
    free(ts);
    free(in);
    free(e);
    free(names);
    return rc;
}

static void eval_sum(void *ctx, double *x, size_t n) { dist_sum_f64(ctx, x, n); }

/* The run's compute precision: fp32, bf16 (fp32 where the CPU has no bf16 path, said and saved so),
 * or auto (the faster on a synthetic batch of the run's shape: model_shards_auto_precision, the
 * ranks agreeing). hp->precision becomes what runs. */
static int setup_precision(trainer *tr, int Blocal, moh_error *err) {
    const train_options *o = tr->o;
    train_hparams *hp = &tr->st.hp;
    const model *m = &tr->m;
    if (hp->precision != MOH_PRECISION_AUTO) {
        char why[192];
        const int rc = model_shards_set_precision(&tr->w, m, (moh_precision)hp->precision, why, sizeof why, err);
        if (rc) return rc;
        if (*why && !o->quiet) printf("moh train: --precision bf16 runs fp32: %s\n", why);
        hp->precision = tr->w.precision; /* saved as it runs */
        return MOH_OK;
    }
    precision_choice pc;
    const int rc = model_shards_auto_precision(&tr->w, m, Blocal, tr->train.seq_len, true, tr->g, tr->gdata,
                                               tr->d->size > 1 ? eval_sum : NULL, tr->d, &pc, err);
    if (rc) return rc;
    hp->precision = pc.run;
    snprintf(tr->precision_note, sizeof tr->precision_note, "%s", pc.note);
    return MOH_OK;
}

/* The device, the run's hyperparameters (flags over the checkpoint's over the family's), the EMA,
 * this rank's shards, the data (a resume's checked by its CRC), the compute precision, the optimizer
 * and a fresh run's initial weights. path: the config or model the run started from. */
static int setup_run(trainer *tr, train_keys_present present, bool ema_found, const char *path, moh_error *err) {
    const train_options *o = tr->o;
    model *m = &tr->m;
    const model_family *fam = m->fam;
    char label[4300];
    int rc;
    if ((rc = backend_resolve(o->device, fam->model_type, &tr->be, tr->device_note, sizeof tr->device_note, err)))
        return rc;
    const int max_T = fam->max_seq_len ? fam->max_seq_len(m->cfg) : 0;
    if ((rc = merge_hparams(o, fam, max_T, &tr->st, present, err))) return rc;
    const int R = tr->d->size;
    {   /* under mpirun the shards default to the ranks (one per process, as torchrun's data parallelism),
         * unless --shards or the checkpoint says otherwise */
        int nk = 0;
        const train_key *keys = train_state_keys(&nk);
        const int ks = train_state_key_index("shards");
        if (R > 1 && ks >= 0 && !flag_given(o, &keys[ks]) && !(o->resume && (present >> ks & 1)))
            tr->st.hp.shards = R;
    }
    const train_hparams *hp = &tr->st.hp;
    if (!(hp->ema_decay >= 0 && hp->ema_decay < 1))
        return moh_fail(err, MOH_E_ARG, "--ema-decay is %g, expected a number in [0, 1) (0 = no EMA)", hp->ema_decay);
    if (hp->ema_decay == 0) { /* no EMA: model.safetensors holds the trained weights */
        free(tr->ema);
        tr->ema = NULL;
    } else if (o->resume && !ema_found) {
        memcpy(tr->ema, m->data, sizeof(float) * m->n);
        if (!o->quiet) printf("note: %s/optimizer.safetensors holds no EMA: it starts from the current weights\n", o->out_dir);
    }
    if (R > 1 && (hp->shards % R || hp->batch_size % hp->shards))
        return moh_fail(err, MOH_E_ARG, "%d ranks: --shards %d must be a multiple of the ranks and --batch-size %d a "
                        "multiple of --shards (each rank takes whole shards; expected e.g. --shards %d --batch-size %d)",
                        R, hp->shards, hp->batch_size, R, (hp->batch_size + R - 1) / R * R);
    /* this rank's part: shards / R shards of the micro-batch's batch / R examples */
    const int n = hp->shards / R, Blocal = hp->batch_size / R, Bmax = (Blocal + n - 1) / n;
    snprintf(label, sizeof label, "%s %s", o->resume ? "the checkpoint" : o->init_path ? "the model" : "the config",
             o->resume ? o->out_dir : path);
    tr->data = o->data_path;
    if (!tr->data && o->resume && !tr->st.data_path[0])
        return moh_fail(err, MOH_E_ARG, "%s/optimizer.safetensors does not record the run's data (an older format): "
                        "give --data", o->out_dir);
    if (!tr->data && o->resume) {
        tr->data = tr->st.data_path;
        if (!o->quiet) printf("data: %s (the checkpoint's)\n", tr->data);
    }
    if (!tr->data) return moh_fail(err, MOH_E_ARG, "missing required option --data");
    const data_request req = {.path = tr->data, .hp = hp, .eval_batch = n * Bmax, .train = true,
                              .model_label = label, .quiet = o->quiet};
    if ((rc = fam->open_data(m, &req, &tr->train, &tr->eval, err))) return rc;
    const int kc = train_state_key_index("data_crc");
    if (o->resume && (present >> kc & 1) && tr->st.data_crc != tr->train.data_crc)
        return moh_fail(err, MOH_E_ARG, "--data %s is not the data of the run in %s (its training and validation data "
                        "have CRC-32 %08" PRIx64 ", these %08" PRIx32 "): a resume continues the same run on the same "
                        "data; to train these weights on other data start a new run with --init %s", tr->data,
                        o->out_dir, tr->st.data_crc, tr->train.data_crc, o->out_dir);
    tr->st.data_crc = tr->train.data_crc;
    char abs_data[sizeof tr->st.data_path]; /* recorded absolute, where the data is now */
    if (fs_absolute(tr->data, abs_data, sizeof abs_data)) memcpy(tr->st.data_path, abs_data, sizeof abs_data);
    if (o->resume && tr->st.steps_per_epoch > 0 && tr->st.steps_per_epoch != tr->train.steps_per_epoch)
        return moh_fail(err, MOH_E_ARG, "%s: the checkpoint has %ld steps per epoch, this data gives %ld (expected the "
                        "same training split and --train-limit as the original run)", o->out_dir,
                        tr->st.steps_per_epoch, tr->train.steps_per_epoch);
    const bool sparse = hp->attention == 1;
    if ((rc = model_shards_init(&tr->w, m, Blocal, tr->train.seq_len, n, true, sparse, err))) return rc;
    if ((rc = model_params_new(fam, m->cfg, &tr->g, &tr->gdata, &tr->gn, err))) return rc;
    if (!o->resume) {
        if (!o->init_path) fam->init_random(m->cfg, m->params, hp->seed); /* else the pretrained weights */
        if (tr->ema) memcpy(tr->ema, m->data, sizeof(float) * m->n);
        tr->st.data_rng = tr->train.rng_start;
        tr->st.steps_per_epoch = tr->train.steps_per_epoch;
    }
    if ((rc = setup_precision(tr, Blocal, err))) return rc;
    /* Muon's Newton-Schulz products in bf16 where the step runs bf16 */
    return optim_init(&tr->opt, m, hp->optimizer, hp->precision == MOH_PRECISION_BF16, tr->be, err);
}

/* The model (a config, pretrained weights or the checkpoint), the optimizer state and (resume) every
 * file of the checkpoint checked; then setup_run. */
static int setup(trainer *tr, moh_error *err) {
    const train_options *o = tr->o;
    char path[4200];
    int rc = MOH_OK;
    if (o->resume) {
        struct stat sb;
        const bool there = stat(o->out_dir, &sb) == 0;
        if (!there || !S_ISDIR(sb.st_mode))
            return moh_fail(err, MOH_E_IO, "--out '%s' is %s: expected the checkpoint folder of the run to resume",
                            o->out_dir, there ? "not a folder" : "not there");
        snprintf(path, sizeof path, "%s/config.json", o->out_dir);
    } else snprintf(path, sizeof path, "%s", o->init_path ? o->init_path : o->config_path);
    bool manifest = false, model_missing = false; /* checkpoint.json: the last save's files, all of them */
    if (o->resume && (rc = manifest_check(o->out_dir, true, &manifest, &model_missing, NULL, err))) return rc;
    rc = !o->resume && o->init_path ? model_open(&tr->m, path, err) : model_from_config_file(&tr->m, path, err);
    if (!rc && o->resume) rc = model_load_tokenizer(&tr->m, o->out_dir, err); /* a BPE model's vocabulary */
    if (rc) return rc;
    model *m = &tr->m;
    const model_family *fam = m->fam;
    tr->m1 = calloc(m->n, sizeof(float));
    tr->m2 = calloc(m->n, sizeof(float));
    if (!tr->m1 || !tr->m2) return moh_fail(err, MOH_E_NOMEM, "optimizer state: out of memory");
    train_keys_present present = 0;
    train_hparams defaults;
    fam->train_defaults(&defaults);
    const bool may_ema = defaults.ema_decay > 0 || (!isnan(o->flags.ema_decay) && o->flags.ema_decay > 0);
    if (may_ema && !(tr->ema = malloc(sizeof(float) * m->n))) return moh_fail(err, MOH_E_NOMEM, "EMA: out of memory");
    bool ema_found = false;
    if (o->resume && (rc = checkpoint_load_optimizer_ema(o->out_dir, m, m->data, tr->m1, tr->m2, tr->ema, &ema_found,
                                                         &tr->st, &present, err)))
        return rc;
    if (o->resume) { /* every file of the checkpoint is checked before anything is decided: a damaged
                      * model.safetensors stops a resume instead of passing for a finished run */
        const float *expect = ema_found ? tr->ema : m->data; /* what the save wrote there */
        ckpt_model_state ms = model_missing ? CKPT_MODEL_MISSING : CKPT_MODEL_SAME;
        long mstep = -1;
        /* (with a manifest every file was checked against it; else model.safetensors is compared with
         * the weights in optimizer.safetensors) */
        if (!manifest && (rc = checkpoint_check_model(o->out_dir, m, expect, tr->st.step, &ms, &mstep, err)))
            return rc;
        if (ms == CKPT_MODEL_MISSING && tr->d->rank == 0) { /* restored: exactly what the last save wrote */
            if ((rc = checkpoint_save_model(o->out_dir, m, expect, tr->st.step, err))) return rc;
            bool again = false; /* the same bytes as the save wrote, or the manifest says which differ */
            if (manifest && (rc = manifest_check(o->out_dir, true, &again, NULL, NULL, err))) return rc;
            if (!o->quiet)
                printf("note: %s/model.safetensors was missing: written again from optimizer.safetensors (step %ld)\n",
                       o->out_dir, tr->st.step);
        } else if (ms == CKPT_MODEL_NEWER && tr->d->rank == 0 && !o->quiet) {
            printf("note: %s/model.safetensors is of step %ld, from a save that ended before its optimizer.safetensors "
                   "(step %ld): training resumes from step %ld and the next save rewrites it\n", o->out_dir, mstep,
                   tr->st.step, tr->st.step);
        }
    }
    return setup_run(tr, present, ema_found, path, err);
}

static void teardown(trainer *tr) {
    batch_source_free(&tr->train);
    batch_source_free(&tr->eval);
    if (tr->m.fam) {
        model_shards_free(&tr->w, &tr->m);
        if (tr->g) model_params_free(tr->m.fam, tr->g);
    }
    model_free(&tr->m);
    free(tr->m1);
    free(tr->m2);
    free(tr->ema);
    optim_free(&tr->opt);
    if (tr->metrics) fclose(tr->metrics);
}

/* Wall time of this session, split into training and the rest (validation, checkpoints), with
 * what the rest cost so far: the inputs of the --max-minutes fit and the rates. */
typedef struct run_clock {
    double t0, over_s;      /* session start (train_now_s); seconds in validation and checkpoints */
    double val_s;           /* seconds of the periodic validations, over val_items items */
    long val_items;
    double eval_s;          /* seconds of the periodic validations with their checkpoints */
    long evals;
    double save_s;          /* seconds of all checkpoints */
    long saves;
    double base_s;          /* training seconds before base_step (the session's first 3 steps, */
    long start_step, base_step; /* slower than the rest: left out of the step time once possible) */
} run_clock;

static double training_s(const run_clock *c, double now) { return now - c->t0 - c->over_s; }

/* The cost model of the rest of the run (train_util.h) from what this session measured. Not yet
 * measured: an evaluation item costs a third of a training example (forward only), a checkpoint
 * 0 s; the first validations and saves replace these guesses. */
static train_cost_model cost_model(const trainer *tr, const run_clock *c, long step, double now) {
    const train_hparams *hp = &tr->st.hp;
    train_cost_model m = {0};
    const double train_s = training_s(c, now);
    if (step - c->base_step >= 3) m.step_s = (train_s - c->base_s) / (double)(step - c->base_step);
    else if (step > c->start_step) m.step_s = train_s / (double)(step - c->start_step);
    const double per_step = (double)tr->train.examples_per_step * hp->grad_accum;
    const double item_s = c->val_items > 0 ? c->val_s / (double)c->val_items : m.step_s / per_step / 3.0;
    const double save_s = c->saves > 0 ? c->save_s / (double)c->saves : 0.0;
    const double full = (double)tr->eval.eval_items(tr->eval.self, 0);
    const double periodic = (double)tr->eval.eval_items(tr->eval.self, hp->eval_limit);
    m.eval_s = c->evals > 0 ? c->eval_s / (double)c->evals : periodic * item_s + save_s;
    m.save_s = save_s;
    m.final_s = full * item_s + save_s;
    m.eval_every = hp->eval_every;
    m.save_every = tr->st.hp.save_every;
    return m;
}

/* x with fmt, or null when not finite (JSON has no nan / inf). */
static void json_num(char *buf, size_t cap, const char *fmt, double x) {
    if (isfinite(x)) snprintf(buf, cap, fmt, x);
    else snprintf(buf, cap, "null");
}

static const char *router_label(const moh_attn_config *a) {
    return a->router == MOH_ROUTER_NONE ? "none (dense MHA)" : a->router == MOH_ROUTER_LEARNED ? "learned" : "query_norm";
}

/* A failure every rank agreed on: the rank holding the message prints it now, then all ranks meet,
 * so that none exits before it is out (mpirun ends the job at the first non-zero exit and may drop
 * the output of ranks it kills). Returns rc with err->msg emptied. */
static int fail_together(dist_ctx *d, int rc, moh_error *err) {
    if (err && err->msg[0]) {
        fprintf(stderr, "moh train: %s\n", err->msg);
        fflush(stderr);
        err->msg[0] = '\0';
    }
    dist_max_int(d, 0);
    return rc;
}

/* Agreement of the ranks on a failure before the next collective: every rank returns non-zero
 * when one failed. Rank 0 reports its own failure; a failure of another rank alone is reported by
 * that rank ("rank R: ..."); the others stay silent (empty message). */
static int agree(dist_ctx *d, int rc, moh_error *err) {
    if (d->size <= 1) return rc;
    if (!dist_max_int(d, rc != 0)) return MOH_OK;
    int rc0 = rc;
    dist_bcast(d, &rc0, sizeof rc0);
    if (rc == 0 || (d->rank != 0 && rc0 != 0)) {
        if (err) err->msg[0] = '\0';
        return fail_together(d, rc ? rc : MOH_E_ARG, err);
    }
    if (d->rank != 0 && err) { /* "rank R: " before the message (cut at the buffer's end) */
        char pre[24];
        const int np = snprintf(pre, sizeof pre, "rank %d: ", d->rank);
        const size_t len = strlen(err->msg), keep = len + (size_t)np < sizeof err->msg ? len : sizeof err->msg - 1 - (size_t)np;
        memmove(err->msg + np, err->msg, keep);
        memcpy(err->msg, pre, (size_t)np);
        err->msg[np + keep] = '\0';
    }
    return fail_together(d, rc, err);
}

/* Hash of what must be the same on every rank: the binary, the config, the run's hyperparameters
 * and state, the size of the data. */
static uint64_t run_hash(const trainer *tr) {
    uint64_t h = DIST_HASH_START;
    FILE *f = fopen("/proc/self/exe", "rb");
    if (f) {
        char buf[65536];
        for (size_t k; (k = fread(buf, 1, sizeof buf, f)) > 0;) h = dist_hash(h, buf, k);
        fclose(f);
    }
    char *json = tr->m.fam->config_to_json(tr->m.cfg);
    if (json) h = dist_hash(h, json, strlen(json));
    free(json);
    int nk = 0;
    const train_key *keys = train_state_keys(&nk);
    char v[64];
    for (int i = 0; i < nk; i++) {
        fmt_value(&keys[i], (const char *)&tr->st + keys[i].offset, v, sizeof v);
        h = dist_hash(h, v, strlen(v));
    }
    const size_t sizes[2] = {tr->train.n_train, tr->eval.n_eval};
    return dist_hash(h, sizes, sizeof sizes);
}

/* dist_sum_f64 as an eval_split sum */
static void pet(void *ctx, long done, long total) { dist_watchdog_pet(ctx); }

/* The state of one session's step loop (run and its phases). */
typedef struct run_loop {
    long total;             /* the schedule's steps (provisional 2^40 until a --max-minutes fit) */
    bool auto_total;        /* fitted to --max-minutes */
    bool fitted;            /* total is known */
    long warmup, warmup_cap, eval_every, spe, per_step, whole_split, start_step;
    double max_s, elapsed0, c0; /* the budget (s), elapsed_s and the CPU clock at the start */
    run_clock clk;
    double last_log_train_s, last_metric;
    long last_log_step, last_eval_n; /* items the last validation covered (the whole split: "final") */
    int bad_run;            /* non-finite steps in a row */
    float *init;            /* --dump-grads: the initial weights, until the first step */
    eval_split split;       /* validation split across the ranks */
    moh_progress watch;
} run_loop;

/* One step: what it measured and what follows it. */
typedef struct step_out {
    long step;              /* the step's index (st->step before it) */
    double t_top, t, lr, lr_muon, loss, ce, lb, gnorm, comm_s, val_s, smin, smax;
    double train_s;         /* training seconds of the session at t (validations and saves excluded) */
    bool bad, pause, time_up, intr, last, do_eval;
    train_cost_model cm;    /* the rest of the run as run_decide saw it */
    model_eval ev;
    char fam_json[96];
} step_out;

/* The schedule length: --steps; or (resume) the interrupted run's; or --epochs (or the family's
 * default epochs when no --max-minutes is given) over data with epochs; or fitted to
 * --max-minutes. A resume of a time-fitted run keeps the saved length (the lr curve goes on from
 * where it stopped) and --max-minutes only caps that session. Checked before --out is touched.
 * *done: nothing to train (a resume already at its last step). */
static int run_length(trainer *tr, run_loop *L, bool *done, moh_error *err) {
    const train_options *o = tr->o;
    train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    const long spe = L->spe;
    long total = o->steps;
    *done = false;
    if (total == 0 && !isnan(o->flags.epochs) && spe > 0) total = llround(hp->epochs * (double)spe); /* --epochs */
    if (o->resume && st->total_steps > 0 && total == 0) total = st->total_steps;
    if (o->resume && o->stop_at_step > 0 && o->stop_at_step <= st->step)
        return moh_fail(err, MOH_E_ARG, "--stop-at-step %ld is not after the checkpoint's step %ld in %s (expected a "
                        "later step)", o->stop_at_step, st->step, o->out_dir);
    if (o->resume && total > 0 && st->total_steps > 0 && total != st->total_steps && !o->quiet && st->step < total)
        printf("note: %s gives %ld steps in place of the checkpoint's total_steps %ld (the cosine is recomputed over "
               "the new length from step %ld on)\n", o->steps > 0 ? "--steps" : "--epochs", total, st->total_steps,
               st->step + 1);
    if (total == 0 && hp->epochs > 0 && (!isnan(o->flags.epochs) || o->max_minutes <= 0)) {
        if (spe <= 0) {
            if (!isnan(o->flags.epochs))
                return moh_fail(err, MOH_E_ARG, "--epochs needs data read in epochs (images); %s draws random windows: "
                                "give --steps or --max-minutes", tr->data);
        } else {
            total = llround(hp->epochs * (double)spe);
            if (total < 1)
                return moh_fail(err, MOH_E_ARG, "--epochs %g gives %ld steps, expected at least 1", hp->epochs, total);
        }
    }
    L->total = total;
    L->auto_total = total <= 0;
    if (L->auto_total && o->max_minutes <= 0) return moh_fail(err, MOH_E_ARG, "give --steps or --max-minutes");
    if (o->resume && !L->auto_total && st->step > total)
        return moh_fail(err, MOH_E_ARG, "--steps is %ld, but the checkpoint in %s is already at step %ld (expected "
                        "--steps above it to train on)", total, o->out_dir, st->step);
    if (o->resume && !L->auto_total && st->step == total) { /* nothing to train: touch nothing else */
        if (tr->d->rank == 0) fs_remove_stale_tmp(o->out_dir); /* (train_metrics_open does it for a run that trains) */
        if (!o->quiet)
            printf("moh train: the checkpoint in %s is already at step %ld of its %ld-step run: nothing to train "
                   "(give a larger --steps to continue)\n", o->out_dir, st->step, total);
        *done = true;
    }
    return MOH_OK;
}

/* The checkpoint folder and metrics.jsonl (rank 0), the MPI watchdog, the --dump-grads copy of the
 * initial weights; then the warmup, the validation period and the clocks. */
static int run_open(trainer *tr, run_loop *L, moh_error *err) {
    const train_options *o = tr->o;
    train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    int rc = MOH_OK;
    if (tr->d->rank == 0) { /* rank 0 alone writes the checkpoint folder */
        if (!o->resume) rc = train_check_fresh_out(o->out_dir, err);
        if (!rc) rc = fs_mkdir_p(o->out_dir, err);
        if (!rc) rc = train_metrics_open(o->out_dir, o->resume, st->step, &tr->metrics, err);
    }
    if ((rc = agree(tr->d, rc, err))) return rc;
    if (tr->d->size > 1 && (rc = dist_watchdog_start(tr->d, o->comm_timeout, err))) return rc;
    if (o->dump_grads) {
        if (!(L->init = malloc(sizeof(float) * tr->m.n))) return moh_fail(err, MOH_E_NOMEM, "out of memory");
        memcpy(L->init, tr->m.data, sizeof(float) * tr->m.n);
    }
    L->per_step = tr->train.examples_per_step * hp->grad_accum;
    L->warmup_cap = tr->train.warmup_cap > 0 ? tr->train.warmup_cap : 100;
    L->warmup = hp->warmup >= 0 ? hp->warmup : L->warmup_cap;
    if (!L->auto_total && hp->warmup < 0 && L->warmup > L->total / 10) L->warmup = L->total / 10;
    if (o->resume && st->total_steps > 0 && o->flags.warmup == LONG_MIN) L->warmup = st->warmup;
    if (L->auto_total) L->total = 1L << 40; /* provisional, fitted after the first timed steps */
    st->total_steps = L->auto_total ? 0 : L->total;
    st->warmup = L->warmup;
    L->fitted = !L->auto_total;
    if (!L->auto_total && L->warmup >= L->total && st->step < L->total && !o->quiet)
        printf("note: the warmup of %ld steps is not below the run's %ld steps: the lr never decays (give a smaller "
               "--warmup)\n", L->warmup, L->total);
    L->eval_every = hp->eval_every > 0 ? hp->eval_every : L->spe;
    L->elapsed0 = st->elapsed_s;
    L->max_s = o->max_minutes * 60.0;
    L->c0 = train_cpu_s();
    L->clk = (run_clock){.t0 = train_now_s(), .start_step = st->step, .base_step = st->step};
    L->start_step = L->last_log_step = st->step;
    L->last_log_train_s = 0.0;
    L->last_metric = NAN;
    L->whole_split = tr->eval.eval_items(tr->eval.self, 0);
    return MOH_OK;
}

/* The start lines: the model, the compute, the data and the schedule. */
static void run_print_start(const trainer *tr, const run_loop *L) {
    const train_options *o = tr->o;
    const model *m = &tr->m;
    const model_family *fam = m->fam;
    const train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    const moh_attn_config *a = model_attn(m);
    const int R = tr->d->size;
    printf("moh train: %s a %s (model_type \"%s\"), %zu parameters (%.2fM), router %s, %.3g/%d heads active per "
           "token, %s attention\n", o->resume ? "resuming" : "starting", fam->summary, fam->model_type, m->n,
           m->n / 1e6, router_label(a), model_active_heads(m), a->n_heads,
           hp->attention == 1 ? "head-sparse" : "reference");
    char prec[256];
    precision_describe(tr->w.precision, prec, sizeof prec);
    printf("compute: %s%s%s%s; device %s%s%s%s\n", prec, tr->precision_note[0] ? "; --precision auto chose " : "",
           tr->precision_note,
           tr->w.precision != MOH_PRECISION_BF16 || hp->attention == 1
               ? "" : "; reference attention: qkv and W_O in bf16, per-head scores and P V fp32",
           tr->be->name, tr->device_note[0] ? " (" : "", tr->device_note, tr->device_note[0] ? ")" : "");
    if (o->init_path && !o->resume) printf("weights from %s (pretrained; fresh optimizer, step 0)\n", o->init_path);
    char tshape[32] = "";
    if (tr->train.seq_len > 0) snprintf(tshape, sizeof tshape, " T=%d", tr->train.seq_len);
    char evs[96] = ""; /* periodic validations on part of the split, the final one on all of it */
    if (hp->eval_limit > 0 && (size_t)hp->eval_limit < tr->eval.n_eval)
        snprintf(evs, sizeof evs, " (periodic validations: %ld %s; the final one: the whole split)", hp->eval_limit,
                 tr->eval.eval_unit ? tr->eval.eval_unit : "items");
    printf("data %s: %zu train / %zu eval %s%s; B=%d%s x accum %d in %d shard%s, %s steps", tr->data,
           tr->train.n_train, tr->eval.n_eval, tr->train.what, evs, hp->batch_size, tshape, hp->grad_accum, hp->shards,
           hp->shards == 1 ? "" : "s", L->auto_total ? "time-fitted" : "fixed");
    if (!L->auto_total) printf(" (%ld", L->total);
    if (!L->auto_total && L->spe > 0) printf(", %.2f epochs of %ld", (double)L->total / L->spe, L->spe);
    if (!L->auto_total) printf(")");
    if (L->auto_total && hp->warmup < 0 && !(o->resume && st->step > 0)) /* set by the fit, below */
        printf(", warmup min(%ld, steps / 10), lr %g, seed %llu", L->warmup_cap, hp->lr, (unsigned long long)hp->seed);
    else printf(", warmup %ld, lr %g, seed %llu", L->warmup, hp->lr, (unsigned long long)hp->seed);
    if (hp->optimizer == 1) printf(", Muon at lr %g on the hidden matrices", hp->muon_lr > 0 ? hp->muon_lr : hp->lr);
    if (R > 1) printf("; %d ranks (MPI) of %d shard%s each", R, hp->shards / R, hp->shards / R == 1 ? "" : "s");
    printf("\n");
    fflush(stdout);
}

/* --max-minutes without a length: before every step, total = this step + the steps that still fit
 * in the budget at the measured step time, with the periodic validations and checkpoints still due
 * and the final whole-split validation costed in (never below step + 1). lr(step) is the cosine over
 * the current total; a refit by d steps moves it by at most ~1.6 d / (total - warmup) of the lr
 * range, and follows only the drift of the measured times, so the curve stays close to one cosine
 * and reaches its minimum at the last step, as the budget ends. The first fit comes after 6 steps
 * (3 timed after the 3 slow first ones); the warmup (unless given) is min(cap, total / 10) of that
 * fit, then kept. Until then the lr ramps as with a warmup of cap. Under MPI rank 0's fit holds. */
static void run_fit(trainer *tr, run_loop *L, long step, double t_top) {
    const train_options *o = tr->o;
    train_state *st = &tr->st;
    if (L->auto_total && step - L->start_step >= 6) {
        const train_cost_model cm = cost_model(tr, &L->clk, step, t_top);
        const long nfit = train_fit_steps(&cm, step, L->max_s - (t_top - L->clk.t0));
        st->total_steps = L->total = step + (nfit > 1 ? nfit : 1);
        if (!L->fitted) {
            L->fitted = true;
            if (st->hp.warmup < 0)
                st->warmup = L->warmup = L->total / 10 < L->warmup_cap ? L->total / 10 : L->warmup_cap;
            if (!o->quiet) {
                printf("schedule fitted to %g min: %ld steps (%.3f s/step; refitted as training goes), warmup %ld",
                       o->max_minutes, L->total, cm.step_s, L->warmup);
                if (st->hp.warmup < 0 && L->warmup < L->warmup_cap) /* what the lr of the steps so far was */
                    printf(" (until this fit the lr ramped as for a warmup of %ld)", L->warmup_cap);
                printf("\n");
            }
        }
    }
    if (L->auto_total && tr->d->size > 1) {
        long fit[3] = {L->total, L->warmup, L->fitted};
        dist_bcast(tr->d, fit, sizeof fit);
        st->total_steps = L->total = fit[0];
        st->warmup = L->warmup = fit[1];
        L->fitted = fit[2] != 0;
    }
}

/* The step's gradient into tr->gdata: its micro-batches through the shards, the ranks' mean, the
 * accumulation mean, the --debug-nan-grad hook, --dump-grads after the first. */
static int run_gradient(trainer *tr, run_loop *L, step_out *S, moh_batch *b, moh_error *err) {
    const train_options *o = tr->o;
    dist_ctx *d = tr->d;
    const int R = d->size;
    train_hparams *hp = &tr->st.hp;
    const long step = S->step;
    int rc;
    memset(tr->gdata, 0, sizeof(float) * tr->gn);
    for (int micro = 0; micro < hp->grad_accum; micro++) {
        if ((rc = tr->train.next(tr->train.self, step, micro, d->rank, R, &tr->st.data_rng, b, err))) return rc;
        double c = 0.0, l = 0.0;
        S->loss += model_shards_step(&tr->m, &tr->w, b, true, tr->g, tr->gdata, &c, &l);
        S->ce += c;
        S->lb += l;
    }
    const bool nan_hook = o->nan_count > 0 && step + 1 >= o->nan_step && step + 1 < o->nan_step + o->nan_count;
    if (R > 1) { /* the ranks' equal parts: mean of their gradients and losses */
        const double c0s = d->comm_s;
        const float inv = 1.0f / (float)R;
        for (size_t i = 0; i < tr->gn; i++) tr->gdata[i] *= inv;
        if (nan_hook && d->rank == R - 1) tr->gdata[tr->gn / 2] = NAN; /* test hook: on the last rank only */
        dist_sum_f32(d, tr->gdata, tr->gn, (size_t)1 << 20);
        double sums[3] = {S->loss / R, S->ce / R, S->lb / R};
        dist_sum_f64(d, sums, 3);
        S->loss = sums[0], S->ce = sums[1], S->lb = sums[2];
        S->comm_s = d->comm_s - c0s;
    }
    if (hp->grad_accum > 1) {
        for (size_t i = 0; i < tr->gn; i++) tr->gdata[i] /= (float)hp->grad_accum;
        S->loss /= hp->grad_accum;
        S->ce /= hp->grad_accum;
        S->lb /= hp->grad_accum;
    }
    if (R == 1 && nan_hook) tr->gdata[tr->gn / 2] = NAN; /* test hook (--debug-nan-grad) */
    if (L->init) {
        rc = dump_grads(tr, b, L->init, err);
        free(L->init);
        L->init = NULL;
        if (rc) return rc;
    }
    return MOH_OK;
}

/* Clipping, the non-finite guard (such a step is never applied: the weights and moments stay as
 * they were, it is only counted; the run stops after max_bad_steps of them in a row), the
 * optimizer and the EMA. */
static int run_update(trainer *tr, run_loop *L, step_out *S, moh_error *err) {
    const train_options *o = tr->o;
    train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    model *m = &tr->m;
    const long step = S->step;
    S->gnorm = tr->be->clip_grad_norm(tr->gdata, tr->gn, hp->grad_clip);
    S->bad = !isfinite(S->loss) || !isfinite(S->gnorm);
    if (S->bad) {
        L->bad_run++;
        st->skipped++;
        if (tr->d->rank == 0)
            fprintf(stderr, "moh train: warning: step %ld: loss %g, gradient norm %g: not finite, step skipped (%d in a "
                    "row, %ld in the run)\n", step + 1, S->loss, S->gnorm, L->bad_run, st->skipped);
        if (L->bad_run >= o->max_bad_steps) {
            char muon_hint[64] = "";
            if (hp->optimizer == 1)
                snprintf(muon_hint, sizeof muon_hint, " or --muon-lr (now %g)", hp->muon_lr > 0 ? hp->muon_lr : hp->lr);
            const int rc = moh_fail(err, MOH_E_ARG, "steps %ld-%ld: loss or gradient not finite %d times in a row; "
                                    "stopped (the last checkpoint in %s is intact); lower --lr (now %g)%s",
                                    step + 2 - L->bad_run, step + 1, L->bad_run, o->out_dir, hp->lr, muon_hint);
            if (tr->d->rank != 0) err->msg[0] = '\0'; /* the same on every rank: rank 0 says it */
            return rc;
        }
        return MOH_OK;
    }
    L->bad_run = 0;
    const adamw_config ac = {hp->beta1, hp->beta2, 1e-8, hp->weight_decay};
    const muon_config mc = {.momentum = 0.95, .weight_decay = hp->weight_decay, .ns_steps = 5};
    optim_step(&tr->opt, &ac, &mc, m->data, tr->gdata, tr->m1, tr->m2, step + 1, S->lr, S->lr_muon);
    if (tr->ema) { /* decay warmed up over the first updates: min(d, (1 + n) / (10 + n)) */
        const double n = (double)(step + 1), dn = (1.0 + n) / (10.0 + n);
        tr->be->ema_update(tr->ema, m->data, m->n, (float)(hp->ema_decay < dn ? hp->ema_decay : dn));
    }
    return MOH_OK;
}

/* After a step: whether the session ends here (the schedule's end, out of time, Ctrl-C,
 * --stop-at-step) and whether it validates. Out of time means one more step and the final
 * validation no longer fit; during the first 3 steps (too slow to predict from) only when the
 * budget is spent. Under MPI rank 0's clock decides and a Ctrl-C on any rank stops every rank. */
static void run_decide(trainer *tr, run_loop *L, step_out *S, train_signals *sigs) {
    const train_state *st = &tr->st;
    const double run_s = S->t - L->clk.t0;
    S->pause = tr->o->stop_at_step > 0 && st->step >= tr->o->stop_at_step;
    S->cm = cost_model(tr, &L->clk, st->step, S->t);
    S->time_up = L->max_s > 0 && (run_s >= L->max_s || (st->step - L->start_step >= 3 &&
                                                        train_fit_steps(&S->cm, st->step, L->max_s - run_s) == 0));
    /* read once: a Ctrl-C after this point is handled at the next step, never without a save */
    S->intr = train_interrupted(sigs);
    if (tr->d->size > 1) {
        int flags[1] = {S->time_up};
        dist_bcast(tr->d, flags, sizeof flags);
        S->time_up = flags[0] != 0;
        S->intr = dist_max_int(tr->d, S->intr) != 0;
    }
    S->last = st->step >= L->total || S->time_up || S->intr || S->pause;
    /* the end of the run validates the whole split; Ctrl-C saves at once (no validation);
     * --stop-at-step validates as a periodic validation does */
    S->do_eval = (S->last && !S->intr) || (L->eval_every > 0 && st->step % L->eval_every == 0);
}

/* The step's validation (S->do_eval) into S->ev. A periodic validation that used up the budget
 * (one more step and the final one no longer fit) ends the run here: it is the final one when it
 * covered the whole split; otherwise the whole split is validated only if time is left. */
static int run_validate(trainer *tr, run_loop *L, step_out *S, moh_error *err) {
    const train_state *st = &tr->st;
    const bool whole = S->last && !S->intr && !S->pause;
    int rc = model_evaluate_split(&tr->m, &tr->w, &tr->eval, whole ? 0 : st->hp.eval_limit, &L->watch, &L->split,
                                  &S->ev, err);
    if (rc) return rc;
    S->val_s = train_now_s() - S->t;
    L->clk.over_s += S->val_s;
    if (!S->last) {
        L->clk.val_s += S->val_s;
        L->clk.val_items += S->ev.n;
    }
    const double t0 = L->clk.t0, max_s = L->max_s, t2 = train_now_s();
    int spent[2] = {!S->last && max_s > 0 && (t2 - t0 >= max_s || train_fit_steps(&S->cm, st->step, max_s - (t2 - t0)) == 0),
                    t2 - t0 < max_s};
    dist_bcast(tr->d, spent, sizeof spent); /* rank 0's clock decides */
    if (spent[0]) {
        S->time_up = S->last = true;
        if (S->ev.n < L->whole_split && spent[1]) {
            model_eval_free(&S->ev);
            if ((rc = model_evaluate_split(&tr->m, &tr->w, &tr->eval, 0, &L->watch, &L->split, &S->ev, err))) return rc;
            S->val_s = train_now_s() - S->t;
            L->clk.over_s += train_now_s() - t2;
        } else if (S->ev.n < L->whole_split && !tr->o->quiet) {
            printf("note: the time budget ran out in the validation at step %ld: it covered %ld of the split's %ld %s "
                   "(moh eval gives the whole split)\n", st->step, S->ev.n, L->whole_split, tr->eval.eval_unit);
        }
    }
    L->last_metric = S->ev.metric;
    L->last_eval_n = S->ev.n;
    return MOH_OK;
}

/* One metrics.jsonl line (rank 0); JSON has no nan / inf: null. */
static void run_metrics(const trainer *tr, const run_loop *L, const step_out *S) {
    FILE *mf = tr->metrics;
    if (!mf) return;
    const train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    char loss_s[32], ce_s[32], gn_s[32], lb_s[32];
    json_num(loss_s, sizeof loss_s, "%.6f", S->loss);
    json_num(ce_s, sizeof ce_s, "%.6f", S->ce);
    json_num(gn_s, sizeof gn_s, "%.4f", S->gnorm);
    json_num(lb_s, sizeof lb_s, "%.6f", S->lb);
    fprintf(mf, "{\"step\": %ld", st->step);
    if (L->spe > 0) fprintf(mf, ", \"epoch\": %.4f", (double)st->step / L->spe);
    fprintf(mf,
            ", \"loss\": %s, \"ce\": %s, \"lb_loss\": %s, \"lr\": %.6g, \"grad_norm\": %s%s, \"%s\": %.0f, "
            "\"elapsed_s\": %.2f, \"cpu_s\": %.2f, \"step_s\": %.4f, \"train_%s_s\": %.1f, \"routed_share_min\": "
            "%.4f, \"routed_share_max\": %.4f",
            loss_s, ce_s, lb_s, S->lr, gn_s, S->fam_json, tr->train.seen_key, st->examples_seen, st->elapsed_s,
            train_cpu_s() - L->c0, S->t - S->t_top, tr->train.unit,
            (double)(st->step - L->start_step) * L->per_step / S->train_s, S->smin, S->smax);
    if (hp->optimizer == OPTIM_MUON) fprintf(mf, ", \"muon_lr\": %.6g", S->lr_muon);
    if (st->skipped > 0) fprintf(mf, ", \"skipped\": %ld", st->skipped);
    if (S->bad) fprintf(mf, ", \"step_skipped\": true");
    if (L->fitted) fprintf(mf, ", \"total_steps\": %ld", L->total);
    if (tr->d->size > 1) fprintf(mf, ", \"ranks\": %d, \"comm_s\": %.4f", tr->d->size, S->comm_s);
    if (S->do_eval) {
        char js[256];
        tr->m.fam->eval_json(&S->ev, js, sizeof js);
        fprintf(mf, "%s, \"val_s\": %.3f", js, S->val_s);
    }
    fprintf(mf, "}\n");
    fflush(mf);
}

/* The progress line: training examples per second since the last one (validation and checkpoints
 * excluded), elapsed and remaining time, head shares, the validation. */
static void run_progress(const trainer *tr, run_loop *L, const step_out *S) {
    const train_state *st = &tr->st;
    const double run_s = S->t - L->clk.t0, train_s = S->train_s;
    const double rate = (double)(st->step - L->last_log_step) * L->per_step / (train_s - L->last_log_train_s);
    double eta = L->fitted ? train_cost_of(&S->cm, st->step, L->total - st->step) : L->max_s - run_s;
    if (L->max_s > 0 && eta > L->max_s - run_s) eta = L->max_s - run_s;
    char el[32], et[32], share[64] = "", val[96] = "", ep[32] = "", tot[24] = "?";
    train_fmt_time(el, sizeof el, st->elapsed_s);
    train_fmt_time(et, sizeof et, eta);
    if (model_attn(&tr->m)->router != MOH_ROUTER_NONE)
        snprintf(share, sizeof share, " | head share %.2f-%.2f", S->smin, S->smax);
    if (S->do_eval) tr->m.fam->eval_brief(&S->ev, val, sizeof val);
    if (L->spe > 0) snprintf(ep, sizeof ep, " | ep %5.2f", (double)st->step / L->spe);
    if (L->fitted) snprintf(tot, sizeof tot, "%ld", L->total); /* not known until the --max-minutes fit */
    printf("step %6ld/%-6s%s | loss %.4f | lb %.3f | lr %.2e | %6.0f %s/s | %s, ETA %s%s%s\n", st->step, tot, ep,
           S->ce, S->lb, S->lr, rate, tr->train.unit, el, et, share, val);
    fflush(stdout);
    L->last_log_train_s = train_s;
    L->last_log_step = st->step;
}

/* A checkpoint when one is due (the end, a validation, --save-every); never a non-finite value in
 * it (the guard checks the loss and gradient; a damaged moment could still turn a weight to nan). */
static int run_save(trainer *tr, run_loop *L, const step_out *S, moh_error *err) {
    const train_state *st = &tr->st;
    const bool due = S->last || S->do_eval || (st->hp.save_every > 0 && st->step % st->hp.save_every == 0);
    if (!due) return MOH_OK;
    const double ts = train_now_s();
    moh_error why = {0};
    int rc = MOH_OK;
    if (model_check_finite("weights", "parameters", tr->m.data, tr->m.n, &why))
        rc = moh_fail(err, MOH_E_ARG, "step %ld: a weight is not finite (%s); nothing saved, the last checkpoint in %s "
                      "is intact", st->step, why.msg, tr->o->out_dir);
    if (!rc && tr->d->rank == 0) rc = checkpoint_save_ema(tr->o->out_dir, &tr->m, tr->m1, tr->m2, tr->ema, st, err);
    if ((rc = agree(tr->d, rc, err))) return rc;
    const double sv = train_now_s() - ts;
    L->clk.over_s += sv;
    L->clk.save_s += sv;
    L->clk.saves++;
    if (S->do_eval && !S->last) {
        L->clk.eval_s += S->val_s + sv;
        L->clk.evals++;
    }
    return MOH_OK;
}

/* How the session ends after a step that ends it: 130 after Ctrl-C, 0 otherwise (printed). */
static int run_end_of_session(const trainer *tr, const run_loop *L, const step_out *S) {
    const train_options *o = tr->o;
    const train_state *st = &tr->st;
    if (S->intr) {
        if (!o->quiet) printf("interrupted: checkpoint saved to %s at step %ld\n", o->out_dir, st->step);
        return 130;
    }
    if (S->pause && st->step < L->total) {
        if (!o->quiet) printf("stopped at step %ld as asked; continue with --resume\n", st->step);
    } else if (S->time_up && st->step < L->total && !o->quiet) {
        if (L->fitted) printf("time budget of %g min reached at step %ld of %ld (checkpoint saved; --resume "
                              "continues)\n", o->max_minutes, st->step, L->total);
        else printf("time budget of %g min reached at step %ld, before the schedule was fitted\n", o->max_minutes,
                    st->step);
    }
    return 0;
}

/* The closing line of a session that was not interrupted. */
static void run_print_done(const trainer *tr, const run_loop *L) {
    const train_state *st = &tr->st;
    const double now = train_now_s();
    char wall[32], trs[32], ov[32], sk[48] = "";
    train_fmt_time(wall, sizeof wall, now - L->clk.t0);
    train_fmt_time(trs, sizeof trs, training_s(&L->clk, now));
    train_fmt_time(ov, sizeof ov, L->clk.over_s);
    if (st->skipped) snprintf(sk, sizeof sk, " (%ld skipped: not finite)", st->skipped);
    char which[96] = "final"; /* a --stop-at-step pause validates part of the split, as a periodic one */
    if (L->last_eval_n < L->whole_split)
        snprintf(which, sizeof which, "last (%ld of the split's %ld %s)", L->last_eval_n, L->whole_split,
                 tr->eval.eval_unit);
    printf("done: %ld steps%s, %.0f %s, %s %s %.4f, checkpoint in %s (this session: %s wall = %s training + %s "
           "validation and checkpoints)\n", st->step, sk, st->examples_seen, tr->train.seen_key, which,
           tr->m.fam->metric_name, L->last_metric, tr->o->out_dir, wall, trs, ov);
}

/* One step: schedule, gradient, update, then the end-of-step decisions, validation, metrics,
 * progress and checkpoint. *end: the session ends after it (*status: 0 or 130). */
static int run_step(trainer *tr, run_loop *L, train_signals *sigs, moh_batch *b, bool *end, int *status,
                    moh_error *err) {
    train_state *st = &tr->st;
    const train_hparams *hp = &st->hp;
    step_out S = {.step = st->step, .t_top = train_now_s()};
    if (S.step - L->start_step == 3) { /* the first 3 steps are slower: the step time leaves them out */
        L->clk.base_s = training_s(&L->clk, S.t_top);
        L->clk.base_step = S.step;
    }
    run_fit(tr, L, S.step, S.t_top);
    S.lr = lr_schedule(S.step, L->warmup, L->fitted ? L->total : 1L << 40, hp->lr, hp->lr * hp->min_lr_ratio);
    S.lr_muon = hp->muon_lr > 0 ? S.lr * hp->muon_lr / hp->lr : S.lr; /* the same schedule */
    int rc = run_gradient(tr, L, &S, b, err);
    if (!rc) rc = run_update(tr, L, &S, err);
    if (rc) return rc;
    st->step++;
    st->examples_seen += (double)L->per_step;
    model_shards_routed_share(&tr->m, &tr->w, b, &S.smin, &S.smax);
    if (tr->m.fam->train_json)
        tr->m.fam->train_json(tr->m.cfg, tr->w.acts, tr->w.count, tr->w.n, b, S.fam_json, sizeof S.fam_json);
    S.t = train_now_s();
    S.train_s = training_s(&L->clk, S.t);
    st->elapsed_s = L->elapsed0 + (S.t - L->clk.t0);
    run_decide(tr, L, &S, sigs);
    if (S.do_eval && (rc = run_validate(tr, L, &S, err))) return rc;
    run_metrics(tr, L, &S);
    if (!tr->o->quiet && (st->step % hp->log_every == 0 || S.do_eval || st->step == L->start_step + 1))
        run_progress(tr, L, &S);
    model_eval_free(&S.ev);
    if ((rc = run_save(tr, L, &S, err))) return rc;
    dist_watchdog_pet(tr->d);
    *end = S.intr || (S.pause && st->step < L->total) || S.time_up;
    if (*end) *status = run_end_of_session(tr, L, &S);
    return MOH_OK;
}

static int run(const train_options *o, dist_ctx *d, train_signals *sigs, moh_error *err) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.o = o;
    tr.d = d;
    run_loop L;
    memset(&L, 0, sizeof L);
    const int R = d->size;
    int rc = setup(&tr, err);
    if (!rc && R > 1 && o->dump_grads) rc = moh_fail(err, MOH_E_ARG, "--dump-grads runs in one process, not under mpirun");
    if ((rc = agree(d, rc, err))) goto out;
    if (R > 1) {
        rc = dist_check_same(d, run_hash(&tr), "binary, config, data size or flags", err);
        if (rc) {
            if (d->rank != 0) err->msg[0] = '\0'; /* every rank found it: rank 0 says it */
            rc = fail_together(d, rc, err);
            goto out;
        }
        /* one start everywhere: rank 0's weights and moments */
        dist_bcast(d, tr.m.data, sizeof(float) * tr.m.n);
        dist_bcast(d, tr.m1, sizeof(float) * tr.m.n);
        dist_bcast(d, tr.m2, sizeof(float) * tr.m.n);
        if (tr.ema) dist_bcast(d, tr.ema, sizeof(float) * tr.m.n);
    }
    L.spe = tr.train.steps_per_epoch;
    bool nothing = false;
    if ((rc = run_length(&tr, &L, &nothing, err)) || nothing) goto out;
    if ((rc = run_open(&tr, &L, err))) goto out;
    L.split = (eval_split){d->rank, R, eval_sum, d};
    L.watch = (moh_progress){pet, d};
    if (!o->quiet) run_print_start(&tr, &L);
    moh_batch b = {0};
    int status = 0;
    bool end = false;
    while (!end && tr.st.step < L.total)
        if ((rc = run_step(&tr, &L, sigs, &b, &end, &status, err))) goto out;
    if (!o->quiet && status == 0) run_print_done(&tr, &L);
    rc = status;
out:
    free(L.init);
    teardown(&tr);
    return rc;
}

int train_run(const train_options *o, moh_error *err) {
    /* signals first: MPI's threads, started by dist_init, inherit the blocked mask */
    train_signals sigs;
    int rc = train_signals_start(&sigs, err);
    if (rc) return rc;
    dist_ctx d;
    if (!(rc = dist_init(&d, err))) {
        train_options local = *o;
        if (d.rank != 0) local.quiet = true; /* rank 0 alone prints progress */
        rc = run(&local, &d, &sigs, err);
        dist_finish(&d);
    }
    train_signals_end(&sigs);
    return rc;
}

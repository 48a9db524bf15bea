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
#include "train/adamw.h"
#include "train/optim.h"
#include "train/dist.h"
#include "train/manifest.h"
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
        snprintf(out, cap, "%s", *(const int *)p == 1 ? "bf16" : "fp32");
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

static int setup(trainer *tr, moh_error *err) {
    const train_options *o = tr->o;
    char path[4200], label[4300];
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
    if (!rc && o->resume) rc = checkpoint_load_tokenizer(&tr->m, o->out_dir, err); /* a BPE model's vocabulary */
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
    char why[192];
    if ((rc = model_shards_set_precision(&tr->w, m, (moh_precision)hp->precision, why, sizeof why, err))) return rc;
    if (*why && !o->quiet) printf("moh train: --precision bf16 runs fp32: %s\n", why);
    if (*why) tr->st.hp.precision = MOH_PRECISION_FP32; /* saved as it runs */
    /* Muon's Newton-Schulz products in bf16 where the step runs bf16 */
    const bool bf16 = hp->precision == MOH_PRECISION_BF16 && !*why;
    if ((rc = optim_init(&tr->opt, m, hp->optimizer, bf16, err))) return rc;
    if ((rc = model_params_new(fam, m->cfg, &tr->g, &tr->gdata, &tr->gn, err))) return rc;
    if (!o->resume) {
        if (!o->init_path) fam->init_random(m->cfg, m->params, hp->seed); /* else the pretrained weights */
        if (tr->ema) memcpy(tr->ema, m->data, sizeof(float) * m->n);
        tr->st.data_rng = tr->train.rng_start;
        tr->st.steps_per_epoch = tr->train.steps_per_epoch;
    }
    return MOH_OK;
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
static void eval_sum(void *ctx, double *x, size_t n) { dist_sum_f64(ctx, x, n); }
static void pet(void *ctx, long done, long total) { dist_watchdog_pet(ctx); }

static int run(const train_options *o, dist_ctx *d, train_signals *sigs, moh_error *err) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.o = o;
    tr.d = d;
    float *init = NULL;
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
    model *m = &tr.m;
    const model_family *fam = m->fam;
    train_state *st = &tr.st;
    train_hparams *hp = &st->hp;
    const long spe = tr.train.steps_per_epoch;
    /* The schedule length: --steps; or (resume) the interrupted run's; or --epochs (or the family's
     * default epochs when no --max-minutes is given) over data with epochs; or fitted to
     * --max-minutes. A resume of a time-fitted run keeps the saved length (the lr curve goes on
     * from where it stopped) and --max-minutes only caps that session. Checked before --out is
     * touched. */
    long total = o->steps;
    if (total == 0 && !isnan(o->flags.epochs) && spe > 0) total = llround(hp->epochs * (double)spe); /* --epochs */
    if (o->resume && st->total_steps > 0 && total == 0) total = st->total_steps;
    if (o->resume && o->stop_at_step > 0 && o->stop_at_step <= st->step) {
        rc = moh_fail(err, MOH_E_ARG, "--stop-at-step %ld is not after the checkpoint's step %ld in %s (expected a later "
                      "step)", o->stop_at_step, st->step, o->out_dir);
        goto out;
    }
    if (o->resume && total > 0 && st->total_steps > 0 && total != st->total_steps && !o->quiet && st->step < total)
        printf("note: %s gives %ld steps in place of the checkpoint's total_steps %ld (the cosine is recomputed over "
               "the new length from step %ld on)\n", o->steps > 0 ? "--steps" : "--epochs", total, st->total_steps,
               st->step + 1);
    if (total == 0 && hp->epochs > 0 && (!isnan(o->flags.epochs) || o->max_minutes <= 0)) {
        if (spe <= 0) {
            if (!isnan(o->flags.epochs)) {
                rc = moh_fail(err, MOH_E_ARG, "--epochs needs data read in epochs (images); %s draws random windows: "
                              "give --steps or --max-minutes", tr.data);
                goto out;
            }
        } else {
            total = llround(hp->epochs * (double)spe);
            if (total < 1) {
                rc = moh_fail(err, MOH_E_ARG, "--epochs %g gives %ld steps, expected at least 1", hp->epochs, total);
                goto out;
            }
        }
    }
    const bool auto_total = total <= 0;
    if (auto_total && o->max_minutes <= 0) {
        rc = moh_fail(err, MOH_E_ARG, "give --steps or --max-minutes");
        goto out;
    }
    if (o->resume && !auto_total && st->step > total) {
        rc = moh_fail(err, MOH_E_ARG, "--steps is %ld, but the checkpoint in %s is already at step %ld (expected "
                      "--steps above it to train on)", total, o->out_dir, st->step);
        goto out;
    }
    if (o->resume && !auto_total && st->step == total) { /* nothing to train: touch nothing else */
        if (d->rank == 0) fs_remove_stale_tmp(o->out_dir); /* (train_metrics_open does it for a run that trains) */
        if (!o->quiet)
            printf("moh train: the checkpoint in %s is already at step %ld of its %ld-step run: nothing to train "
                   "(give a larger --steps to continue)\n", o->out_dir, st->step, total);
        goto out;
    }
    if (d->rank == 0) { /* rank 0 alone writes the checkpoint folder */
        if (!o->resume) rc = train_check_fresh_out(o->out_dir, err);
        if (!rc) rc = fs_mkdir_p(o->out_dir, err);
        if (!rc) rc = train_metrics_open(o->out_dir, o->resume, st->step, &tr.metrics, err);
    }
    if ((rc = agree(d, rc, err))) goto out;
    if (R > 1 && (rc = dist_watchdog_start(d, o->comm_timeout, err))) goto out;
    if (o->dump_grads) {
        if (!(init = malloc(sizeof(float) * m->n))) {
            rc = moh_fail(err, MOH_E_NOMEM, "out of memory");
            goto out;
        }
        memcpy(init, m->data, sizeof(float) * m->n);
    }

    const long per_step = tr.train.examples_per_step * hp->grad_accum;
    const long warmup_cap = tr.train.warmup_cap > 0 ? tr.train.warmup_cap : 100;
    long warmup = hp->warmup >= 0 ? hp->warmup : warmup_cap;
    if (!auto_total && hp->warmup < 0 && warmup > total / 10) warmup = total / 10;
    if (o->resume && st->total_steps > 0 && o->flags.warmup == LONG_MIN) warmup = st->warmup;
    if (auto_total) total = 1L << 40; /* provisional, fitted after the first timed steps */
    st->total_steps = auto_total ? 0 : total;
    st->warmup = warmup;
    bool fitted = !auto_total;
    if (!auto_total && warmup >= total && st->step < total && !o->quiet)
        printf("note: the warmup of %ld steps is not below the run's %ld steps: the lr never decays (give a smaller "
               "--warmup)\n", warmup, total);
    const long eval_every = hp->eval_every > 0 ? hp->eval_every : spe;



    const double elapsed0 = st->elapsed_s, max_s = o->max_minutes * 60.0, c0 = train_cpu_s();
    run_clock clk = {.t0 = train_now_s(), .start_step = st->step, .base_step = st->step};
    const double t0 = clk.t0;
    const long start_step = st->step;
    double last_log_train_s = 0.0, last_metric = NAN;
    long last_eval_n = 0; /* items the last validation covered (the whole split: "final") */
    long last_log_step = start_step;
    int status = 0, bad_run = 0;
    if (!o->quiet) {
        const moh_attn_config *a = model_attn(m);
        printf("moh train: %s a %s (model_type \"%s\"), %zu parameters (%.2fM), router %s, %.3g/%d heads active per "
               "token, %s attention\n", o->resume ? "resuming" : "starting", fam->summary, fam->model_type, m->n,
               m->n / 1e6, router_label(a), model_active_heads(m), a->n_heads,
               hp->attention == 1 ? "head-sparse" : "reference");
        {
            char prec[256];
            precision_describe(tr.w.precision, prec, sizeof prec);
            printf("compute: %s%s; device %s%s%s%s\n", prec,
                   tr.w.precision != MOH_PRECISION_BF16 || hp->attention == 1
                       ? "" : "; reference attention: qkv and W_O in bf16, per-head scores and P V fp32",
                   tr.be->name, tr.device_note[0] ? " (" : "", tr.device_note, tr.device_note[0] ? ")" : "");
        }
        if (o->init_path && !o->resume) printf("weights from %s (pretrained; fresh optimizer, step 0)\n", o->init_path);
        char tshape[32] = "";
        if (tr.train.seq_len > 0) snprintf(tshape, sizeof tshape, " T=%d", tr.train.seq_len);
        char evs[96] = ""; /* periodic validations on part of the split, the final one on all of it */
        if (hp->eval_limit > 0 && (size_t)hp->eval_limit < tr.eval.n_eval)
            snprintf(evs, sizeof evs, " (periodic validations: %ld %s; the final one: the whole split)", hp->eval_limit,
                     tr.eval.eval_unit ? tr.eval.eval_unit : "items");
        printf("data %s: %zu train / %zu eval %s%s; B=%d%s x accum %d in %d shard%s, %s steps",
               tr.data, tr.train.n_train, tr.eval.n_eval, tr.train.what, evs, hp->batch_size, tshape,
               hp->grad_accum, hp->shards, hp->shards == 1 ? "" : "s", auto_total ? "time-fitted" : "fixed");
        if (!auto_total) printf(" (%ld", total);
        if (!auto_total && spe > 0) printf(", %.2f epochs of %ld", (double)total / spe, spe);
        if (!auto_total) printf(")");
        if (auto_total && hp->warmup < 0 && !(o->resume && st->step > 0)) /* set by the fit, below */
            printf(", warmup min(%ld, steps / 10), lr %g, seed %llu", warmup_cap, hp->lr, (unsigned long long)hp->seed);
        else printf(", warmup %ld, lr %g, seed %llu", warmup, hp->lr, (unsigned long long)hp->seed);
        if (hp->optimizer == 1)
            printf(", Muon at lr %g on the hidden matrices", hp->muon_lr > 0 ? hp->muon_lr : hp->lr);
        if (R > 1) printf("; %d ranks (MPI) of %d shard%s each", R, hp->shards / R, hp->shards / R == 1 ? "" : "s");
        printf("\n");
        fflush(stdout);
    }
    const long whole_split = tr.eval.eval_items(tr.eval.self, 0);
    const eval_split split = {d->rank, R, eval_sum, d}; /* validation split across the ranks */
    const train_progress watch = {pet, d};
    const adamw_config ac = {hp->beta1, hp->beta2, 1e-8, hp->weight_decay};
    const muon_config mc = {.momentum = 0.95, .weight_decay = hp->weight_decay, .ns_steps = 5};
    moh_batch b = {0};
    while (st->step < total) {
        const long step = st->step;
        const double t_top = train_now_s();
        if (step - start_step == 3) { /* the first 3 steps are slower: the step time leaves them out */
            clk.base_s = training_s(&clk, t_top);
            clk.base_step = step;
        }
        if (auto_total && step - start_step >= 6) {
            /* --max-minutes without a length: before every step, total = this step + the steps that
             * still fit in the budget at the measured step time, with the periodic validations and
             * checkpoints still due and the final whole-split validation costed in (never below
             * step + 1). lr(step) is the cosine over the current total; a refit by d steps moves it
             * by at most ~1.6 d / (total - warmup) of the lr range, and follows only the drift of
             * the measured times, so the curve stays close to one cosine and reaches its minimum
             * at the last step, as the budget ends. The first fit comes after 6 steps (3 timed
             * after the 3 slow first ones); the warmup (unless given) is min(cap, total / 10) of
             * that fit, then kept. Until then the lr ramps as with a warmup of cap. */
            const train_cost_model cm = cost_model(&tr, &clk, step, t_top);
            const long nfit = train_fit_steps(&cm, step, max_s - (t_top - t0));
            st->total_steps = total = step + (nfit > 1 ? nfit : 1);
            if (!fitted) {
                fitted = true;
                if (hp->warmup < 0) st->warmup = warmup = total / 10 < warmup_cap ? total / 10 : warmup_cap;
                if (!o->quiet) {
                    printf("schedule fitted to %g min: %ld steps (%.3f s/step; refitted as training goes), "
                           "warmup %ld", o->max_minutes, total, cm.step_s, warmup);
                    if (hp->warmup < 0 && warmup < warmup_cap) /* what the lr of the steps so far was */
                        printf(" (until this fit the lr ramped as for a warmup of %ld)", warmup_cap);
                    printf("\n");
                }
            }
        }
        if (auto_total && R > 1) { /* rank 0's fit holds everywhere */
            long fit[3] = {total, warmup, fitted};
            dist_bcast(d, fit, sizeof fit);
            st->total_steps = total = fit[0];
            st->warmup = warmup = fit[1];
            fitted = fit[2] != 0;
        }
        const double lr = lr_schedule(step, warmup, fitted ? total : 1L << 40, hp->lr, hp->lr * hp->min_lr_ratio);
        const double lr_muon = hp->muon_lr > 0 ? lr * hp->muon_lr / hp->lr : lr; /* the same schedule */
        memset(tr.gdata, 0, sizeof(float) * tr.gn);
        double loss = 0.0, ce = 0.0, lb = 0.0;
        for (int micro = 0; micro < hp->grad_accum; micro++) {
            if ((rc = tr.train.next(tr.train.self, step, micro, d->rank, R, &st->data_rng, &b, err))) goto stop;
            double c = 0.0, l = 0.0;
            loss += model_shards_step(m, &tr.w, &b, true, tr.g, tr.gdata, &c, &l);
            ce += c;
            lb += l;
        }
        double comm_s = 0.0;
        if (R > 1) { /* the ranks' equal parts: mean of their gradients and losses */
            const double c0s = d->comm_s;
            const float inv = 1.0f / (float)R;
            for (size_t i = 0; i < tr.gn; i++) tr.gdata[i] *= inv;
            if (o->nan_count > 0 && d->rank == R - 1 && step + 1 >= o->nan_step && step + 1 < o->nan_step + o->nan_count)
                tr.gdata[tr.gn / 2] = NAN; /* test hook (--debug-nan-grad): on the last rank only */
            dist_sum_f32(d, tr.gdata, tr.gn, (size_t)1 << 20);
            double sums[3] = {loss / R, ce / R, lb / R};
            dist_sum_f64(d, sums, 3);
            loss = sums[0], ce = sums[1], lb = sums[2];
            comm_s = d->comm_s - c0s;
        }
        if (hp->grad_accum > 1) {
            for (size_t i = 0; i < tr.gn; i++) tr.gdata[i] /= (float)hp->grad_accum;
            loss /= hp->grad_accum;
            ce /= hp->grad_accum;
            lb /= hp->grad_accum;
        }
        if (R == 1 && o->nan_count > 0 && step + 1 >= o->nan_step && step + 1 < o->nan_step + o->nan_count)
            tr.gdata[tr.gn / 2] = NAN; /* test hook (--debug-nan-grad) */
        if (init) {
            rc = dump_grads(&tr, &b, init, err);
            free(init);
            init = NULL;
            if (rc) goto stop;
        }
        const double gnorm = clip_grad_norm(tr.gdata, tr.gn, hp->grad_clip);
        /* non-finite guard: such a step is never applied (the weights and moments stay as they
         * were), only counted; the run stops after max_bad_steps of them in a row */
        const bool bad = !isfinite(loss) || !isfinite(gnorm);
        if (bad) {
            bad_run++;
            st->skipped++;
            if (d->rank == 0)
                fprintf(stderr, "moh train: warning: step %ld: loss %g, gradient norm %g: not finite, step skipped (%d in "
                        "a row, %ld in the run)\n", step + 1, loss, gnorm, bad_run, st->skipped);
            if (bad_run >= o->max_bad_steps) {
                char muon_hint[64] = "";
                if (hp->optimizer == 1)
                    snprintf(muon_hint, sizeof muon_hint, " or --muon-lr (now %g)", hp->muon_lr > 0 ? hp->muon_lr : hp->lr);
                rc = moh_fail(err, MOH_E_ARG, "steps %ld-%ld: loss or gradient not finite %d times in a row; stopped "
                              "(the last checkpoint in %s is intact); lower --lr (now %g)%s", step + 2 - bad_run,
                              step + 1, bad_run, o->out_dir, hp->lr, muon_hint);
                if (d->rank != 0) err->msg[0] = '\0'; /* the same on every rank: rank 0 says it */
                goto stop;
            }
        } else {
            bad_run = 0;
            optim_step(&tr.opt, &ac, &mc, m->data, tr.gdata, tr.m1, tr.m2, step + 1, lr, lr_muon);
            if (tr.ema) { /* decay warmed up over the first updates: min(d, (1 + n) / (10 + n)) */
                const double n = (double)(step + 1), dn = (1.0 + n) / (10.0 + n);
                const float dd = (float)(hp->ema_decay < dn ? hp->ema_decay : dn), one = 1.0f - dd;
                float *e = tr.ema;
                const float *w = m->data;
#pragma omp parallel for schedule(static) if (m->n >= 65536)
                for (size_t i = 0; i < m->n; i++) e[i] = dd * e[i] + one * w[i];
            }
        }
        st->step++;
        st->examples_seen += (double)per_step;
        double smin, smax;
        model_shards_routed_share(m, &tr.w, &b, &smin, &smax);
        char fam_json[96] = "";
        if (fam->train_json) fam->train_json(m->cfg, tr.w.acts, tr.w.count, tr.w.n, &b, fam_json, sizeof fam_json);
        const double t = train_now_s(), run_s = t - t0, step_s = t - t_top, train_s = training_s(&clk, t);
        st->elapsed_s = elapsed0 + run_s;
        const bool pause = o->stop_at_step > 0 && st->step >= o->stop_at_step;
        /* out of time when one more step and the final validation no longer fit; during the first
         * 3 steps (too slow to predict from) only when the budget is spent */
        const train_cost_model cm = cost_model(&tr, &clk, st->step, t);
        bool time_up = max_s > 0 && (run_s >= max_s || (st->step - start_step >= 3 &&
                                                        train_fit_steps(&cm, st->step, max_s - run_s) == 0));
        /* read once: a Ctrl-C after this point is handled at the next step, never without a save */
        bool intr = train_interrupted(sigs);
        if (R > 1) { /* rank 0's clock decides; a Ctrl-C on any rank stops every rank */
            int flags[1] = {time_up};
            dist_bcast(d, flags, sizeof flags);
            time_up = flags[0] != 0;
            intr = dist_max_int(d, intr) != 0;
        }
        bool last = st->step >= total || time_up || intr || pause;
        /* the end of the run validates the whole split; Ctrl-C saves at once (no validation);
         * --stop-at-step validates as a periodic validation does */
        const bool do_eval = (last && !intr) || (eval_every > 0 && st->step % eval_every == 0);
        const bool whole = last && !intr && !pause;
        model_eval ev = {0};
        double val_s = 0.0;
        if (do_eval) {
            if ((rc = model_evaluate_split(m, &tr.w, &tr.eval, whole ? 0 : hp->eval_limit, &watch, &split, &ev, err)))
                goto stop;
            val_s = train_now_s() - t;
            clk.over_s += val_s;
            if (!last) {
                clk.val_s += val_s;
                clk.val_items += ev.n;
            }
            /* a periodic validation that used up the budget (one more step and the final one no
             * longer fit) ends the run here: it is the final one when it covered the whole split;
             * otherwise the whole split is validated only if time is left */
            const double t2 = train_now_s();
            int spent[2] = {!last && max_s > 0 && (t2 - t0 >= max_s || train_fit_steps(&cm, st->step, max_s - (t2 - t0)) == 0),
                            t2 - t0 < max_s};
            dist_bcast(d, spent, sizeof spent); /* rank 0's clock decides */
            if (spent[0]) {
                time_up = last = true;
                if (ev.n < whole_split && spent[1]) {
                    model_eval_free(&ev);
                    if ((rc = model_evaluate_split(m, &tr.w, &tr.eval, 0, &watch, &split, &ev, err))) goto stop;
                    val_s = train_now_s() - t;
                    clk.over_s += train_now_s() - t2;
                } else if (ev.n < whole_split && !o->quiet) {
                    printf("note: the time budget ran out in the validation at step %ld: it covered %ld of the "
                           "split's %ld %s (moh eval gives the whole split)\n", st->step, ev.n, whole_split,
                           tr.eval.eval_unit);
                }
            }
            last_metric = ev.metric;
            last_eval_n = ev.n;
        }
        char loss_s[32], ce_s[32], gn_s[32]; /* JSON has no nan / inf: null */
        FILE *mf = tr.metrics; /* rank 0 only */
        if (mf) {
            json_num(loss_s, sizeof loss_s, "%.6f", loss);
            json_num(ce_s, sizeof ce_s, "%.6f", ce);
            json_num(gn_s, sizeof gn_s, "%.4f", gnorm);
            fprintf(mf, "{\"step\": %ld", st->step);
            if (spe > 0) fprintf(mf, ", \"epoch\": %.4f", (double)st->step / spe);
            char lb_s[32];
            json_num(lb_s, sizeof lb_s, "%.6f", lb);
            fprintf(mf,
                    ", \"loss\": %s, \"ce\": %s, \"lb_loss\": %s, \"lr\": %.6g, \"grad_norm\": %s%s, \"%s\": %.0f, "
                    "\"elapsed_s\": %.2f, \"cpu_s\": %.2f, \"step_s\": %.4f, \"train_%s_s\": %.1f, \"routed_share_min\": "
                    "%.4f, \"routed_share_max\": %.4f",
                    loss_s, ce_s, lb_s, lr, gn_s, fam_json, tr.train.seen_key, st->examples_seen, st->elapsed_s,
                    train_cpu_s() - c0, step_s, tr.train.unit, (double)(st->step - start_step) * per_step / train_s, smin,
                    smax);
            if (hp->optimizer == OPTIM_MUON) fprintf(mf, ", \"muon_lr\": %.6g", lr_muon);
            if (st->skipped > 0) fprintf(mf, ", \"skipped\": %ld", st->skipped);
            if (bad) fprintf(mf, ", \"step_skipped\": true");
            if (fitted) fprintf(mf, ", \"total_steps\": %ld", total);
            if (R > 1) fprintf(mf, ", \"ranks\": %d, \"comm_s\": %.4f", R, comm_s);
            if (do_eval) {
                char js[256];
                fam->eval_json(&ev, js, sizeof js);
                fprintf(mf, "%s, \"val_s\": %.3f", js, val_s);
            }
            fprintf(mf, "}\n");
            fflush(mf);
        }
        if (!o->quiet && (st->step % hp->log_every == 0 || do_eval || st->step == start_step + 1)) {
            /* training examples per second since the last progress line, validation and
             * checkpoints excluded */
            const double rate = (double)(st->step - last_log_step) * per_step / (train_s - last_log_train_s);
            double eta = fitted ? train_cost_of(&cm, st->step, total - st->step) : max_s - run_s;
            if (max_s > 0 && eta > max_s - run_s) eta = max_s - run_s;
            char el[32], et[32], share[64] = "", val[96] = "", ep[32] = "", tot[24] = "?";
            train_fmt_time(el, sizeof el, st->elapsed_s);
            train_fmt_time(et, sizeof et, eta);
            if (model_attn(m)->router != MOH_ROUTER_NONE)
                snprintf(share, sizeof share, " | head share %.2f-%.2f", smin, smax);
            if (do_eval) fam->eval_brief(&ev, val, sizeof val);
            if (spe > 0) snprintf(ep, sizeof ep, " | ep %5.2f", (double)st->step / spe);
            if (fitted) snprintf(tot, sizeof tot, "%ld", total); /* not known until the --max-minutes fit */
            printf("step %6ld/%-6s%s | loss %.4f | lb %.3f | lr %.2e | %6.0f %s/s | %s, ETA %s%s%s\n", st->step, tot,
                   ep, ce, lb, lr, rate, tr.train.unit, el, et, share, val);
            fflush(stdout);
            last_log_train_s = train_s;
            last_log_step = st->step;
        }
        model_eval_free(&ev);
        const bool do_save = last || do_eval || (hp->save_every > 0 && st->step % hp->save_every == 0);
        if (do_save) {
            const double ts = train_now_s();
            /* never a non-finite value in a checkpoint (the guard checks the loss and gradient; a
             * damaged moment could still turn a weight to nan) */
            moh_error why = {0};
            if (train_check_finite("weights", "parameters", m->data, m->n, &why))
                rc = moh_fail(err, MOH_E_ARG, "step %ld: a weight is not finite (%s); nothing saved, the last checkpoint "
                              "in %s is intact", st->step, why.msg, o->out_dir);
            if (!rc && d->rank == 0) rc = checkpoint_save_ema(o->out_dir, m, tr.m1, tr.m2, tr.ema, st, err);
            if ((rc = agree(d, rc, err))) goto stop;
            const double sv = train_now_s() - ts;
            clk.over_s += sv;
            clk.save_s += sv;
            clk.saves++;
            if (do_eval && !last) {
                clk.eval_s += val_s + sv;
                clk.evals++;
            }
        }
        dist_watchdog_pet(d);
        if (intr) {
            if (!o->quiet) printf("interrupted: checkpoint saved to %s at step %ld\n", o->out_dir, st->step);
            status = 130;
            break;
        }
        if (pause && st->step < total) {
            if (!o->quiet) printf("stopped at step %ld as asked; continue with --resume\n", st->step);
            break;
        }
        if (time_up) {
            if (st->step < total && !o->quiet) {
                if (fitted) printf("time budget of %g min reached at step %ld of %ld (checkpoint saved; --resume "
                                   "continues)\n", o->max_minutes, st->step, total);
                else printf("time budget of %g min reached at step %ld, before the schedule was fitted\n",
                            o->max_minutes, st->step);
            }
            break;
        }
    }
    if (!o->quiet && status == 0) {
        const double now = train_now_s();
        char wall[32], trs[32], ov[32], sk[48] = "";
        train_fmt_time(wall, sizeof wall, now - t0);
        train_fmt_time(trs, sizeof trs, training_s(&clk, now));
        train_fmt_time(ov, sizeof ov, clk.over_s);
        if (st->skipped) snprintf(sk, sizeof sk, " (%ld skipped: not finite)", st->skipped);
        char which[96] = "final"; /* a --stop-at-step pause validates part of the split, as a periodic one */
        if (last_eval_n < whole_split)
            snprintf(which, sizeof which, "last (%ld of the split's %ld %s)", last_eval_n, whole_split, tr.eval.eval_unit);
        printf("done: %ld steps%s, %.0f %s, %s %s %.4f, checkpoint in %s (this session: %s wall = %s training + %s "
               "validation and checkpoints)\n", st->step, sk, st->examples_seen, tr.train.seen_key, which,
               fam->metric_name, last_metric, o->out_dir, wall, trs, ov);
    }
    rc = status;
stop:
out:
    free(init);
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

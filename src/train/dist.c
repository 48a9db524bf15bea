/* Collectives over MPI_COMM_WORLD, or the one-process identity (dist.h). */
#include "train/dist.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/train_util.h"

#ifdef MOH_HAVE_MPI
#include <mpi.h>
#endif

uint64_t dist_hash(uint64_t h, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static int env_int(const char *name) {
    const char *s = getenv(name);
    return s ? atoi(s) : 0;
}

bool dist_launched(void) { return env_int("OMPI_COMM_WORLD_SIZE") > 1 || env_int("PMI_SIZE") > 1; }

int dist_init(dist_ctx *d, moh_error *err) {
    memset(d, 0, sizeof *d);
    d->size = 1;
    if (!dist_launched()) return MOH_OK;
#ifdef MOH_HAVE_MPI
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return moh_fail(err, MOH_E_IO, "MPI_Init failed");
    d->mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    return MOH_OK;
#else
    return moh_fail(err, MOH_E_ARG, "started by mpirun with %d ranks, but this moh was built without MPI (install "
                    "libopenmpi-dev and rebuild)", env_int("OMPI_COMM_WORLD_SIZE") + env_int("PMI_SIZE"));
#endif
}

/* ---- watchdog ----------------------------------------------------------------------------- */

struct dist_watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double seconds, last; /* timeout; time of the last pet (train_now_s) */
    bool stop;
    int rank;
};

static void *watch(void *arg) {
    dist_watchdog *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        if (!w->stop && train_now_s() - w->last > w->seconds) {
            fprintf(stderr, "moh train: rank %d: no step finished for %.0f s (--comm-timeout): a rank died or hangs; "
                    "ending the job (the last checkpoint is intact)\n", w->rank, w->seconds);
            fflush(stderr);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int dist_watchdog_start(dist_ctx *d, double seconds, moh_error *err) {
    if (seconds <= 0) return MOH_OK;
    dist_watchdog *w = calloc(1, sizeof *w);
    if (!w) return moh_fail(err, MOH_E_NOMEM, "watchdog: out of memory");
    w->seconds = seconds;
    w->last = train_now_s();
    w->rank = d->rank;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watch, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return moh_fail(err, MOH_E_NOMEM, "watchdog: cannot start a thread");
    }
    d->dog = w;
    return MOH_OK;
}

void dist_watchdog_pet(dist_ctx *d) {
    if (!d->dog) return;
    pthread_mutex_lock(&d->dog->mu);
    d->dog->last = train_now_s();
    pthread_mutex_unlock(&d->dog->mu);
}

void dist_finish(dist_ctx *d) {
    if (d->dog) {
        pthread_mutex_lock(&d->dog->mu);
        d->dog->stop = true;
        pthread_cond_signal(&d->dog->cv);
        pthread_mutex_unlock(&d->dog->mu);
        pthread_join(d->dog->thread, NULL);
        pthread_mutex_destroy(&d->dog->mu);
        pthread_cond_destroy(&d->dog->cv);
        free(d->dog);
        d->dog = NULL;
    }
#ifdef MOH_HAVE_MPI
    if (d->mpi) MPI_Finalize();
#endif
    d->mpi = false;
}

/* ---- collectives -------------------------------------------------------------------------- */

void dist_sum_f32(dist_ctx *d, float *x, size_t n, size_t bucket) {
    if (d->size <= 1 || n == 0) return;
#ifdef MOH_HAVE_MPI
    const double t0 = train_now_s();
    if (bucket == 0 || bucket > (size_t)1 << 30) bucket = (size_t)1 << 30;
    const size_t nb = (n + bucket - 1) / bucket;
    MPI_Request req[64];
    for (size_t b0 = 0; b0 < nb; b0 += 64) { /* up to 64 buckets in flight */
        const size_t k = nb - b0 < 64 ? nb - b0 : 64;
        for (size_t j = 0; j < k; j++) {
            const size_t off = (b0 + j) * bucket, len = n - off < bucket ? n - off : bucket;
            MPI_Iallreduce(MPI_IN_PLACE, x + off, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req[j]);
        }
        MPI_Waitall((int)k, req, MPI_STATUSES_IGNORE);
    }
    d->comm_s += train_now_s() - t0;
#else
    (void)x;
    (void)bucket;
#endif
}

void dist_sum_f64(dist_ctx *d, double *x, size_t n) {
    if (d->size <= 1 || n == 0) return;
#ifdef MOH_HAVE_MPI
    const double t0 = train_now_s();
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    d->comm_s += train_now_s() - t0;
#else
    (void)x;
#endif
}

int dist_max_int(dist_ctx *d, int v) {
    if (d->size <= 1) return v;
#ifdef MOH_HAVE_MPI
    int out = v;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out;
#else
    return v;
#endif
}

void dist_bcast(dist_ctx *d, void *buf, size_t bytes) {
    if (d->size <= 1 || bytes == 0) return;
#ifdef MOH_HAVE_MPI
    const double t0 = train_now_s();
    for (size_t off = 0; off < bytes; off += (size_t)1 << 30) {
        const size_t len = bytes - off < ((size_t)1 << 30) ? bytes - off : (size_t)1 << 30;
        MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
    d->comm_s += train_now_s() - t0;
#else
    (void)buf;
#endif
}

int dist_check_same(dist_ctx *d, uint64_t v, const char *what, moh_error *err) {
    if (d->size <= 1) return MOH_OK;
#ifdef MOH_HAVE_MPI
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)d->size);
    if (!all) return moh_fail(err, MOH_E_NOMEM, "out of memory");
    MPI_Allgather(&v, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    int bad = -1;
    for (int r = 1; r < d->size && bad < 0; r++)
        if (all[r] != all[0]) bad = r;
    free(all);
    if (bad >= 0)
        return moh_fail(err, MOH_E_CONFIG, "rank %d's %s differ from rank 0's (hash exchanged at start): run the same "
                        "moh binary, config, data and flags on every rank", bad, what);
    return MOH_OK;
#else
    (void)v;
    (void)what;
    (void)err;
    return MOH_OK;
#endif
}

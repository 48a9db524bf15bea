/* Data-parallel training across processes (OpenMPI): the few collectives the trainer needs, and a
 * watchdog. Built with MPI when CMake finds it (MOH_MPI, on by default); without it, or when the
 * process was not started by mpirun, every call is the one-process identity.
 * Source: issue "Data-parallel training across processes and machines on OpenMPI"; llm.c's
 * multi_gpu_config (MPI for process setup, one all-reduce of the gradients per step). */
#ifndef MOH_DIST_H
#define MOH_DIST_H
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

typedef struct dist_watchdog dist_watchdog;

typedef struct dist_ctx {
    int rank, size;        /* this process, of size (1 without MPI) */
    bool mpi;              /* MPI was initialised here (finalised by dist_finish) */
    double comm_s;         /* seconds spent in collectives since dist_init (gradient, losses, evals) */
    dist_watchdog *dog;    /* NULL when off */
} dist_ctx;

/* true when this process was started by mpirun / an MPI launcher with more than one rank
 * (OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1) and moh was built with MPI. */
bool dist_launched(void);
/* MPI_Init when dist_launched(), else the one-process context. MOH_E_ARG when launched by mpirun
 * but built without MPI. */
int dist_init(dist_ctx *d, moh_error *err);
/* Stops the watchdog, MPI_Finalize. */
void dist_finish(dist_ctx *d);
/* Sum over ranks, in place: x [n] float32 (the gradient, in buckets of `bucket` floats whose
 * all-reductions are in flight together) or [n] float64. */
void dist_sum_f32(dist_ctx *d, float *x, size_t n, size_t bucket);
void dist_sum_f64(dist_ctx *d, double *x, size_t n);
/* Maximum over ranks of an int (agreement on errors and stop decisions). */
int dist_max_int(dist_ctx *d, int v);
/* Rank 0's bytes to every rank. */
void dist_bcast(dist_ctx *d, void *buf, size_t bytes);
/* Every rank's 64-bit value; MOH_E_CONFIG naming the first rank whose value differs from rank 0's
 * (what: "binary, config and hyperparameters"). */
int dist_check_same(dist_ctx *d, uint64_t v, const char *what, moh_error *err);
/* A thread that ends the process (one line on stderr, exit 1; mpirun then ends the job) when
 * dist_watchdog_pet is not called for `seconds` (0 = no watchdog). */
int dist_watchdog_start(dist_ctx *d, double seconds, moh_error *err);
void dist_watchdog_pet(dist_ctx *d);
/* FNV-1a 64 of bytes, chained from h (start with DIST_HASH_START). */
#define DIST_HASH_START 0xcbf29ce484222325ULL
uint64_t dist_hash(uint64_t h, const void *bytes, size_t n);
#endif

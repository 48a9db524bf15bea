/* The backend tables the registry (backend.c) lists; only backend.c and the tables' own files
 * include this. */
#ifndef MOH_BACKENDS_H
#define MOH_BACKENDS_H
#include "backend/backend.h"

extern const moh_backend backend_cpu;  /* cpu.c */
extern const moh_backend backend_cuda; /* cuda.c */

#endif

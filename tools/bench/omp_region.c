/* Cost of OpenMP parallel regions under the environment's wait policy (tools/bench/micro.sh):
 * an if(0) region (libgomp still sets up a one-thread team), and a real region of the default team
 * entered ~100 us after the last one (as decoding does between its products). */
#include <omp.h>
#include <stdio.h>

int main(void) {
    enum { N0 = 100000, N1 = 200 };
    double t0 = omp_get_wtime();
    float x = 0;
    for (int i = 0; i < N0; i++) {
#pragma omp parallel for if (0) reduction(+ : x)
        for (int j = 0; j < 4; j++) x += (float)j;
    }
    const double if0 = (omp_get_wtime() - t0) / N0;
    double sum = 0, best = 1e9;
    int ran = 0;
    for (int i = 0; i < N1; i++) {
        const double t = omp_get_wtime();
#pragma omp parallel reduction(+ : ran)
        ran += 1;
        const double dt = omp_get_wtime() - t;
        sum += dt;
        best = dt < best ? dt : best;
        for (const double w = omp_get_wtime(); omp_get_wtime() - w < 100e-6;) { /* ~100 us of serial work */
        }
    }
    printf("if(0) region: %.3f us; team of %d after 100 us: mean %.1f us, best %.1f us (check %g)\n", if0 * 1e6,
           ran / N1, sum / N1 * 1e6, best * 1e6, (double)x);
    return 0;
}

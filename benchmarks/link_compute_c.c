/* Whether traffic on a link slows the compute beside it, without ddpbench: each step
 * idles PAUSE_MS, computes a fixed loop (40 passes over 8 MB of floats, no MPI), then
 * all-reduces NBUCKETS × BYTES; each rank prints its mean compute and all-reduce ms
 * over the steps after the first two. NBUCKETS 0: compute alone.
 *
 *   mpicc -O2 -o /tmp/work benchmarks/link_compute_c.c
 *   benchmarks/netns_link.sh run /tmp/work BYTES NBUCKETS STEPS PAUSE_MS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long bytes = argc == 5 ? atol(argv[1]) : 0;
    int nb = argc == 5 ? atoi(argv[2]) : 0, steps = argc == 5 ? atoi(argv[3]) : 0;
    double pause_ms = argc == 5 ? atof(argv[4]) : -1;
    /* The first 2 steps are warm-up: at least one more is timed. */
    if (bytes < 4 || bytes > (1L << 30) || nb < 0 || steps < 3 || pause_ms < 0) {
        if (rank == 0)
            fprintf(stderr, "usage: %s BYTES NBUCKETS STEPS PAUSE_MS (4 <= BYTES <= 1 GiB, NBUCKETS >= 0, STEPS >= 3, "
                            "PAUSE_MS >= 0)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long n = bytes / 4, m = 2L << 20;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *w = malloc(m * sizeof *w);
    for (long i = 0; i < n; i++) a[i] = 1;
    for (long i = 0; i < m; i++) w[i] = (float)i;
    double compute = 0, comm = 0, keep = 0;
    for (int s = 0; s < steps; s++) {
        double p0 = MPI_Wtime();
        while ((MPI_Wtime() - p0) * 1e3 < pause_ms) usleep(100);
        double t = MPI_Wtime();
        for (int r = 0; r < 40; r++)
            for (long i = 0; i < m; i++) w[i] = w[i] * 0.999f + 0.5f;
        double c = MPI_Wtime() - t;
        t = MPI_Wtime();
        for (int k = 0; k < nb; k++) MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (s >= 2) {
            compute += c;
            comm += MPI_Wtime() - t;
        }
        keep += w[5];
    }
    printf("rank %d: compute %.2f ms, all-reduce %.2f ms (checksum %g)\n", rank, compute / (steps - 2) * 1e3,
           comm / (steps - 2) * 1e3, keep);
    free(a);
    free(b);
    free(w);
    MPI_Finalize();
    return 0;
}

/* Whether a link is faster after idle than kept busy, without ddpbench: each step is
 * a barrier, GAP_MS of sleep, then NBUCKETS all-reduces of BYTES back to back (as
 * training sends its buckets after compute); rank 0 prints each all-reduce's ms.
 *
 *   mpicc -O2 -o /tmp/idle benchmarks/link_idle_c.c
 *   benchmarks/netns_link.sh run /tmp/idle BYTES NBUCKETS GAP_MS STEPS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long bytes = argc == 5 ? atol(argv[1]) : 0;
    int nb = argc == 5 ? atoi(argv[2]) : 0, steps = argc == 5 ? atoi(argv[4]) : 0;
    double gap_ms = argc == 5 ? atof(argv[3]) : -1;
    if (bytes < 4 || bytes > (1L << 30) || nb < 1 || steps < 1 || gap_ms < 0) {
        if (rank == 0)
            fprintf(stderr, "usage: %s BYTES NBUCKETS GAP_MS STEPS (4 <= BYTES <= 1 GiB, NBUCKETS and STEPS >= 1, "
                            "GAP_MS >= 0)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long n = bytes / 4;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (long i = 0; i < n; i++) a[i] = 1;
    for (int s = 0; s < steps; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (gap_ms > 0) {
            struct timespec ts = {(time_t)(gap_ms / 1e3), (long)(gap_ms * 1e6) % 1000000000L};
            nanosleep(&ts, 0);
        }
        double t0 = MPI_Wtime();
        char line[1024] = "";
        int off = 0;
        for (int k = 0; k < nb && off < (int)sizeof line - 16; k++) {
            double t = MPI_Wtime();
            MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            off += snprintf(line + off, sizeof line - off, " %.1f", (MPI_Wtime() - t) * 1e3);
        }
        if (rank == 0) printf("step %d: %.1f ms:%s\n", s, (MPI_Wtime() - t0) * 1e3, line);
    }
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}

/* The plain C peer of `ddpbench allreduce` on host memory: MPI_Allreduce(MPI_SUM) of
 * floats, timed as the OSU micro-benchmarks time it (barrier, warm-up, a timed loop, the
 * mean per iteration, averaged over ranks). Sizes from argv: min max factor iters warmup.
 * Prints "bytes time_us" per size on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long min = argc > 1 ? atol(argv[1]) : 8, max = argc > 2 ? atol(argv[2]) : 1L << 26;
    long factor = argc > 3 ? atol(argv[3]) : 2;
    int iters = argc > 4 ? atoi(argv[4]) : 20, warmup = argc > 5 ? atoi(argv[5]) : 5;
    float *send = malloc(max), *recv = malloc(max);
    for (long i = 0; i < max / 4; i++) send[i] = (float)((rank + i) % 4);
    for (long bytes = min; bytes <= max; bytes *= factor) {
        int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
        for (int i = 0; i < warmup; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / iters, sum = 0;
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.3f\n", (long)count * 4, sum / size * 1e6);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}

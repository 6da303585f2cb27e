/* Open MPI's all-reduce, all-gather and broadcast timed the way rustccl-bench times its
 * collectives, printing the same table (size, count, type, redop, root, then time / algbw /
 * busbw for out of place and in place), so that bench/mpi/compare.sh can put both side by side.
 *
 *   mpirun -np 2 ./mpi_bench -o all_reduce -b 8 -e 128M -f 4 -n 20 -w 2
 *
 * Float32, sum, root 0. Sizes are nccl-tests': the total bytes of the result (an all-gather's
 * whole output). Per size: `-w` warm-up calls, then as many timed calls as fit in 0.25 s (the
 * slowest rank's estimate), at most `-n`, at least 2; the time is the slowest rank's mean (as
 * rustccl-bench's default `-a 3`). MPI_Bcast has no out-of-place form: that column is N/A.
 * The results are checked once per size and placement (#wrong counts bad elements). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { ALL_REDUCE, ALL_GATHER, BROADCAST };

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static double now(void) { return MPI_Wtime(); }

/* One call of `op` on `count` floats per rank (the all-gather's per-rank count). */
static void call(enum op op, int in_place, float *send, float *recv, size_t count, int rank) {
    switch (op) {
    case ALL_REDUCE:
        if (in_place)
            MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        if (in_place)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        (void)send;
        (void)rank;
        MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
}

/* Fills the inputs of one placement: element i of rank r is r + i % 7 (exact in float). */
static void fill(enum op op, int in_place, float *send, float *recv, size_t count, int rank, int n) {
    float *in = in_place ? recv : send;
    size_t at = (op == ALL_GATHER && in_place) ? (size_t)rank * count : 0;
    for (size_t i = 0; i < count; i++) in[at + i] = (float)(rank + i % 7);
    (void)n;
}

static long check(enum op op, const float *recv, size_t count, int n) {
    long wrong = 0;
    if (op == ALL_REDUCE) {
        for (size_t i = 0; i < count; i++)
            if (recv[i] != (float)(n * (n - 1) / 2 + n * (int)(i % 7))) wrong++;
    } else if (op == ALL_GATHER) {
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                if (recv[(size_t)r * count + i] != (float)(r + i % 7)) wrong++;
    } else {
        for (size_t i = 0; i < count; i++)
            if (recv[i] != (float)(i % 7)) wrong++;
    }
    return wrong;
}

/* Times one placement; returns the slowest rank's mean seconds per call, sets *wrong. */
static double measure(enum op op, int in_place, float *send, float *recv, size_t count, int rank, int n,
                      int iters, int warmup, long *wrong) {
    if (op == BROADCAST && rank == 0) fill(op, 1, send, recv, count, rank, n);
    else if (op != BROADCAST) fill(op, in_place, send, recv, count, rank, n);
    else memset(recv, 0, count * sizeof(float));
    call(op, in_place, send, recv, count, rank);
    long mine = check(op, recv, count, n);
    MPI_Allreduce(&mine, wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    double tw = now();
    int probes = warmup > 0 ? warmup : 1;
    for (int i = 0; i < probes; i++) call(op, in_place, send, recv, count, rank);
    double est = (now() - tw) / probes, worst;
    MPI_Allreduce(&est, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int k = iters;
    if (worst > 0 && 0.25 / worst < iters) k = (int)(0.25 / worst) < 2 ? 2 : (int)(0.25 / worst);
    double t0 = now();
    for (int i = 0; i < k; i++) call(op, in_place, send, recv, count, rank);
    double secs = (now() - t0) / k, slowest;
    MPI_Allreduce(&secs, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t minb = 8, maxb = 128 << 20, factor = 2;
    int iters = 20, warmup = 1;
    enum op op = ALL_REDUCE;
    const char *opname = "all_reduce";
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "-b")) minb = parse_size(v);
        else if (!strcmp(f, "-e")) maxb = parse_size(v);
        else if (!strcmp(f, "-f")) factor = parse_size(v);
        else if (!strcmp(f, "-n")) iters = atoi(v);
        else if (!strcmp(f, "-w")) warmup = atoi(v);
        else if (!strcmp(f, "-o")) {
            opname = v;
            if (!strcmp(v, "all_reduce")) op = ALL_REDUCE;
            else if (!strcmp(v, "all_gather")) op = ALL_GATHER;
            else if (!strcmp(v, "broadcast")) op = BROADCAST;
            else {
                if (rank == 0) fprintf(stderr, "mpi_bench: -o all_reduce|all_gather|broadcast\n");
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        } else {
            if (rank == 0) fprintf(stderr, "mpi_bench: unknown option %s\n", f);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (factor < 2) factor = 2;
    float *send = malloc(maxb + 64), *recv = malloc(maxb + 64);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(send, 0, maxb + 64);
    memset(recv, 0, maxb + 64);
    if (rank == 0) {
        printf("# mpi_bench (Open MPI) op: %s nranks %d minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d\n",
               opname, n, minb, maxb, factor, warmup, iters);
        printf("#%63s%35s\n", "out-of-place", "in-place");
        printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
        printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
    }
    double bus = op == ALL_REDUCE ? 2.0 * (n - 1) / n : op == ALL_GATHER ? (double)(n - 1) / n : 1.0;
    for (size_t size = minb; size <= maxb; size *= factor) {
        size_t count = size / sizeof(float);
        size_t per_rank = op == ALL_GATHER ? count / n : count;
        if (per_rank == 0) continue;
        size_t bytes = op == ALL_GATHER ? per_rank * n * sizeof(float) : count * sizeof(float);
        long wrong_o = 0, wrong_i = 0;
        double to = op == BROADCAST ? 0 : measure(op, 0, send, recv, per_rank, rank, n, iters, warmup, &wrong_o);
        double ti = measure(op, 1, send, recv, per_rank, rank, n, iters, warmup, &wrong_i);
        if (rank == 0) {
            double ao = to > 0 ? bytes / 1e9 / to : 0, ai = bytes / 1e9 / ti;
            printf("%12zu  %12zu     float     sum      %2d", bytes, op == ALL_GATHER ? per_rank : count, op == BROADCAST ? 0 : -1);
            if (op == BROADCAST)
                printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
            else
                printf("  %7.2f  %6.2f  %6.2f  %5ld", to * 1e6, ao, ao * bus, wrong_o);
            printf("  %7.2f  %6.2f  %6.2f  %5ld\n", ti * 1e6, ai, ai * bus, wrong_i);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}

/* Checkpoint write and read bandwidth against the raw disk, in one
 * invocation on the same file system:
 *
 *   mpiexec -n 2 bench/ckpt_bench [--d-model 1280] [--layers 10] [--vocab 50304] [--seq 1024]
 *                                 [--reps 6] [--settle 3] [--dir DIR] [--weights-only]
 *
 * The state of an f32 GPT-2 of the given shape (weights, and unless
 * --weights-only the two AdamW moments; 1.10 GB of weights by default) is
 * held by every rank as data-parallel replicas and saved / loaded with
 * cai_ckpt_save_buffers / cai_ckpt_load_buffers exactly as cai_ckpt_save
 * does (checksums, fsync, rename). The reference is a raw sequential write of
 * the same bytes by one process (write + fsync) and a raw sequential read.
 * Before every read both files are dropped from the page cache
 * (posix_fadvise DONTNEED after fsync), so reads come from the disk.
 * Each repetition writes both files, then reads both, alternating which
 * goes first, after `settle` seconds of quiet (sync + sleep) before every
 * timed operation; it prints both bandwidths and the ratio checkpoint /
 * raw, and the summary gives the medians and the geometric mean of the
 * per-repetition ratios (with an even count each order weighs the same:
 * on a shared virtual disk the second writer of a pair pays for the
 * first's writeback, whichever it is). */
#include "cai_config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/ckpt.h"
#include "colossal/cluster.h"

static void die(cai_status st) {
    if (st == CAI_OK) return;
    cai_error_print(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static double now(void) { return MPI_Wtime(); }

/* Raw sequential write of every buffer to one file, then fsync. */
static double raw_write(const char *path, float *const *bufs, int n, size_t elems) {
    double t0 = now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "cannot create %s: %s\n", path, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int b = 0; b < n; b++) {
        const char *p = (const char *)bufs[b];
        size_t left = elems * sizeof(float);
        while (left) {
            ssize_t w = write(fd, p, left > ((size_t)1 << 30) ? (size_t)1 << 30 : left);
            if (w <= 0) {
                fprintf(stderr, "write %s: %s\n", path, strerror(errno));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        fprintf(stderr, "fsync %s: %s\n", path, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    close(fd);
    return now() - t0;
}

static double raw_read(const char *path, float *const *bufs, int n, size_t elems) {
    double t0 = now();
    int fd = open(path, O_RDONLY);
    if (fd < 0) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int b = 0; b < n; b++) {
        char *p = (char *)bufs[b];
        size_t left = elems * sizeof(float);
        while (left) {
            ssize_t r = read(fd, p, left > ((size_t)1 << 30) ? (size_t)1 << 30 : left);
            if (r <= 0) MPI_Abort(MPI_COMM_WORLD, 1);
            p += r;
            left -= (size_t)r;
        }
    }
    close(fd);
    return now() - t0;
}

/* Evict a file's pages (it was fsynced, so they are clean). */
static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Let the disk finish what the previous operation left in flight (the
 * host side of a virtual disk keeps flushing after fsync returns) before
 * the next timed one, so neither side pays for the other. */
static void settle_down(double seconds) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (seconds > 0) {
        sync();
        usleep((useconds_t)(seconds * 1e6));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static double geomean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += log(v[i]);
    return exp(s / n);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double max_all(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    cai_log_set_rank(rank, size);
    int d_model = 1280, layers = 10, vocab = 50304, seq = 1024, reps = 6, weights_only = 0;
    double settle = 3;
    const char *dir = ".";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--d-model") && v) d_model = atoi(argv[++i]);
        else if (!strcmp(a, "--layers") && v) layers = atoi(argv[++i]);
        else if (!strcmp(a, "--vocab") && v) vocab = atoi(argv[++i]);
        else if (!strcmp(a, "--seq") && v) seq = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--dir") && v) dir = argv[++i];
        else if (!strcmp(a, "--settle") && v) settle = atof(argv[++i]);
        else if (!strcmp(a, "--weights-only")) weights_only = 1;
        else {
            if (rank == 0) fprintf(stderr, "ckpt_bench: unknown argument %s (see the comment at the top)\n", a);
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1 || reps > 50) reps = 3;

    cai_model_config cfg = cai_model_config_default(CAI_MODEL_GPT2);
    cfg.vocab_size = vocab;
    cfg.d_model = d_model;
    cfg.n_heads = d_model / 64 > 0 ? d_model / 64 : 1;
    cfg.n_kv_heads = 0;
    cfg.n_layers = layers;
    cfg.max_seq_len = seq;
    cai_model_config rc;
    die(cai_model_config_resolve(&cfg, &rc));
    cai_registry_options ro = {.n_layers = rc.n_layers};
    cai_registry_t *reg = NULL;
    die(cai_registry_init(&reg, &ro));
    die(cai_model_register_params(reg, &rc));

    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){1, size, 1, 1, 1, NULL};
    mc.watchdog_timeout_s = 0;
    cai_mesh_t *mesh = NULL;
    die(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_ckpt_layout L = {reg, cai_rank_view_single(), 16, CAI_AXIS_DP_SP};
    size_t total = 0;
    die(cai_registry_local_layout(reg, &L.view, 16, NULL, &total));
    int nb = weights_only ? 1 : 3;
    float *bufs[3] = {NULL, NULL, NULL};
    for (int b = 0; b < nb; b++) {
        die(cai_malloc((void **)&bufs[b], total * sizeof(float), "bench buffer"));
        /* Incompressible, different per buffer, equal on every rank (replicas). */
        uint32_t x = 2463534242u + (uint32_t)b * 7919u;
        for (size_t i = 0; i < total; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bufs[b][i] = (float)(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
        }
    }
    const char *groups[3] = {"model", "optim/exp_avg", "optim/exp_avg_sq"};
    cai_ckpt_buffer cb[3];
    for (int b = 0; b < nb; b++)
        cb[b] = (cai_ckpt_buffer){.group = groups[b],
                                  .data = bufs[b],
                                  .dtype = CAI_DTYPE_F32,
                                  .file_dtype = CAI_DTYPE_F32,
                                  .replicated = 1,
                                  .skip_tie_copies = b > 0};
    cai_ckpt_meta meta = cai_ckpt_meta_init();
    meta.model = rc;
    meta.has_model = 1;
    meta.has_optim = !weights_only;
    snprintf(meta.app, sizeof meta.app, "ckpt_bench");

    char ck[4096], raw[4096];
    snprintf(ck, sizeof ck, "%s/ckpt_bench.h5", dir);
    snprintf(raw, sizeof raw, "%s/ckpt_bench.raw", dir);
    double bytes = (double)total * sizeof(float) * nb;
    if (rank == 0) {
        printf(
            "model: GPT-2 d_model %d, %d layers, vocabulary %d, %.1fM parameters (%.2f GB f32 weights); "
            "checkpoint %s = %.2f GB of tensors\n",
            rc.d_model, rc.n_layers, rc.vocab_size, (double)cai_registry_global_numel(reg) / 1e6,
            (double)total * 4 / 1e9, weights_only ? "weights" : "weights + exp_avg + exp_avg_sq", bytes / 1e9);
        printf(
            "%d ranks (data-parallel replicas, each writes half of every tensor); raw: one process, sequential "
            "write+fsync / read; files in %s; page cache dropped before every read\n",
            size, dir);
        printf("%-4s %-5s %10s %10s %8s %10s %10s %8s %6s\n", "rep", "first", "raw_w GB/s", "ckpt_w", "ratio",
               "raw_r GB/s", "ckpt_r", "ratio", "coll");
        fflush(stdout);
    }
    double *tw = calloc((size_t)reps, sizeof *tw), *cw = calloc((size_t)reps, sizeof *cw);
    double *tr = calloc((size_t)reps, sizeof *tr), *cr = calloc((size_t)reps, sizeof *cr);
    double *qw = calloc((size_t)reps, sizeof *qw), *qr = calloc((size_t)reps, sizeof *qr);
    int all_coll = 1;
    for (int r = 0; r < reps; r++) {
        /* Alternate which side goes first: the disk is shared and its speed
         * drifts, and whatever one write leaves behind (the host's cache
         * flushing) should not always fall on the same side. */
        int ckpt_first = r % 2;
        cai_ckpt_stats ws, rs;
        for (int k = 0; k < 2; k++) {
            settle_down(settle);
            if ((k == 0) == ckpt_first) {
                double t0 = now();
                die(cai_ckpt_save_buffers(mesh, ck, &L, cb, nb, &meta, &ws));
                cw[r] = max_all(now() - t0);
            } else {
                tw[r] = max_all(rank == 0 ? raw_write(raw, bufs, nb, total) : 0);
            }
        }
        if (rank == 0) {
            drop_cache(raw);
            drop_cache(ck);
        }
        for (int k = 0; k < 2; k++) {
            settle_down(settle);
            if ((k == 0) == ckpt_first) {
                double t0 = now();
                cai_ckpt_meta back;
                die(cai_ckpt_load_buffers(mesh, ck, &L, cb, nb, &back, &rs));
                cr[r] = max_all(now() - t0);
                cai_ckpt_meta_free(&back);
            } else {
                tr[r] = max_all(rank == 0 ? raw_read(raw, bufs, nb, total) : 0);
            }
        }
        if (getenv("CKPT_BENCH_VERBOSE"))
            fprintf(stderr,
                    "rank %d rep %d: write %.3f s (in H5Dwrite %.3f s, %d transfers), read %.3f s (in H5Dread "
                    "%.3f s)\n",
                    rank, r + 1, ws.seconds, ws.io_seconds, ws.n_transfers, rs.seconds, rs.io_seconds);
        int coll = ws.n_collective == ws.n_transfers && rs.n_collective == rs.n_transfers;
        MPI_Allreduce(MPI_IN_PLACE, &coll, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        all_coll &= coll;
        qw[r] = tw[r] / cw[r];
        qr[r] = tr[r] / cr[r];
        if (rank == 0) {
            printf("%-4d %-5s %10.3f %10.3f %7.2fx %10.3f %10.3f %7.2fx %6s\n", r + 1, ckpt_first ? "ckpt" : "raw",
                   bytes / tw[r] / 1e9, bytes / cw[r] / 1e9, qw[r], bytes / tr[r] / 1e9, bytes / cr[r] / 1e9, qr[r],
                   coll ? "all" : "NOT ALL");
            fflush(stdout);
        }
        if (rank == 0) {
            drop_cache(raw);
            drop_cache(ck);
        }
    }
    if (rank == 0) {
        double mtw = median(tw, reps), mcw = median(cw, reps), mtr = median(tr, reps), mcr = median(cr, reps);
        double gw = geomean(qw, reps), gr = geomean(qr, reps);
        printf(
            "median: write raw %.3f GB/s, checkpoint %.3f GB/s, ratio %.2fx; read raw %.3f GB/s, checkpoint %.3f "
            "GB/s, ratio %.2fx (goal >= 0.8x; ratios: median of the per-repetition ratios)%s\n",
            bytes / mtw / 1e9, bytes / mcw / 1e9, median(qw, reps), bytes / mtr / 1e9, bytes / mcr / 1e9,
            median(qr, reps), all_coll ? "; every HDF5 transfer collective" : "; NOT ALL TRANSFERS COLLECTIVE");
        printf(
            "geometric mean of the per-repetition ratios (each order equally often when reps is even): write "
            "%.2fx, read %.2fx\n",
            gw, gr);
        unlink(ck);
        unlink(raw);
    }
    free(tw);
    free(cw);
    free(tr);
    free(cr);
    free(qw);
    free(qr);
    for (int b = 0; b < nb; b++) cai_free(bufs[b]);
    cai_mesh_free(mesh);
    cai_registry_free(reg);
    MPI_Finalize();
    return 0;
}

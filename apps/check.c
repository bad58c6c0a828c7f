/* colossal-check: pre-flight tool. Reports what this build and this launch
 * can do (--info), validates and draws a proposed parallel layout for any
 * world size without needing that many processes (--layout), measures the
 * collectives of each mesh axis nccl-tests style (--bench), generates,
 * checks and draws a pipeline schedule (--schedule), and lists every layout
 * of a model over N ranks with its memory and predicted step time (--plan). */
#include "cai_config.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if CAI_HAVE_HDF5
#include <hdf5.h>
#endif
#if CAI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if CAI_HAVE_NCCL
#include <nccl.h>
#endif

#include "app_common.h"
#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/config.h"
#include "colossal/parallel.h"
#include "colossal/schedule.h"

/* ------------------------------------------------------------------ config */

typedef struct {
    int info, layout, bench;
    int pp, dp, ep, sp, tp;
    char *order;
    int np;
    int n_heads, n_kv_heads, n_layers, n_experts, vocab_size, pp_chunks;
    int64_t min_bytes, max_bytes;
    int factor, iters, warmup;
    char *axes, *ops;
    int device, transport;
    char *schedule, *trace;
    int microbatches, virtual_stages;
    double cost_f, cost_b, cost_w, cost_comm;
    double watchdog_timeout;
    /* --plan */
    int plan, family, d_model, ffn_hidden;
    int64_t plan_memory;
    int global_batch, micro_batch, seq_len, ranks_per_node, cores, threads, plan_iters, plan_layers, top, pp_zero,
        plan_fp8, max_virtual;
    double bandwidth, latency;
    char *pp_styles;
    cai_app_common common;
} check_config;

enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 };
static const char *const k_families[] = {"gpt2", "llama", NULL}; /* cai_model_family order */
static const char *const k_devices[] = {"cpu", "cuda", NULL};
/* Same order as cai_device_comm. */
static const char *const k_transports[] = {"auto", "nccl", "mpi", "stage", NULL};

/* The sweep parameters live under "sweep", not "bench": `bench` is the mode
 * flag, and a key cannot also be a section (YAML could not hold both). */
/* Range last so CAI_CFG_NO_RANGE (two numbers) can stand in for it. */
#define F(key, type, field, def, alias, doc, ...) \
    { key, type, offsetof(check_config, field), def, doc, __VA_ARGS__, NULL, alias }
#define BIG (1 << 20)

static const cai_config_field k_fields[] = {
    F("info", CAI_CFG_BOOL, info, "false", NULL,
      "print versions and capabilities (the default when no other mode is given)", CAI_CFG_NO_RANGE),
    F("layout", CAI_CFG_BOOL, layout, "false", NULL, "validate the layout for world size `np` and print its groups",
      CAI_CFG_NO_RANGE),
    F("bench", CAI_CFG_BOOL, bench, "false", NULL, "benchmark collectives on every mesh axis of size > 1",
      CAI_CFG_NO_RANGE),
    F("mesh.pp", CAI_CFG_INT, pp, "1", "pp", "pipeline-parallel size", 1, BIG),
    F("mesh.dp", CAI_CFG_INT, dp, "0", "dp", "data-parallel size (0: world / (pp*sp*tp))", 0, BIG),
    F("mesh.ep", CAI_CFG_INT, ep, "1", "ep", "expert-parallel size (divides dp)", 1, BIG),
    F("mesh.sp", CAI_CFG_INT, sp, "1", "sp", "sequence-parallel size", 1, BIG),
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tp", "tensor-parallel size", 1, BIG),
    F("mesh.order", CAI_CFG_STRING, order, "pp,dp,ep,sp,tp", NULL, "grid dimensions, outermost first",
      CAI_CFG_NO_RANGE),
    F("np", CAI_CFG_INT, np, "0", NULL, "world size to validate with --layout (0: this job's size)", 0, BIG),
    F("model.n_heads", CAI_CFG_INT, n_heads, "0", NULL, "attention heads, checked against tp (0: unchecked)", 0, BIG),
    F("model.n_kv_heads", CAI_CFG_INT, n_kv_heads, "0", NULL, "KV heads, checked against tp (0: unchecked)", 0, BIG),
    F("model.n_layers", CAI_CFG_INT, n_layers, "0", NULL, "layers, checked against pp (0: unchecked)", 0, BIG),
    F("model.n_experts", CAI_CFG_INT, n_experts, "0", NULL, "experts, checked against ep (0: unchecked)", 0, BIG),
    F("model.vocab_size", CAI_CFG_INT, vocab_size, "0", NULL, "vocabulary, checked against tp (0: unchecked)", 0,
      1 << 30),
    F("model.pp_chunks", CAI_CFG_INT, pp_chunks, "1", NULL, "virtual pipeline stages per rank", 1, 1024),
    {"model.family", CAI_CFG_ENUM, offsetof(check_config, family), "gpt2",
     "--plan: gpt2 or llama; the family's defaults fill every model key left at 0", CAI_CFG_NO_RANGE, k_families, NULL},
    F("model.d_model", CAI_CFG_INT, d_model, "0", NULL, "--plan: hidden size (0: the family's)", 0, 1 << 16),
    F("model.ffn_hidden", CAI_CFG_INT, ffn_hidden, "0", NULL, "--plan: MLP hidden size (0: the family's)", 0, 1 << 20),
    /* `plan` is the section of the mode's options, so the mode is plan.run
     * and a bare --plan is spelled --plan.run=true before parsing (main). */
    F("plan.run", CAI_CFG_BOOL, plan, "false", NULL,
      "list every layout of `np` ranks for the model with per-rank bytes and a predicted step time, ranked (--plan)",
      CAI_CFG_NO_RANGE),
    F("plan.memory", CAI_CFG_BYTES, plan_memory, "0", NULL, "--plan: memory per rank (bytes, 800M, 3GiB; 0: no limit)",
      0, 1e18),
    F("plan.global_batch", CAI_CFG_INT, global_batch, "0", NULL, "--plan: sequences per optimizer step (0: np)", 0,
      BIG),
    F("plan.micro_batch", CAI_CFG_INT, micro_batch, "0", NULL,
      "--plan: sequences per microbatch (0: every power of two that divides)", 0, BIG),
    F("plan.seq_len", CAI_CFG_INT, seq_len, "1024", NULL, "--plan: tokens per sequence", 1, BIG),
    F("plan.bandwidth", CAI_CFG_DOUBLE, bandwidth, "0", NULL,
      "--plan: link bus bandwidth in GB/s (0: measured over this job's ranks; 10 on one rank)", 0, 1e6),
    F("plan.latency", CAI_CFG_DOUBLE, latency, "0", NULL,
      "--plan: microseconds per collective (0: measured over this job's ranks; 20 on one rank)", 0, 1e9),
    F("plan.ranks_per_node", CAI_CFG_INT, ranks_per_node, "0", NULL,
      "--plan: ranks of the planned job per node (0: np x this job's ranks per node / its size)", 0, BIG),
    F("plan.cores", CAI_CFG_INT, cores, "0", NULL, "--plan: cores per node (0: this node's online processors)", 0, BIG),
    F("plan.threads", CAI_CFG_INT, threads, "0", NULL, "--plan: CPU threads per rank (0: the OpenMP default)", 0, 4096),
    F("plan.iters", CAI_CFG_INT, plan_iters, "1", NULL,
      "--plan: timed rounds (4 forwards, then their backwards) of the measured layers", 1, 1000),
    F("plan.layers", CAI_CFG_INT, plan_layers, "1", NULL,
      "--plan: layers of the measured model (a pipeline stage's count measures its memory traffic too)", 1, 1024),
    F("plan.top", CAI_CFG_INT, top, "0", NULL, "--plan: rows printed besides those that do not divide (0: all)", 0,
      BIG),
    F("plan.pp_schedules", CAI_CFG_STRING, pp_styles, "gpipe,1f1b,interleaved,zb-h1,zb-v", NULL,
      "--plan: schedules colossal-pretrain runs under pp (the others are listed as not run)", CAI_CFG_NO_RANGE),
    F("plan.fp8", CAI_CFG_BOOL, plan_fp8, "false", NULL,
      "--plan: count FP8 linears (fp8.layers auto: all blocks but the first and last) in every layout's bytes; "
      "the predicted times stay those of the layers measured without FP8",
      CAI_CFG_NO_RANGE),
    F("plan.pp_zero", CAI_CFG_INT, pp_zero, "1", NULL, "--plan: highest ZeRO stage colossal-pretrain runs under pp", 0,
      3),
    F("plan.max_virtual", CAI_CFG_INT, max_virtual, "4", NULL, "--plan: interleaved chunks per rank tried (2..this)", 2,
      64),
    F("sweep.min_bytes", CAI_CFG_BYTES, min_bytes, "1K", "min_bytes", "smallest message (1K = 1024 bytes, 1KB = 1000)",
      1, 1e15),
    F("sweep.max_bytes", CAI_CFG_BYTES, max_bytes, "256M", "max_bytes", "largest message", 1, 1e15),
    F("sweep.factor", CAI_CFG_INT, factor, "2", "factor", "size multiplier between rows", 2, 1024),
    F("sweep.iters", CAI_CFG_INT, iters, "20", "iters", "timed iterations per size (scaled down above 16 MiB)", 1, BIG),
    F("sweep.warmup", CAI_CFG_INT, warmup, "5", "warmup", "untimed iterations per size", 0, BIG),
    F("sweep.axes", CAI_CFG_STRING, axes, "all", "axes", "axes to measure: all, or a list such as dp,tp",
      CAI_CFG_NO_RANGE),
    F("sweep.ops", CAI_CFG_STRING, ops, "all", "ops",
      "collectives: all, or a list of allreduce, allgather, reducescatter, alltoall", CAI_CFG_NO_RANGE),
    {"sweep.device", CAI_CFG_ENUM, offsetof(check_config, device), "cpu", "buffers in host (cpu) or GPU (cuda) memory",
     CAI_CFG_NO_RANGE, k_devices, "device"},
    {"sweep.transport", CAI_CFG_ENUM, offsetof(check_config, transport), "auto",
     "device buffers: auto (NCCL, else CUDA-aware MPI, else staged), nccl, mpi (CUDA-aware) or stage (via host)",
     CAI_CFG_NO_RANGE, k_transports, NULL},
    /* `schedule` is both the mode and its style: a key cannot be a bool flag
     * and a string at once, so a bare --schedule is spelled --schedule=1f1b
     * before parsing (main). Not pp.*: `pp` is mesh.pp's alias. */
    F("pipeline.schedule", CAI_CFG_STRING, schedule, "", "schedule",
      "simulate and draw a pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v (a bare --schedule is 1f1b; "
      "empty: off)",
      CAI_CFG_NO_RANGE),
    F("pipeline.microbatches", CAI_CFG_INT, microbatches, "0", "microbatches",
      "microbatches per step for --schedule (0: 4 x pp)", 0, BIG),
    F("pipeline.virtual", CAI_CFG_INT, virtual_stages, "0", "virtual",
      "chunks per pipeline rank for --schedule (0: the style's, 2 for interleaved and zb-v, else 1)", 0, 1024),
    F("pipeline.f", CAI_CFG_DOUBLE, cost_f, "1", NULL, "--schedule: forward time of one chunk (> 0)", 0, 1e9),
    F("pipeline.b", CAI_CFG_DOUBLE, cost_b, "1", NULL,
      "--schedule: input-gradient time of one chunk (> 0; a fused backward takes b + w)", 0, 1e9),
    F("pipeline.w", CAI_CFG_DOUBLE, cost_w, "1", NULL, "--schedule: weight-gradient time of one chunk", 0, 1e9),
    F("pipeline.comm", CAI_CFG_DOUBLE, cost_comm, "0", NULL, "--schedule: time from a send to its data arriving", 0,
      1e9),
    F("pipeline.trace", CAI_CFG_STRING, trace, "", "trace",
      "--schedule: also write the simulated run as a Chrome trace (JSON) to this file, one time unit = 1 s",
      CAI_CFG_NO_RANGE),
    F("watchdog.timeout", CAI_CFG_DOUBLE, watchdog_timeout, "300", NULL,
      "seconds before a stalled collective aborts naming the rank (0: off)", 0, 1e9),
    CAI_APP_COMMON_FIELDS(check_config, common),
};
#undef BIG
#undef F

static const cai_config_schema k_schema = {
    "colossal-check",
    "pre-flight check: versions and capabilities (--info), layout validation (--layout), collective bandwidth "
    "per mesh axis (--bench), pipeline schedules (--schedule STYLE --pp P --microbatches M [--virtual V]), layouts "
    "(--plan --np N --config model.yaml --plan.memory 2GiB)",
    k_fields,
    sizeof k_fields / sizeof k_fields[0],
};

/* ------------------------------------------------------------------ capabilities
 * Everything that talks to CUDA, NCCL, HDF5 or OpenBLAS directly is in this
 * section: it is a capability report, so it asks the libraries themselves. */

static void print_cuda(int rank_prints, int *gpus_out) {
    *gpus_out = 0;
#if CAI_HAVE_CUDA
    int drv = 0, rt = 0, n = 0;
    cudaDriverGetVersion(&drv); /* 0 when no driver is installed */
    cudaRuntimeGetVersion(&rt);
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) n = 0;
    *gpus_out = n;
    if (!rank_prints) return;
    printf("  CUDA runtime      %d.%d\n", rt / 1000, (rt % 1000) / 10);
    if (drv) printf("  CUDA driver       %d.%d\n", drv / 1000, (drv % 1000) / 10);
    else printf("  CUDA driver       none found\n");
    if (n == 0) {
        printf("  GPUs              no GPU visible (%s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
        return;
    }
    printf("  GPUs              %d on this node\n", n);
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
            printf("    [%d] (properties unavailable)\n", d);
            continue;
        }
        printf("    [%d] %s, %.1f GiB, sm_%d%d, PCI %04x:%02x:%02x\n", d, p.name,
               (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.major, p.minor, p.pciDomainID, p.pciBusID,
               p.pciDeviceID);
    }
#else
    if (rank_prints) printf("  CUDA              not built (configure found no CUDA toolkit)\n");
#endif
}

static void print_nccl(void) {
#if CAI_HAVE_NCCL
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess)
        printf("  NCCL              %d.%d.%d (built against %d.%d.%d)\n", v / 10000, (v % 10000) / 100, v % 100,
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    else
        printf("  NCCL              built against %d.%d.%d, library did not answer\n", NCCL_MAJOR, NCCL_MINOR,
               NCCL_PATCH);
#else
    printf("  NCCL              not built\n");
#endif
}

static void print_hdf5(void) {
#if CAI_HAVE_HDF5
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
#ifdef H5_HAVE_PARALLEL
    const char *par = "parallel (MPI-IO)";
#else
    const char *par = "SERIAL: checkpoints need parallel HDF5";
#endif
    printf("  HDF5              %u.%u.%u, %s\n", maj, min, rel, par);
#else
    printf("  HDF5              not built: checkpoints are disabled\n");
#endif
}

static void print_threads(void) {
#ifdef OPENBLAS_SEQUENTIAL /* defined by OpenBLAS's cblas.h only */
    const char *cfg = openblas_get_config();
    const int nt = openblas_get_num_threads();
    printf("  OpenBLAS          %d thread%s, %s, core %s\n", nt, nt == 1 ? "" : "s", cfg ? cfg : "?",
           openblas_get_corename());
#else
    printf("  BLAS              not OpenBLAS (thread count unknown)\n");
#endif
#ifdef _OPENMP
    /* Both reflect this rank's CPU binding, which is what its kernels get. */
    printf("  OpenMP            %d thread%s (max), %d processor%s available to rank 0\n", omp_get_max_threads(),
           omp_get_max_threads() == 1 ? "" : "s", omp_get_num_procs(), omp_get_num_procs() == 1 ? "" : "s");
#else
    printf("  OpenMP            not built\n");
#endif
}

static void print_pmix(void) {
    const char *ns = getenv("PMIX_NAMESPACE"), *rk = getenv("PMIX_RANK");
    printf("  PMIx              %s", CAI_HAVE_PMIX ? CAI_PMIX_DESC : "no headers at build time");
    if (ns || rk) printf("; launched under PMIx (namespace %s, rank %s)\n", ns ? ns : "?", rk ? rk : "?");
    else printf("; not launched under PMIx\n");
}

/* How device buffers travel: the forced path, or the one AUTO picks in the
 * cluster layer (NCCL when built, else CUDA-aware MPI, else staged). */
static const char *device_transport(cai_device_comm forced) {
    switch (forced) {
    case CAI_DEVICE_COMM_NCCL: return "NCCL (device)";
    case CAI_DEVICE_COMM_MPI: return "MPI (CUDA-aware)";
    case CAI_DEVICE_COMM_STAGE: return "MPI staged";
    default: break;
    }
#if CAI_HAVE_NCCL
    return "NCCL (device)";
#else
    return cai_mpi_cuda_aware() ? "MPI (CUDA-aware)" : "MPI staged";
#endif
}

/* Bench on GPUs: one device per node-local rank and a transport that this
 * build and this MPI can serve, or an error saying why not. */
static cai_status select_gpu(int local_rank, cai_device_comm forced) {
    if (forced == CAI_DEVICE_COMM_MPI && !cai_mpi_cuda_aware())
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "sweep.transport=mpi but this MPI is not CUDA-aware; use nccl or stage");
    if (forced == CAI_DEVICE_COMM_NCCL && !CAI_HAVE_NCCL)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "sweep.transport=nccl but this build has no NCCL; use stage");
#if CAI_HAVE_CUDA
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0)
        return CAI_ERROR(CAI_ERR_CUDA, "sweep.device=cuda but no GPU is visible (%s); use sweep.device=cpu",
                         err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    err = cudaSetDevice(local_rank % n);
    if (err != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "cudaSetDevice(%d) failed: %s", local_rank % n, cudaGetErrorString(err));
    return CAI_OK;
#else
    return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                     "sweep.device=cuda but this build has no CUDA (reconfigure --with-cuda); use sweep.device=cpu");
#endif
}

/* ------------------------------------------------------------------ --info */

typedef struct {
    char host[MPI_MAX_PROCESSOR_NAME];
    int gpus;
} rank_facts;

/* "0-3,8,10-11" from an ascending list. */
static void format_ranks(const int *r, int n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < n && used < cap; i++) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        int w = j > i ? snprintf(buf + used, cap - used, "%s%d-%d", used ? "," : "", r[i], r[j])
                      : snprintf(buf + used, cap - used, "%s%d", used ? "," : "", r[i]);
        used += w > 0 ? (size_t)w : 0;
        i = j;
    }
}

static cai_status print_hosts(const cai_app *app, const rank_facts *all) {
    int *ranks = NULL;
    char *seen = NULL, *list = NULL;
    cai_status st = CAI_OK;
    const size_t list_cap = 4096;
    CAI_CALL_GOTO(cai_malloc((void **)&ranks, sizeof(int) * (size_t)app->size, "rank list"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&seen, (size_t)app->size, 1, "host marks"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&list, list_cap, "rank ranges"), st, done);
    for (int i = 0; i < app->size; i++) {
        if (seen[i]) continue;
        int n = 0;
        for (int j = i; j < app->size; j++) {
            if (!seen[j] && strcmp(all[j].host, all[i].host) == 0) {
                seen[j] = 1;
                ranks[n++] = j;
            }
        }
        format_ranks(ranks, n, list, list_cap);
        printf("    %-20s %d rank%s (%s), %d GPU%s\n", all[i].host, n, n == 1 ? "" : "s", list, all[i].gpus,
               all[i].gpus == 1 ? "" : "s");
    }
done:
    cai_free(ranks);
    cai_free(seen);
    cai_free(list);
    return st;
}

/* The knob table (src/base/knobs.c) as rank 0 reads it, NCCL's parameter
 * style: name, value and where it came from, then the default, the valid
 * values and the meaning. A value that does not parse is shown with the
 * error the library gives when the knob is first used; --info still runs. */
static void print_knobs(void) {
    printf("  test hooks        %s\n",
           cai_test_hooks_built() ? "compiled in (configure --enable-test-hooks)" : "not compiled in");
    printf("  knobs             environment variables, as rank 0 sees them\n");
    for (size_t i = 0; i < cai_knob_count(); i++) {
        const cai_knob_info *k = cai_knob_at(i);
        const char *v = NULL;
        cai_knob_source src = CAI_KNOB_FROM_DEFAULT;
        if (cai_knob_value(k->name, &v, &src) == CAI_OK) {
            printf("    %-26s %s (%s)\n", k->name, *v ? v : "\"\"",
                   src == CAI_KNOB_FROM_ENV       ? "environment"
                   : src == CAI_KNOB_FROM_PROGRAM ? "set by the program"
                                                  : "default");
        } else {
            printf("    %-26s INVALID: %s\n", k->name, cai_error_message());
            cai_error_clear();
        }
        if (k->type == CAI_KNOB_INT)
            printf("      default %s, integer in [%lld, %lld]: %s\n", k->dflt, k->min, k->max, k->meaning);
        else if (k->type == CAI_KNOB_ENUM) printf("      default %s, one of %s: %s\n", k->dflt, k->choices, k->meaning);
        else printf("      default %s: %s\n", *k->dflt ? k->dflt : "unset", k->meaning);
    }
}

/* Collective over MPI_COMM_WORLD (host names and GPU counts are gathered). */
static cai_status run_info(const cai_app *app) {
    int root = app->rank == 0;
    rank_facts mine = {{0}, 0};
    int len = 0;
    CAI_CALL_MPI(MPI_Get_processor_name(mine.host, &len));

    if (root) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int maj = 0, min = 0;
        CAI_CALL_MPI(MPI_Get_library_version(lib, &len));
        CAI_CALL_MPI(MPI_Get_version(&maj, &min));
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        printf("colossal-check: versions and capabilities\n");
        printf("  colossal          %s\n", cai_version_string());
        printf("  MPI library       %s\n", lib);
        printf("  MPI standard      %d.%d\n", maj, min);
        printf("  CUDA-aware MPI    %s\n",
               cai_mpi_cuda_aware() ? "yes" : "no (device buffers use NCCL or host staging)");
        print_pmix();
        print_hdf5();
        print_nccl();
    }
    print_cuda(root, &mine.gpus);
    if (root) print_threads();

    rank_facts *all = NULL;
    cai_status st = CAI_OK;
    if (root) CAI_CALL(cai_malloc((void **)&all, sizeof(rank_facts) * (size_t)app->size, "host table"));
    int rc = MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        cai_free(all);
        return cai_error_mpi(rc, __FILE__, __LINE__, __func__, "MPI_Gather(host names)");
    }
    int per_node_min = app->local_size, per_node_max = app->local_size;
    CAI_CALL_MPI(MPI_Reduce(&app->local_size, &per_node_min, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD));
    CAI_CALL_MPI(MPI_Reduce(&app->local_size, &per_node_max, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD));
    if (root) {
        printf("  world             %d rank%s on %d node%s, ", app->size, app->size == 1 ? "" : "s", app->n_nodes,
               app->n_nodes == 1 ? "" : "s");
        if (per_node_min == per_node_max) printf("%d rank%s per node\n", per_node_min, per_node_min == 1 ? "" : "s");
        else printf("%d-%d ranks per node\n", per_node_min, per_node_max);
        printf("  hosts\n");
        st = print_hosts(app, all);
        print_knobs();
        fflush(stdout);
    }
    cai_free(all);
    return st;
}

/* ------------------------------------------------------------------ --layout */

static cai_layout layout_from(const check_config *c, int world) {
    cai_layout L = {c->pp, c->dp, c->ep, c->sp, c->tp, c->order};
    /* dp = 0 means "what is left"; when that does not divide, dp = the floor
     * (at least 1) so validation reports the mismatch with suggestions. */
    if (L.dp == 0) {
        long rest = (long)c->pp * c->sp * c->tp;
        L.dp = rest > 0 && world / rest > 0 ? (int)(world / rest) : 1;
    }
    return L;
}

static cai_layout_model model_from(const check_config *c) {
    cai_layout_model m = {c->n_heads, c->n_kv_heads, c->n_layers, c->n_experts, c->vocab_size, c->pp_chunks};
    return m;
}

static void print_layout_line(const cai_layout *L, int world) {
    char text[128];
    cai_layout_str(L, text, sizeof text);
    printf("layout: %s (%d ranks, order %s)\n", text, world, L->order && L->order[0] ? L->order : "pp,dp,ep,sp,tp");
}

/* Not collective: every rank decides the same; rank 0 prints. */
static cai_status run_layout(const cai_app *app, const check_config *c) {
    int world = c->np ? c->np : app->size;
    cai_layout L = layout_from(c, world);
    cai_layout_model m = model_from(c);
    CAI_CALL(cai_layout_validate(world, &L, &m));
    if (app->rank == 0) {
        cai_layout_print(&L, stdout);
        fflush(stdout);
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ --bench */

static const cai_axis k_bench_axes[] = {CAI_AXIS_PP, CAI_AXIS_DP, CAI_AXIS_EP, CAI_AXIS_SP, CAI_AXIS_TP};
#define N_BENCH_AXES (int)(sizeof k_bench_axes / sizeof k_bench_axes[0])

/* Compare ignoring '_' and '-' so all_reduce, all-reduce and allreduce match. */
static int name_eq(const char *a, const char *b, size_t alen) {
    size_t i = 0;
    for (;;) {
        while (i < alen && (a[i] == '_' || a[i] == '-')) i++;
        while (*b == '_' || *b == '-') b++;
        if (i == alen || !*b) return i == alen && !*b;
        if ((a[i] | 0x20) != (*b | 0x20)) return 0;
        i++;
        b++;
    }
}

static cai_status parse_ops(const char *list, int use[CAI_BENCH_COUNT]) {
    memset(use, 0, sizeof(int) * CAI_BENCH_COUNT);
    if (strcmp(list, "all") == 0) {
        for (int i = 0; i < CAI_BENCH_COUNT; i++) use[i] = 1;
        return CAI_OK;
    }
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ", ");
        if (n) {
            int found = 0;
            for (int i = 0; i < CAI_BENCH_COUNT && !found; i++)
                if (name_eq(p, cai_bench_op_name((cai_bench_op)i), n)) use[i] = found = 1;
            if (!found)
                return CAI_ERROR(CAI_ERR_CONFIG,
                                 "sweep.ops: unknown collective '%.*s' (expected all, or a list of allreduce, "
                                 "allgather, reducescatter, alltoall)",
                                 (int)n, p);
        }
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    return CAI_OK;
}

/* Axes in the order measured; returns the count. */
static cai_status parse_axes(const char *list, cai_axis *axes, int *n_out) {
    int n = 0;
    if (strcmp(list, "all") == 0) {
        for (int i = 0; i < N_BENCH_AXES; i++) axes[n++] = k_bench_axes[i];
        *n_out = n;
        return CAI_OK;
    }
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ", ");
        if (len) {
            char name[32];
            if (len >= sizeof name) return CAI_ERROR(CAI_ERR_CONFIG, "sweep.axes: '%.*s' is not an axis", (int)len, p);
            memcpy(name, p, len);
            name[len] = 0;
            cai_axis a;
            if (cai_axis_parse(name, &a) != CAI_OK)
                return CAI_ERROR(CAI_ERR_CONFIG,
                                 "sweep.axes: unknown axis '%s' (expected all, or a list of pp, dp, "
                                 "ep, sp, tp, edp, dp_sp, world)",
                                 name);
            int dup = 0;
            for (int i = 0; i < n; i++) dup |= axes[i] == a;
            if (!dup && n < CAI_AXIS_COUNT) axes[n++] = a;
        }
        p += len;
        while (*p == ',' || *p == ' ') p++;
    }
    if (n == 0) return CAI_ERROR(CAI_ERR_CONFIG, "sweep.axes is empty (expected all, or e.g. dp,tp)");
    *n_out = n;
    return CAI_OK;
}

typedef struct {
    size_t min_bytes, max_bytes;
    int use_op[CAI_BENCH_COUNT];
    cai_axis axes[CAI_AXIS_COUNT];
    int n_axes;
} bench_plan;

static cai_status plan_bench(const check_config *c, bench_plan *p) {
    p->min_bytes = (size_t)c->min_bytes;
    p->max_bytes = (size_t)c->max_bytes;
    if (p->min_bytes > p->max_bytes)
        return CAI_ERROR(CAI_ERR_CONFIG, "sweep.min_bytes (%zu) is larger than sweep.max_bytes (%zu)", p->min_bytes,
                         p->max_bytes);
    CAI_CALL(parse_ops(c->ops, p->use_op));
    CAI_CALL(parse_axes(c->axes, p->axes, &p->n_axes));
    return CAI_OK;
}

/* Big messages get fewer iterations so the default 1 KiB..256 MiB sweep ends
 * in minutes on a CPU box: about 16 MiB x iters of traffic per row at most. */
#define BENCH_FULL_ITERS_BYTES (16u << 20)
static int scaled(int n, size_t bytes, int floor_n) {
    if (bytes <= BENCH_FULL_ITERS_BYTES || n <= floor_n) return n;
    double s = (double)n * BENCH_FULL_ITERS_BYTES / (double)bytes;
    return s < floor_n ? floor_n : (int)s;
}

/* nccl-tests' "count": elements passed to the collective call, i.e. the whole
 * buffer for allreduce and one rank's block for the others. */
static size_t op_count(cai_bench_op op, size_t bytes, int n, size_t elem) {
    return op == CAI_BENCH_ALLREDUCE ? bytes / elem : bytes / elem / (size_t)n;
}

/* Collective over the mesh; rank 0 prints one table per axis. */
static cai_status bench_axis(cai_mesh_t *mesh, const check_config *c, const bench_plan *p, cai_axis axis,
                             const char *transport, int world, int root) {
    const int n = cai_mesh_size(mesh, axis);
    const size_t elem = cai_dtype_size(CAI_DTYPE_F32);
    if (root) {
        char grp[256];
        format_ranks(cai_mesh_group(mesh, axis), n, grp, sizeof grp);
        printf("\n# axis %s: %d group%s of %d ranks (rank 0's group: %s), transport %s\n", cai_axis_name(axis),
               world / n, world / n == 1 ? "" : "s", n, grp, transport);
        printf("# %-13s %12s %12s %5s %11s %12s %12s  %s\n", "op", "size(B)", "count", "type", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "transport");
    }
    double bus_sum = 0;
    int rows = 0;
    for (int o = 0; o < CAI_BENCH_COUNT; o++) {
        if (!p->use_op[o]) continue;
        const cai_bench_op op = (cai_bench_op)o;
        /* Every rank sends/receives whole f32 blocks: round to the group. */
        const size_t unit = op == CAI_BENCH_ALLREDUCE ? elem : elem * (size_t)n;
        size_t last = 0;
        for (size_t want = p->min_bytes;; want *= (size_t)c->factor) {
            const size_t bytes = want / unit * unit;
            if (bytes && bytes != last) {
                cai_bench_result r;
                CAI_CALL(cai_mesh_bench(mesh, axis, op, bytes, scaled(c->warmup, bytes, 1), scaled(c->iters, bytes, 2),
                                        c->device == DEVICE_CUDA, &r));
                if (root) {
                    printf("  %-13s %12zu %12zu %5s %11.2f %12.3f %12.3f  %s\n", cai_bench_op_name(op), r.bytes,
                           op_count(op, r.bytes, n, elem), cai_dtype_name(CAI_DTYPE_F32), r.time_us, r.algbw_gbs,
                           r.busbw_gbs, transport);
                    fflush(stdout);
                }
                bus_sum += r.busbw_gbs;
                rows++;
                last = bytes;
            }
            if (want > p->max_bytes / (size_t)c->factor) break; /* the next step passes max_bytes */
        }
    }
    if (root && rows)
        printf("# axis %s: average busbw %.3f GB/s over %d rows\n", cai_axis_name(axis), bus_sum / rows, rows);
    return CAI_OK;
}

static cai_status run_bench(const cai_app *app, const check_config *c) {
    bench_plan plan;
    cai_layout L = layout_from(c, app->size);
    cai_layout_model m = model_from(c);
    /* Everything decided from the config is checked on every rank before the
     * mesh or any buffer exists, so a bad layout costs nothing. */
    cai_status st = cai_layout_validate(app->size, &L, &m);
    if (st == CAI_OK) st = plan_bench(c, &plan);
    cai_app_check_all(st, 1);
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = L;
    mc.watchdog_timeout_s = c->watchdog_timeout;
    mc.device_comm = (cai_device_comm)c->transport;
    const char *transport = "MPI (host)";
    if (c->device == DEVICE_CUDA) {
        cai_app_check_all(select_gpu(app->local_rank, mc.device_comm), 1);
        transport = device_transport(mc.device_comm);
    }

    cai_mesh_t *mesh = NULL;
    CAI_CALL(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    if (app->rank == 0) {
        printf(
            "colossal-check bench: %d ranks, device %s, dtype %s, warmup %d, iters %d (fewer above 16 MiB), "
            "sizes %zu..%zu B x%d\n",
            app->size, k_devices[c->device], cai_dtype_name(CAI_DTYPE_F32), c->warmup, c->iters, plan.min_bytes,
            plan.max_bytes, c->factor);
        print_layout_line(&L, app->size);
    }
    int measured = 0;
    for (int i = 0; i < plan.n_axes && st == CAI_OK; i++) {
        if (cai_mesh_size(mesh, plan.axes[i]) <= 1) {
            if (app->rank == 0) printf("\n# axis %s: size 1, nothing to measure\n", cai_axis_name(plan.axes[i]));
            continue;
        }
        CAI_CALL_GOTO(bench_axis(mesh, c, &plan, plan.axes[i], transport, app->size, app->rank == 0), st, done);
        measured++;
    }
    if (app->rank == 0 && measured == 0)
        printf("\nno axis of size > 1 to measure: give a layout with dp, tp, pp, sp or ep > 1 and enough ranks\n");
done:
    cai_mesh_free(mesh);
    fflush(stdout);
    return st;
}

/* ------------------------------------------------------------------ --schedule */

/* Every rank builds and checks the same schedule (the result is decided
 * identically everywhere); rank 0 draws it and writes the trace. */
static cai_status run_schedule(const cai_app *app, const check_config *c) {
    cai_pp_spec spec;
    CAI_CALL(cai_pp_style_parse(c->schedule, &spec.style));
    spec.pp = c->pp;
    spec.virtual_stages = c->virtual_stages ? c->virtual_stages : cai_pp_style_default_virtual(spec.style);
    spec.microbatches = c->microbatches ? c->microbatches : 4 * c->pp;
    const cai_pp_costs costs = {c->cost_f, c->cost_b, c->cost_w, c->cost_comm};
    cai_pp_schedule *s = NULL;
    cai_status st;
    CAI_CALL(cai_pp_schedule_build(&spec, &s));
    CAI_CALL_GOTO(cai_pp_schedule_check(s, &costs, NULL), st, done);
    if (app->rank == 0) {
        CAI_CALL_GOTO(cai_pp_schedule_print_timeline(s, &costs, stdout), st, done);
        if (c->trace[0]) {
            CAI_CALL_GOTO(cai_pp_schedule_write_chrome_trace(s, &costs, c->trace), st, done);
            printf("chrome trace: %s\n", c->trace);
        }
        fflush(stdout);
    }
done:
    cai_pp_schedule_free(s);
    return st;
}

/* A bare --schedule (last, or followed by another option) selects the mode
 * with the default style: the config parser reads a string key's value from
 * the next argument, so it is given one here. */
static void bare_schedule_flag(int argc, char **argv) {
    static char with_default[] = "--schedule=1f1b";
    for (int i = 1; i < argc; i++)
        if ((!strcmp(argv[i], "--schedule") || !strcmp(argv[i], "--pipeline.schedule")) &&
            (i + 1 == argc || !strncmp(argv[i + 1], "--", 2)))
            argv[i] = with_default;
}

/* ------------------------------------------------------------------ --plan */

static cai_status parse_styles(const char *list, unsigned *mask) {
    *mask = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ", ");
        if (n) {
            char name[32];
            if (n >= sizeof name)
                return CAI_ERROR(CAI_ERR_CONFIG, "plan.pp_schedules: '%.*s' is no schedule", (int)n, p);
            memcpy(name, p, n);
            name[n] = 0;
            cai_pp_style s;
            CAI_CALL(cai_pp_style_parse(name, &s));
            *mask |= 1u << s;
        }
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    return CAI_OK;
}

/* The model from the family's defaults and the keys given. */
static cai_model_config plan_model(const check_config *c) {
    cai_model_config m = cai_model_config_default((cai_model_family)c->family);
    if (c->n_layers) m.n_layers = c->n_layers;
    if (c->d_model) m.d_model = c->d_model;
    if (c->n_heads) {
        m.n_heads = c->n_heads;
        m.n_kv_heads = 0;
    }
    if (c->n_kv_heads) m.n_kv_heads = c->n_kv_heads;
    if (c->ffn_hidden) m.ffn_hidden = c->ffn_hidden;
    if (c->vocab_size) m.vocab_size = c->vocab_size;
    return m;
}

/* Every rank of this job times the model's layers at once (so the cores
 * are shared as they will be) and, with two ranks or more, the links; the
 * means are planned with on every rank, rank 0 prints. Collective over
 * MPI_COMM_WORLD. */
static cai_status run_plan(const cai_app *app, const check_config *c) {
    cai_plan_request q;
    cai_plan_request_init(&q);
    q.model = plan_model(c);
    q.np = c->np ? c->np : app->size;
    q.seq_len = c->seq_len;
    q.global_batch = c->global_batch ? c->global_batch : q.np;
    q.micro_batch = c->micro_batch;
    q.mem_limit = (size_t)c->plan_memory;
    q.max_virtual = c->max_virtual;
    q.run_pp_zero = c->pp_zero;
    cai_fp8_config f8 = cai_fp8_config_default();
    f8.enabled = 1;
    if (c->plan_fp8) q.fp8 = &f8;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    q.cores = c->cores ? c->cores : online > 0 ? (int)online : 1;
    q.ranks_per_node =
        c->ranks_per_node ? c->ranks_per_node : (int)(((long)q.np * app->local_size + app->size - 1) / app->size);
    cai_device_t *dev = NULL;
    cai_mesh_t *mesh = NULL;
    cai_plan_entry *e = NULL;
    int n = 0;
    cai_status st = parse_styles(c->pp_styles, &q.run_styles);
    cai_model_config resolved;
    if (st == CAI_OK) {
        cai_model_config m = q.model;
        m.max_seq_len = q.seq_len;
        st = cai_model_config_resolve(&m, &resolved);
    }
    cai_app_check_all(st, 1);
    CAI_CALL(cai_device_init(&dev, CAI_DEVICE_HOST, 0, c->threads));
    q.dev = dev;
    /* A micro-batch of one sequence (or the one asked for); the model scales
     * the times to each layout's microbatch by its tokens. */
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout.dp = app->size;
    mc.watchdog_timeout_s = c->watchdog_timeout;
    CAI_CALL_GOTO(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc), st, done);
    CAI_CALL_GOTO(cai_plan_measure_compute(dev, mesh, &resolved, c->plan_layers, c->micro_batch ? c->micro_batch : 1,
                                           q.seq_len, c->plan_iters, &q.costs),
                  st, done);
    q.costs.concurrency = app->local_size;
    q.costs.threads = dev->num_threads;
    q.costs.bandwidth = 10e9;
    q.costs.latency = 20e-6;
    if (app->size >= 2 && (c->bandwidth <= 0 || c->latency <= 0)) {
        cai_plan_costs k = q.costs;
        CAI_CALL_GOTO(cai_plan_measure_comm(mesh, &k), st, done);
        q.costs.bandwidth = k.bandwidth;
        q.costs.latency = k.latency;
    }
    if (c->bandwidth > 0) q.costs.bandwidth = c->bandwidth * 1e9;
    if (c->latency > 0) q.costs.latency = c->latency * 1e-6;
    CAI_CALL_GOTO(cai_plan_layouts(&q, &e, &n), st, done);
    if (app->rank == 0) {
        cai_plan_print(&q, e, n, c->top, stdout);
        fflush(stdout);
    }
    int w = -1;
    CAI_CALL_GOTO(cai_plan_pick(&q, e, n, &w), st, done);
    if (app->rank == 0) {
        const cai_plan_entry *x = &e[w];
        printf("winner: mesh.dp=%d mesh.tp=%d mesh.pp=%d", x->dp, x->tp, x->pp);
        if (x->pp > 1) printf(" pp.schedule=%s pp.virtual=%d", cai_pp_style_name(x->style), x->virtual_stages);
        printf(
            " zero.stage=%d train.micro_batch=%d train.grad_accum=%d model.activation_checkpointing=%s: %.1f MiB "
            "per rank, %.3f s per step predicted\n",
            x->zero, x->micro_batch, x->microbatches, x->ckpt ? "true" : "false", x->bytes / 1048576.0, x->time);
        fflush(stdout);
    }
done:
    cai_free(e);
    cai_mesh_free(mesh);
    cai_device_free(dev);
    return st;
}

/* A bare --plan selects the mode. */
static void bare_plan_flag(int argc, char **argv) {
    static char on[] = "--plan.run=true";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--plan")) argv[i] = on;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    check_config cfg;
    cai_app app;
    bare_schedule_flag(argc, argv);
    bare_plan_flag(argc, argv);
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(check_config, common));

    const int schedule = cfg.schedule[0] != 0;
    if (cfg.info || (!cfg.layout && !cfg.bench && !schedule && !cfg.plan)) cai_app_check(run_info(&app));
    if (cfg.layout) cai_app_check_all(run_layout(&app, &cfg), 1);
    if (schedule) cai_app_check_all(run_schedule(&app, &cfg), 1);
    if (cfg.bench) cai_app_check(run_bench(&app, &cfg));
    if (cfg.plan) cai_app_check(run_plan(&app, &cfg));
    return cai_app_finalize(&k_schema, &cfg);
}

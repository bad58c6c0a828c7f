/* The equivalence harness: train a tiny model N steps on one rank with the
 * single-process driver (cai_train_step, no engine) and again under a
 * data-parallel / ZeRO layout over a communicator, then compare the loss of
 * every step, the global gradient norm and the parameters after N steps.
 * Each layout's rows add to the matrix in tests/mpi/test_equiv.c; other
 * dimensions (tp, pp, ...) add their own layouts to the same harness. */
#ifndef TEST_EQUIV_HARNESS_H
#define TEST_EQUIV_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"

#define EQ_MAX_STEPS 8

typedef struct {
    cai_model_family family;
    int steps;        /* N */
    int global_batch; /* sequences per step over all ranks */
    int T;
    int dp, stage, offload, grad_accum;
    int tp;       /* 0 means 1 */
    int heads_x2; /* 1: twice the heads (8 query, 4 key/value for Llama), so tp = 4 splits them */
    size_t bucket_bytes;
    cai_dtype param_dtype;
    int recompute;
    int hysteresis;   /* f16 rows: loss-scale hysteresis */
    int layers;       /* 0: 2 */
    int reduce_only;  /* stage 0: the engine reduces, a cai_optim_t over the model steps */
    int seq_parallel; /* tp > 1: split-gather sequence parallelism */
    int ref_micro;    /* microbatches the reference cuts the global batch into; 0 means 1 */
    int reduce_fp8;   /* stages 2/3: gradients cross the wire as FP8 (cai_zero_config.reduce_fp8) */
} eq_row;

typedef struct {
    double loss[EQ_MAX_STEPS];
    double norm[EQ_MAX_STEPS];
    float scale[EQ_MAX_STEPS];
    int skipped[EQ_MAX_STEPS];
    float *params; /* every held parameter's F32 values, registration order */
    size_t n;
} eq_result;

static inline void eq_result_free(eq_result *r) {
    free(r->params);
    r->params = NULL;
}

static inline cai_model_config eq_model_config(const eq_row *row) {
    cai_model_config c = cai_model_config_default(row->family);
    c.vocab_size = 61;
    c.vocab_multiple = 16;
    c.n_layers = row->layers ? row->layers : 2;
    c.d_model = 32;
    c.n_heads = row->heads_x2 ? 8 : 4;
    c.n_kv_heads = (row->family == CAI_MODEL_LLAMA ? 2 : 4) * (row->heads_x2 ? 2 : 1);
    c.ffn_hidden = row->family == CAI_MODEL_LLAMA ? 64 : 0;
    c.max_seq_len = row->T;
    c.seed = 20240601;
    c.param_dtype = row->param_dtype;
    c.activation_checkpointing = row->recompute;
    return c;
}

static inline cai_adamw_config eq_adamw(void) {
    cai_adamw_config o = cai_adamw_config_default();
    o.schedule.lr = 1e-2f;
    o.schedule.warmup_steps = 2;
    o.weight_decay = 0.1f;
    o.grad_clip = 0.5f; /* active at these norms: clipping is part of what must match */
    /* AdamW turns a gradient at rounding level into an lr-sized step whose
     * sign the rounding picks (m / sqrt(v) ~ +-1); eps 1e-4 keeps such
     * elements near still, so a comparison after 8 steps measures the
     * layouts, not the last bits of near-zero gradients (at 1e-6 the
     * Llama rows' gradient norms moved by up to 8e-5 by step 8 under tp or
     * an 8-layer dp reduction while their losses stayed within 3e-7) */
    o.eps = 1e-4f;
    return o;
}

/* Token and next-token target of sequence `s` (global index) of step
 * `step`: a function of the indices only, so any split of the batch sees the
 * same data. */
static inline void eq_sequence(const eq_row *row, int step, int s, int32_t *tok, int32_t *tgt) {
    uint64_t id = (uint64_t)step * 1000 + (uint64_t)s;
    for (int t = 0; t < row->T; t++) tok[t] = (int32_t)(cai_rng_uniform(91, id, (uint64_t)t) * 61) % 61;
    for (int t = 0; t < row->T; t++)
        tgt[t] = t + 1 < row->T ? tok[t + 1] : (int32_t)(cai_rng_uniform(92, id, 0) * 61) % 61;
}

static inline cai_status eq_collect_model(cai_model_t *m, eq_result *out) {
    const cai_registry_t *reg = cai_model_registry(m);
    size_t n = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) n += cai_registry_param(reg, i)->numel;
    out->params = calloc(n, sizeof(float));
    if (!out->params) return CAI_ERROR(CAI_ERR_NOMEM, "harness: params");
    out->n = n;
    size_t pos = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        cai_tensor w;
        CAI_CALL(cai_model_param(m, cai_registry_param(reg, i)->name, &w, NULL));
        memcpy(out->params + pos, w.data, (size_t)cai_tensor_numel(&w) * sizeof(float));
        pos += (size_t)cai_tensor_numel(&w);
    }
    return CAI_OK;
}

/* The reference: one process, the global batch as ref_micro microbatches
 * (default one), cai_train_step over the single-process driver (no engine,
 * no mesh). Not collective. */
static inline cai_status eq_run_reference(const eq_row *row, eq_result *out) {
    memset(out, 0, sizeof *out);
    cai_device_t *dev = NULL;
    cai_model_t *m = NULL;
    cai_optim_t *o = NULL;
    cai_status st = CAI_OK;
    int G = row->global_batch, T = row->T, micro = row->ref_micro > 0 ? row->ref_micro : 1;
    int32_t *tok = malloc((size_t)G * T * sizeof *tok), *tgt = malloc((size_t)G * T * sizeof *tgt);
    cai_model_config c = eq_model_config(row);
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = G / micro;
    mo.seq_len = T;
    cai_adamw_config oc = eq_adamw();
    CAI_CALL_GOTO(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1), st, done);
    CAI_CALL_GOTO(cai_model_create(&m, dev, &c, &mo), st, done);
    CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_local_driver(m, o, &drv), st, done);
    for (int step = 0; step < row->steps; step++) {
        for (int s = 0; s < G; s++) eq_sequence(row, step, s, tok + (size_t)s * T, tgt + (size_t)s * T);
        cai_step_stats ss;
        CAI_CALL_GOTO(cai_train_step(&drv, NULL, NULL, tok, tgt, micro, &ss), st, done);
        out->loss[step] = ss.loss;
        out->norm[step] = ss.grad_norm;
        out->scale[step] = 1.0f;
    }
    CAI_CALL_GOTO(eq_collect_model(m, out), st, done);
done:
    free(tok);
    free(tgt);
    cai_optim_free(o);
    cai_model_free(m);
    cai_device_free(dev);
    return st;
}

/* One process's own rounding floor for `row`, whose reference is `ref`: the
 * largest relative move of each step's loss (floor[0]) and gradient norm
 * (floor[1]) when the same batch is summed as 1 or 2 microbatches instead.
 * A layout compared against `ref` cannot be held closer than that. Not
 * collective. */
static inline cai_status eq_reference_floor(const eq_row *row, const eq_result *ref, double floor_[2][EQ_MAX_STEPS]) {
    memset(floor_, 0, 2 * EQ_MAX_STEPS * sizeof floor_[0][0]);
    for (int micro = 1; micro <= 2; micro++) {
        eq_row r = *row;
        r.ref_micro = micro;
        eq_result other;
        CAI_CALL(eq_run_reference(&r, &other));
        for (int s = 0; s < row->steps; s++) {
            floor_[0][s] = fmax(floor_[0][s], fabs(other.loss[s] - ref->loss[s]) / fabs(ref->loss[s]));
            floor_[1][s] = fmax(floor_[1][s], fabs(other.norm[s] - ref->norm[s]) / fabs(ref->norm[s]));
        }
        eq_result_free(&other);
    }
    return CAI_OK;
}

typedef cai_status (*eq_setup_fn)(void *ctx, cai_zero_t *z);

/* Parameter `index`'s global tensor from the tp shards (each rank passes
 * its own, `local`): gathered over the tp axis and placed by the registry's
 * shard of every tp rank. Collective over tp. */
static inline cai_status eq_gather_tp(cai_mesh_t *mesh, const cai_registry_t *reg, const cai_rank_view *view, int index,
                                      const float *local, float *global) {
    const int tp = view->tp_size;
    cai_param_shard sh;
    if (tp == 1) {
        CAI_CALL(cai_registry_shard(reg, index, view, &sh));
        memcpy(global, local, sh.local_numel * sizeof(float));
        return CAI_OK;
    }
    int counts[64], displs[64], total = 0;
    for (int r = 0; r < tp && r < 64; r++) {
        cai_rank_view v = *view;
        v.tp_rank = r;
        CAI_CALL(cai_registry_shard(reg, index, &v, &sh));
        counts[r] = (int)sh.local_numel;
        displs[r] = total;
        total += counts[r];
    }
    float *all = malloc((size_t)total * sizeof *all);
    if (!all) return CAI_ERROR(CAI_ERR_NOMEM, "harness: tp gather");
    MPI_Allgatherv(local, counts[view->tp_rank], MPI_FLOAT, all, counts, displs, MPI_FLOAT,
                   cai_mesh_comm(mesh, CAI_AXIS_TP));
    for (int r = 0; r < tp; r++) {
        cai_rank_view v = *view;
        v.tp_rank = r;
        cai_status st = cai_registry_shard(reg, index, &v, &sh);
        if (st != CAI_OK) {
            free(all);
            return st;
        }
        cai_shard_insert(&sh, sizeof(float), all + displs[r], global);
    }
    free(all);
    return CAI_OK;
}

/* The same training under `row`'s layout over `comm` (its size is
 * dp x tp; tp innermost). setup (may be NULL) sees the engine before the
 * first step (hooks). Collective over comm. */
static inline cai_status eq_run_layout(MPI_Comm comm, const eq_row *row, eq_setup_fn setup, void *setup_ctx,
                                       eq_result *out) {
    memset(out, 0, sizeof *out);
    int world = 0, rank = 0;
    MPI_Comm_size(comm, &world);
    MPI_Comm_rank(comm, &rank);
    const int tp = row->tp > 0 ? row->tp : 1;
    if (world % tp != 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "harness: %d ranks do not split into tp %d", world, tp);
    const int dp = world / tp, dp_rank = rank / tp;
    int G = row->global_batch, T = row->T, ga = row->grad_accum;
    if (G % (dp * ga) != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "harness: global batch %d does not split over dp %d x accum %d", G, dp,
                         ga);
    int B = G / (dp * ga), local = B * ga, first_seq = dp_rank * local;
    cai_device_t *dev = NULL;
    cai_mesh_t *mesh = NULL;
    cai_model_t *m = NULL;
    cai_zero_t *z = NULL;
    cai_optim_t *o = NULL;
    cai_status st = CAI_OK;
    int32_t *tok = malloc((size_t)local * T * sizeof *tok), *tgt = malloc((size_t)local * T * sizeof *tgt);
    float *shard = NULL;
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){1, dp, 1, 1, tp, NULL};
    mc.watchdog_timeout_s = 60;
    cai_zero_config zc;
    cai_zero_config_init(&zc);
    zc.stage = row->stage;
    zc.offload = row->offload;
    zc.bucket_bytes = row->bucket_bytes;
    zc.timeout_s = 60;
    zc.reduce_only = row->reduce_only;
    zc.reduce_fp8 = row->reduce_fp8;
    cai_model_config c = eq_model_config(row);
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = B;
    mo.seq_len = T;
    cai_zero_model_options(&zc, &mo);
    cai_adamw_config oc = eq_adamw();
    cai_loss_scaler scaler;
    cai_loss_scale_config lc = cai_loss_scale_config_default();
    if (row->hysteresis) lc.hysteresis = row->hysteresis;
    cai_loss_scaler_init(&scaler, &lc);
    CAI_CALL_GOTO(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1), st, done);
    CAI_CALL_GOTO(cai_mesh_init(&mesh, comm, &mc), st, done);
    mo.view.tp_size = tp;
    mo.view.tp_rank = cai_mesh_rank(mesh, CAI_AXIS_TP);
    mo.mesh = mesh;
    mo.seq_parallel = row->seq_parallel;
    CAI_CALL_GOTO(cai_model_create(&m, dev, &c, &mo), st, done);
    CAI_CALL_GOTO(cai_zero_create(&z, mesh, m, &zc), st, done);
    if (row->reduce_only) CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    if (setup) CAI_CALL_GOTO(setup(setup_ctx, z), st, done);
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_zero_driver(z, o, &drv), st, done);
    for (int step = 0; step < row->steps; step++) {
        for (int s = 0; s < local; s++) eq_sequence(row, step, first_seq + s, tok + (size_t)s * T, tgt + (size_t)s * T);
        cai_step_stats ss;
        CAI_CALL_GOTO(cai_train_step(&drv, &oc, row->param_dtype == CAI_DTYPE_F16 ? &scaler : NULL, tok, tgt, ga, &ss),
                      st, done);
        out->loss[step] = ss.loss;
        out->norm[step] = ss.grad_norm;
        out->scale[step] = ss.loss_scale;
        out->skipped[step] = ss.skipped;
    }
    const cai_registry_t *reg = cai_model_registry(m);
    size_t n = 0, biggest = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        n += cai_registry_param(reg, i)->numel;
        if (cai_registry_param(reg, i)->numel > biggest) biggest = cai_registry_param(reg, i)->numel;
    }
    out->params = calloc(n, sizeof(float));
    out->n = n;
    shard = malloc(biggest * sizeof *shard);
    size_t pos = 0;
    for (int i = 0; i < cai_registry_count(reg) && out->params && shard; i++) {
        CAI_CALL_GOTO(cai_zero_gather_param(z, i, shard), st, done);
        CAI_CALL_GOTO(eq_gather_tp(mesh, reg, cai_model_view(m), i, shard, out->params + pos), st, done);
        pos += cai_registry_param(reg, i)->numel;
    }
done:
    free(shard);
    free(tok);
    free(tgt);
    cai_optim_free(o);
    cai_zero_free(z);
    cai_model_free(m);
    if (mesh) cai_mesh_free(mesh);
    cai_device_free(dev);
    return st;
}

/* Compare; on a mismatch write a description into msg and return 0. */
static inline int eq_compare(const eq_row *row, const eq_result *ref, const eq_result *got, double loss_rtol,
                             double param_atol, char *msg, size_t cap, double *worst_loss, double *worst_param) {
    *worst_loss = *worst_param = 0;
    for (int s = 0; s < row->steps; s++) {
        double rl = fabs(got->loss[s] - ref->loss[s]) / fmax(fabs(ref->loss[s]), 1e-30);
        double rn = fabs(got->norm[s] - ref->norm[s]) / fmax(fabs(ref->norm[s]), 1e-30);
        *worst_loss = fmax(*worst_loss, fmax(rl, rn));
        if (!(rl <= loss_rtol) || !(rn <= loss_rtol)) {
            snprintf(msg, cap, "step %d: loss %.9g vs %.9g (rel %.3g), grad norm %.9g vs %.9g (rel %.3g)", s + 1,
                     got->loss[s], ref->loss[s], rl, got->norm[s], ref->norm[s], rn);
            return 0;
        }
    }
    if (got->n != ref->n || !got->params) {
        snprintf(msg, cap, "parameter count %zu vs %zu", got->n, ref->n);
        return 0;
    }
    size_t worst = 0;
    for (size_t i = 0; i < ref->n; i++) {
        double d = fabs((double)got->params[i] - (double)ref->params[i]);
        if (!(d <= *worst_param)) {
            *worst_param = d;
            worst = i;
        }
    }
    if (!(*worst_param <= param_atol)) {
        snprintf(msg, cap, "parameters after %d steps: element %zu is %.9g vs %.9g (|diff| %.3g > %.1g)", row->steps,
                 worst, got->params[worst], ref->params[worst], *worst_param, param_atol);
        return 0;
    }
    return 1;
}

static inline const char *eq_row_name(const eq_row *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%s tp=%d%s dp=%d stage=%d%s offload=%d accum=%d%s%s%s", cai_model_family_name(r->family),
             r->tp > 0 ? r->tp : 1, r->seq_parallel ? " sp=split_gather" : "", r->dp, r->stage,
             r->reduce_only ? " (reduce-only + cai_optim)" : "", r->offload, r->grad_accum,
             r->recompute ? " recompute" : "", r->param_dtype != CAI_DTYPE_F32 ? " " : "",
             r->param_dtype != CAI_DTYPE_F32 ? cai_dtype_name(r->param_dtype) : "");
    return buf;
}

/* What a matrix of rows adds up to on one rank: failures are collected,
 * not asserted at once, so that no rank leaves a collective early. */
typedef struct {
    char failures[8192];
    size_t used;
    int n_rows, n_bad;
    double worst_loss, worst_param;
} eq_tally;

/* One row's outcome: st is what eq_run_layout returned; on success `got`
 * is compared with `ref` (losses and norms within 1e-5 relative,
 * parameters within 1e-4). Frees got; prints the row when `print`. */
static inline void eq_tally_row(eq_tally *t, const eq_row *r, const eq_result *ref, cai_status st, eq_result *got,
                                double t0, int print, int rank) {
    char name[160], msg[256];
    eq_row_name(r, name, sizeof name);
    int ok = st == CAI_OK;
    double wl = 0, wp = 0;
    if (!ok) snprintf(msg, sizeof msg, "%s", cai_error_message());
    else ok = eq_compare(r, ref, got, 1e-5, 1e-4, msg, sizeof msg, &wl, &wp);
    cai_error_clear();
    eq_result_free(got);
    t->n_rows++;
    t->worst_loss = fmax(t->worst_loss, wl);
    t->worst_param = fmax(t->worst_param, wp);
    if (!ok) {
        t->n_bad++;
        int k = snprintf(t->failures + t->used, sizeof t->failures - t->used, "\n  [rank %d] %s: %s", rank, name, msg);
        if (k > 0 && (size_t)k < sizeof t->failures - t->used) t->used += (size_t)k;
    }
    if (print)
        fprintf(stderr, "  %-52s %s %6.3f s  loss/norm rel %.2g  params %.2g\n", name, ok ? "ok  " : "FAIL",
                MPI_Wtime() - t0, wl, wp);
}

#endif

/* The layout planner: every way of laying a model over np ranks, with the
 * memory planner's bytes and a step time predicted from measured costs
 * (docs/pipeline.md "Planner"). */
#include "cai_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/parallel.h"

void cai_plan_request_init(cai_plan_request *r) {
    memset(r, 0, sizeof *r);
    r->model = cai_model_config_default(CAI_MODEL_GPT2);
    r->ranks_per_node = 1;
    r->cores = 1;
    r->max_virtual = 4;
    r->run_styles =
        1u << CAI_PP_GPIPE | 1u << CAI_PP_1F1B | 1u << CAI_PP_INTERLEAVED | 1u << CAI_PP_ZB_H1 | 1u << CAI_PP_ZB_V;
    r->run_pp_zero = 1;
    r->costs.tokens = 1;
    r->costs.concurrency = 1;
    r->costs.threads = 1;
}

/* ------------------------------------------------------------------ measuring */

typedef struct {
    int last;                  /* the head's unit */
    double t0, fwd[2], bwd[2]; /* [0]: the blocks, [1]: embedding and head */
} unit_clock;

/* Units of a first-and-last stage: 0 the embedding, the blocks, the head. */
static cai_status clock_hook(void *ctx, cai_model_t *m, cai_model_event ev, int unit) {
    (void)m;
    unit_clock *c = ctx;
    const double now = cai_time_now();
    const int k = unit == 0 || unit == c->last;
    if (ev == CAI_MODEL_PRE_FORWARD || ev == CAI_MODEL_PRE_BACKWARD) c->t0 = now;
    else (ev == CAI_MODEL_POST_FORWARD ? c->fwd : c->bwd)[k] += now - c->t0;
    return CAI_OK;
}

/* AdamW over the model's own flat buffers, with moments of that size. */
static cai_status time_adamw(cai_device_t *dev, cai_model_t *m, int iters, double *per_elem) {
    cai_tensor p, g, lowp;
    cai_model_flat(m, &p, &g, &lowp);
    const int64_t n = cai_tensor_numel(&p);
    float *mv = NULL;
    CAI_CALL(cai_device_alloc(dev, 2 * (size_t)n * sizeof(float), "plan measurement moments", (void **)&mv));
    cai_tensor tm = cai_tensor_1d(dev, mv, CAI_DTYPE_F32, n), tv = cai_tensor_1d(dev, mv + n, CAI_DTYPE_F32, n);
    cai_tensor tp = cai_tensor_1d(dev, p.data, CAI_DTYPE_F32, n), tg = cai_tensor_1d(dev, g.data, CAI_DTYPE_F32, n);
    cai_adamw_params ap = {1e-9f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
    cai_status st = CAI_OK;
    double t0 = 0;
    for (int it = 0; it <= iters && st == CAI_OK; it++) {
        if (it == 1) t0 = cai_time_now();
        ap.step = it + 1;
        st = dev->ops->adamw(dev, &tp, &tg, &tm, &tv, NULL, &ap, 1);
    }
    if (st == CAI_OK) st = cai_device_sync(dev);
    *per_elem = (cai_time_now() - t0) / iters / (double)n;
    cai_device_dealloc(dev, mv);
    return st;
}

/* Microbatches whose forwards run before their backwards in the
 * measurement: a backward then reads activations written several
 * forwards earlier, as in a pipeline holding microbatches in flight or the
 * first layers of a deep stage, and it runs slower than right after its
 * own forward would (bench/RESULTS.md, "Pipeline: measured bubble"). */
#define PLAN_STASH 4

/* PLAN_STASH forwards, one into each activation slot. */
static cai_status stash_forwards(cai_model_t *m, const int32_t *tok, size_t n) {
    for (int k = 0; k < PLAN_STASH; k++) {
        CAI_CALL(cai_model_select(m, 0, k));
        CAI_CALL(cai_model_forward_train(m, tok, tok + n, 1.0f, NULL));
    }
    return CAI_OK;
}

/* `iters` rounds of PLAN_STASH forwards, then their backwards. */
static cai_status passes(cai_model_t *m, const int32_t *tok, size_t n, int iters) {
    for (int it = 0; it < iters; it++) {
        CAI_CALL(stash_forwards(m, tok, n));
        for (int k = 0; k < PLAN_STASH; k++) {
            CAI_CALL(cai_model_select(m, 0, k));
            CAI_CALL(cai_model_backward(m, 1.0f));
        }
    }
    return cai_device_sync(cai_model_device(m));
}

/* `iters` rounds of PLAN_STASH forwards, their input passes, then their
 * weight passes (a split backward, as zb-h1 and zb-v run it): the seconds
 * the weight passes take a round. */
static cai_status split_passes(cai_model_t *m, const int32_t *tok, size_t n, int iters, double *weight) {
    *weight = 0;
    for (int it = 0; it < iters; it++) {
        CAI_CALL(stash_forwards(m, tok, n));
        for (int k = 0; k < PLAN_STASH; k++) {
            CAI_CALL(cai_model_select(m, 0, k));
            CAI_CALL(cai_model_backward_input(m, 1.0f));
        }
        CAI_CALL(cai_device_sync(cai_model_device(m)));
        const double t0 = cai_time_now();
        for (int k = 0; k < PLAN_STASH; k++) {
            CAI_CALL(cai_model_select(m, 0, k));
            CAI_CALL(cai_model_backward_weight(m));
        }
        CAI_CALL(cai_device_sync(cai_model_device(m)));
        *weight += cai_time_now() - t0;
    }
    return CAI_OK;
}

/* Even world ranks run passes while odd ones wait for a message from them
 * in the same wait loop a pipeline rank idles in: the seconds per pass of
 * the computing half, averaged over the world. */
static cai_status time_half_waiting(cai_mesh_t *mesh, cai_model_t *m, const int32_t *tok, size_t n, int iters,
                                    double *per_pass) {
    const int r = cai_mesh_rank(mesh, CAI_AXIS_WORLD), size = cai_mesh_size(mesh, CAI_AXIS_WORLD);
    double t[2] = {0, 0}, one = 0;
    cai_request_t *req = NULL;
    CAI_CALL(cai_barrier(mesh, CAI_AXIS_WORLD));
    if (r % 2 == 0) {
        const double t0 = cai_time_now();
        CAI_CALL(passes(m, tok, n, iters));
        t[0] = (cai_time_now() - t0) / iters / PLAN_STASH;
        t[1] = 1;
        if (r + 1 < size) {
            CAI_CALL(cai_isend(mesh, CAI_AXIS_WORLD, &one, 1, CAI_DTYPE_F64, r + 1, 7, &req));
            CAI_CALL(cai_wait(req));
        }
    } else {
        CAI_CALL(cai_irecv(mesh, CAI_AXIS_WORLD, &one, 1, CAI_DTYPE_F64, r - 1, 7, &req));
        CAI_CALL(cai_wait(req));
    }
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_WORLD, t, t, 2, CAI_DTYPE_F64, CAI_RED_SUM));
    *per_pass = t[0] / t[1];
    return CAI_OK;
}

cai_status cai_plan_measure_compute(cai_device_t *dev, cai_mesh_t *mesh, const cai_model_config *model, int layers,
                                    int micro_batch, int seq_len, int iters, cai_plan_costs *out) {
    CAI_CHECK_ARG(dev && model && out, "cai_plan_measure_compute: NULL argument");
    CAI_CHECK_ARG(layers >= 1 && micro_batch >= 1 && seq_len >= 1 && iters >= 1,
                  "plan measurement: layers=%d, micro_batch=%d, seq_len=%d, iters=%d must be >= 1", layers, micro_batch,
                  seq_len, iters);
    cai_model_config c = *model;
    c.n_layers = layers;
    c.max_seq_len = seq_len;
    c.activation_checkpointing = 0;
    cai_model_config rc;
    CAI_CALL(cai_model_config_resolve(&c, &rc));
    cai_model_options mo = cai_model_options_default(&rc);
    mo.batch = micro_batch;
    mo.seq_len = seq_len;
    mo.act_slots = PLAN_STASH;
    mo.split_backward = 1;
    const size_t n = (size_t)micro_batch * (size_t)seq_len;
    int32_t *tok = NULL;
    cai_model_t *m = NULL;
    unit_clock clk;
    memset(&clk, 0, sizeof clk);
    cai_status st = CAI_OK;
    CAI_CALL(cai_malloc((void **)&tok, 2 * n * sizeof *tok, "plan measurement tokens"));
    for (size_t i = 0; i < 2 * n; i++)
        tok[i] = (int32_t)(cai_rng_uniform(7, 1, i) * (float)rc.vocab_size) % rc.vocab_size;
    CAI_CALL_GOTO(cai_model_create(&m, dev, &rc, &mo), st, done);
    if (cai_model_unit_count(m) != layers + 2) {
        st = CAI_ERROR(CAI_ERR_INTERNAL, "plan measurement: a %d-layer model has %d units, expected %d", layers,
                       cai_model_unit_count(m), layers + 2);
        goto done;
    }
    clk.last = layers + 1;
    /* Every rank starts timing together, so the cores are shared all along. */
    if (mesh) CAI_CALL_GOTO(cai_barrier(mesh, CAI_AXIS_WORLD), st, done);
    CAI_CALL_GOTO(passes(m, tok, n, 1), st, done); /* warms caches and pages */
    CAI_CALL_GOTO(cai_model_add_hook(m, clock_hook, &clk), st, done);
    const double t_all = cai_time_now();
    CAI_CALL_GOTO(passes(m, tok, n, iters), st, done);
    out->pass_all = (cai_time_now() - t_all) / iters / PLAN_STASH;
    out->pass_half = 0;
    CAI_CALL_GOTO(cai_model_remove_hook(m, clock_hook, &clk), st, done);
    if (mesh && cai_mesh_size(mesh, CAI_AXIS_WORLD) >= 2) {
        CAI_CALL_GOTO(time_half_waiting(mesh, m, tok, n, iters, &out->pass_half), st, done);
        double a = out->pass_all;
        CAI_CALL_GOTO(cai_allreduce(mesh, CAI_AXIS_WORLD, &a, &a, 1, CAI_DTYPE_F64, CAI_RED_AVG), st, done);
        out->pass_all = a;
    }
    if (mesh) CAI_CALL_GOTO(cai_barrier(mesh, CAI_AXIS_WORLD), st, done);
    double weight = 0;
    CAI_CALL_GOTO(split_passes(m, tok, n, iters, &weight), st, done);
    if (mesh) CAI_CALL_GOTO(cai_barrier(mesh, CAI_AXIS_WORLD), st, done);
    CAI_CALL_GOTO(time_adamw(dev, m, iters, &out->adamw), st, done);
    const double per = (double)iters * PLAN_STASH;
    double t[6] = {clk.fwd[0] / per / layers, clk.bwd[0] / per / layers, clk.fwd[1] / per, clk.bwd[1] / per, out->adamw,
                   weight / per / layers};
    if (mesh) {
        CAI_CALL_GOTO(cai_allreduce(mesh, CAI_AXIS_WORLD, t, t, 6, CAI_DTYPE_F64, CAI_RED_AVG), st, done);
    }
    out->block_f = t[0];
    out->block_b = t[1];
    out->head_f = t[2];
    out->head_b = t[3];
    out->adamw = t[4];
    /* the weight pass's share, at most the fused backward it is part of */
    out->block_w = fmin(t[5], 0.9 * t[1]);
    out->tokens = (int)n;
done:
    cai_model_free(m);
    cai_free(tok);
    return st;
}

cai_status cai_plan_measure_comm(cai_mesh_t *mesh, cai_plan_costs *out) {
    CAI_CHECK_ARG(mesh && out, "cai_plan_measure_comm: NULL argument");
    const int n = cai_mesh_size(mesh, CAI_AXIS_DP);
    CAI_CHECK_ARG(n >= 2, "plan: measuring links needs at least 2 ranks on the dp axis (got %d)", n);
    cai_bench_result small, big;
    CAI_CALL(cai_mesh_bench(mesh, CAI_AXIS_DP, CAI_BENCH_ALLREDUCE, 4096, 3, 20, 0, &small));
    CAI_CALL(cai_mesh_bench(mesh, CAI_AXIS_DP, CAI_BENCH_ALLREDUCE, 16u << 20, 1, 4, 0, &big));
    out->latency = small.time_us * 1e-6;
    /* busbw of a ring: the bytes each link carries over the time, less the latency. */
    const double t = big.time_us * 1e-6 - out->latency;
    out->bandwidth = t > 0 ? 2.0 * (n - 1) / n * (double)big.bytes / t : big.busbw_gbs * 1e9;
    return CAI_OK;
}

/* ------------------------------------------------------------------ the cost model */

/* A ring collective over n ranks moving `factor` x bytes through each link. */
static double coll_time(const cai_plan_costs *k, int n, double factor, double bytes) {
    if (n <= 1) return 0;
    return k->latency + factor * (n - 1) / n * bytes / k->bandwidth;
}

typedef struct {
    int n_layers, d_model;
    double params;       /* global parameter elements */
    int heads, kv_heads; /* for divisibility */
    cai_model_config rc; /* resolved */
} model_facts;

/* The share of a processor a rank waiting in MPI takes from computing
 * ones: with half the ranks waiting, the others ran pass_half per pass
 * against pass_all with all computing. 0 when not measured or when the
 * computing half had a processor each anyway. */
static double wait_share(const cai_plan_costs *k, double slots) {
    const double K = k->concurrency;
    if (!(k->pass_half > 0 && k->pass_all > 0) || K / 2 <= slots) return 0;
    const double alone = k->pass_all * fmin(1.0, slots / K); /* linear sharing when all compute */
    const double rate = alone / k->pass_half;
    const double w = rate < 1 ? 2.0 * slots / (K * rate) - 1.0 : 0;
    return w < 0 ? 0 : w > 1 ? 1 : w;
}

/* Forward and backward of every global stage (its layers, the head on the
 * last), tp collectives included (tp_f, tp_b of them), uncontended. */
static void stage_costs(const cai_plan_request *q, const model_facts *mf, const cai_plan_entry *e, double alone,
                        double *f, double *b, double *w, double *tp_f, double *tp_b) {
    const cai_plan_costs *k = &q->costs;
    const double scale = (double)e->micro_batch * q->seq_len / k->tokens / alone;
    const int S = e->pp * e->virtual_stages, L = mf->n_layers / S;
    const double bf = k->block_f * scale / e->tp, bb = k->block_b * scale / e->tp;
    const double hf = k->head_f * scale / e->tp, hb = k->head_b * scale / e->tp;
    /* a split backward: the blocks' weight passes apart (the head's stay in the input pass) */
    const int split = e->pp > 1 && (e->style == CAI_PP_ZB_H1 || e->style == CAI_PP_ZB_V);
    const double bw = split ? k->block_w * scale / e->tp : 0;
    /* Megatron's per block: 2 all-reduces of [B,T,C] forward, 2 backward, 2
     * more in the checkpointed re-forward; the embedding 1 forward. */
    const double ar = coll_time(k, e->tp, 2.0, (double)e->micro_batch * q->seq_len * mf->d_model * 4.0);
    for (int st = 0; st < S; st++) {
        const int last = st == S - 1;
        tp_f[st] = L * 2 * ar + (st == 0 ? ar : 0);
        tp_b[st] = L * (2 + (e->ckpt ? 2 : 0)) * ar;
        f[st] = L * bf + (last ? hf : 0) + tp_f[st];
        b[st] = L * (bb + (e->ckpt ? bf : 0)) + (last ? hb : 0) + tp_b[st];
        w[st] = L * bw;
    }
}

/* The schedule run with every rank's own stage costs on `cap` processors
 * shared by the ranks that have work (processor sharing: each of n such
 * ranks runs at min(1, cap / (n + wait x the others)) of its own speed; a
 * rank waiting in MPI polls, taking `wait` of a rank's share). Between
 * ranks of one node (`shared`: the executor's node-shared boundaries) the
 * sender copies the tensor at its SEND and it arrives `comm` later;
 * otherwise a message moves only while its sender is inside MPI (host MPI
 * has no progress thread; the executor tests its messages between layers,
 * which moves a fragment of a large one): it arrives `comm` after the
 * sender ends its next compute, waits for a message of its own, or ends its
 * list. *makespan: the end of the last compute. The lists were checked by cai_pp_schedule_check, so a
 * rank that waits always has a message coming. */
/* Rank r's sends still moving arrive at `when`; 1 when there were any. */
static int deliver(int *sender, double *arrive, int n_tags, int r, double when) {
    int any = 0;
    for (int t = 0; t < n_tags; t++)
        if (sender[t] == r + 1) {
            sender[t] = 0;
            arrive[t] = when;
            any = 1;
        }
    return any;
}

static cai_status shared_makespan(const cai_pp_schedule *s, const double *f, const double *b, const double *w,
                                  double comm, int shared, double cap, double wait, double *makespan) {
    const cai_pp_spec *sp = cai_pp_schedule_spec(s);
    const int P = sp->pp, n_tags = 2 * sp->microbatches * sp->pp * sp->virtual_stages;
    int *pos = NULL, *sender = NULL;
    double *rem = NULL, *arrive = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_calloc((void **)&pos, (size_t)P, sizeof *pos, "plan simulation"));
    CAI_CALL_GOTO(cai_calloc((void **)&sender, (size_t)n_tags, sizeof *sender, "plan simulation"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&rem, (size_t)P * sizeof *rem, "plan simulation"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&arrive, (size_t)n_tags * sizeof *arrive, "plan simulation"), st, done);
    for (int r = 0; r < P; r++) rem[r] = -1;
    for (int t = 0; t < n_tags; t++) arrive[t] = -1;
    double now = 0;
    for (;;) {
        int changed = 1, running = 0, left = 0;
        while (changed) {
            changed = 0;
            for (int r = 0; r < P; r++) {
                const cai_pp_action *list = cai_pp_schedule_actions(s, r);
                while (pos[r] < cai_pp_schedule_len(s, r)) {
                    const cai_pp_action *a = &list[pos[r]];
                    if (a->op == CAI_PP_SEND_ACT || a->op == CAI_PP_SEND_GRAD) {
                        if (shared) arrive[cai_pp_action_tag(sp, r, a)] = now + comm;
                        else sender[cai_pp_action_tag(sp, r, a)] = r + 1;
                    } else if (a->op == CAI_PP_RECV_ACT || a->op == CAI_PP_RECV_GRAD) {
                        const double t = arrive[cai_pp_action_tag(sp, r, a)];
                        if (t < 0 || t > now) {
                            changed |= deliver(sender, arrive, n_tags, r, now + comm);
                            break;
                        }
                    } else {
                        if (rem[r] < 0) {
                            const int stage = cai_pp_stage_of(sp, r, a->chunk);
                            rem[r] = a->op == CAI_PP_FORWARD           ? f[stage]
                                     : a->op == CAI_PP_BACKWARD_WEIGHT ? w[stage]
                                     : a->op == CAI_PP_BACKWARD_INPUT  ? b[stage] - w[stage]
                                                                       : b[stage];
                        }
                        break;
                    }
                    pos[r]++;
                    changed = 1;
                }
                if (pos[r] == cai_pp_schedule_len(s, r)) changed |= deliver(sender, arrive, n_tags, r, now + comm);
            }
        }
        double wake = INFINITY;
        for (int r = 0; r < P; r++) {
            if (pos[r] == cai_pp_schedule_len(s, r)) continue;
            left++;
            if (rem[r] >= 0) {
                running++;
                continue;
            }
            const double t = arrive[cai_pp_action_tag(sp, r, &cai_pp_schedule_actions(s, r)[pos[r]])];
            if (t > now && t < wake) wake = t;
        }
        if (!left) break;
        const double rate = running ? fmin(1.0, cap / (running + wait * (P - running))) : 0;
        double dt = wake - now;
        int first = -1;
        for (int r = 0; r < P; r++)
            if (rem[r] >= 0 && rem[r] / rate < dt) {
                dt = rem[r] / rate;
                first = r;
            }
        if (!isfinite(dt)) {
            st = CAI_ERROR(CAI_ERR_INTERNAL, "plan: the shared-core simulation of %s stalled at t=%g",
                           cai_pp_style_name(sp->style), now);
            goto done;
        }
        now += dt;
        for (int r = 0; r < P; r++) {
            if (rem[r] < 0) continue;
            rem[r] = r == first ? 0 : rem[r] - rate * dt;
            if (rem[r] <= 1e-12 * (1 + now)) {
                rem[r] = -1;
                pos[r]++;
                deliver(sender, arrive, n_tags, r, now + comm);
            }
        }
    }
    *makespan = now;
done:
    cai_free(pos);
    cai_free(sender);
    cai_free(rem);
    cai_free(arrive);
    return st;
}

/* dp gradient reduction and ZeRO traffic of one step over `elems` local
 * flat elements (f32 on the wire): stage 0/1 an all-reduce's bytes (1: a
 * reduce-scatter and the weights' all-gather), stage 2 a reduce-scatter
 * per microbatch, stage 3 also two weight gathers per microbatch. */
static double dp_time(const cai_plan_costs *k, const cai_plan_entry *e, double elems) {
    const double B = elems * 4.0;
    if (e->dp <= 1) return 0;
    switch (e->zero) {
    case 0:
    case 1: return coll_time(k, e->dp, 2.0, B);
    case 2: return e->microbatches * coll_time(k, e->dp, 1.0, B) + coll_time(k, e->dp, 1.0, B);
    default: return 3.0 * e->microbatches * coll_time(k, e->dp, 1.0, B);
    }
}

/* Memory of the largest pipeline rank and the schedule's time. */
static cai_status evaluate(const cai_plan_request *q, const model_facts *mf, cai_plan_entry *e) {
    cai_pp_spec spec = {e->pp, e->virtual_stages, e->microbatches, e->pp > 1 ? e->style : CAI_PP_1F1B};
    cai_pp_schedule *s = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_pp_schedule_build(&spec, &s));
    cai_mem_plan_request r;
    memset(&r, 0, sizeof r);
    r.model = mf->rc;
    r.model.activation_checkpointing = e->ckpt;
    r.batch = e->micro_batch;
    r.seq_len = q->seq_len;
    r.dp = e->dp;
    cai_zero_config_init(&r.zero);
    r.zero.stage = e->zero;
    r.dev = q->dev;
    r.fp8 = q->fp8;
    r.pp_microbatches = e->pp > 1 ? e->microbatches : 0;
    r.pp_split = e->pp > 1 && (e->style == CAI_PP_ZB_H1 || e->style == CAI_PP_ZB_V);
    /* the executor's choice (cai_pipeline_boundaries_shared) for a job on one node */
    const char *transport = NULL;
    CAI_CALL_GOTO(cai_knob_str("CAI_PP_HOST_TRANSPORT", &transport), st, done);
    r.pp_shared = e->pp > 1 && q->dev && q->dev->kind == CAI_DEVICE_HOST && q->ranks_per_node >= q->np &&
                  strcmp(transport, "shm") == 0;
    double elems = 0;
    e->bytes = 0;
    /* The first and the last pipeline rank: a middle one holds as many
     * layers as they do, no embedding or head, and no more in flight; over
     * MPI messages it keeps four boundary buffers per microbatch where they
     * keep two, so the second rank is planned too. */
    const int ranks[3] = {0, e->pp - 1, 1}, n_ranks = e->pp == 1 ? 1 : e->pp == 2 || r.pp_shared ? 2 : 3;
    for (int ri = 0; ri < n_ranks; ri++) {
        const int rank = ranks[ri];
        r.view = cai_rank_view_single();
        r.view.tp_size = e->tp;
        r.view.pp_size = e->pp;
        r.view.pp_rank = rank;
        r.view.pp_chunks = e->virtual_stages;
        r.view.pp_vshape = e->pp > 1 && e->style == CAI_PP_ZB_V;
        r.pp_inflight = e->pp > 1 ? cai_pp_schedule_peak_inflight(s, rank) : 1;
        cai_mem_plan p;
        CAI_CALL_GOTO(cai_mem_plan_compute(&r, &p), st, done);
        const size_t bytes = p.device + p.host;
        if (bytes > e->bytes) {
            e->bytes = bytes;
            e->bytes_rank = rank;
            e->inflight = r.pp_inflight;
        }
        if ((double)p.n_flat > elems) elems = (double)p.n_flat;
    }
    /* Cores: the measured times are for `concurrency` ranks sharing the
     * node's; a rank alone runs `alone` times faster. The planned job's
     * ranks_per_node share it: all of them in the optimizer step, in the
     * pipeline those that have work at the time. */
    const cai_plan_costs *k = &q->costs;
    const double slots = (double)q->cores / (k->threads > 0 ? k->threads : 1);
    const double alone = fmax(1.0, k->concurrency / slots);
    const double share = fmax(1.0, q->ranks_per_node / slots);
    const double w = wait_share(k, slots);
    const int S = e->pp * e->virtual_stages;
    double *f = NULL;
    CAI_CALL_GOTO(cai_malloc((void **)&f, 5 * (size_t)S * sizeof *f, "plan stage costs"), st, done);
    double *b = f + S, *wp = b + S, *tp_f = wp + S, *tp_b = tp_f + S;
    stage_costs(q, mf, e, alone, f, b, wp, tp_f, tp_b);
    const double act_bytes = (double)e->micro_batch * q->seq_len * mf->d_model * 4.0;
    const double comm = e->pp > 1 ? k->latency + act_bytes / k->bandwidth : 0;
    cai_pp_costs pc = {f[S - 1], b[S - 1] - wp[S - 1], wp[S - 1], comm};
    double span = 0;
    st = cai_pp_schedule_check(s, &pc, NULL);
    /* the mesh puts pp outermost: its ranks share a node when the whole job does */
    const int shared = q->ranks_per_node >= q->np;
    if (st == CAI_OK) st = shared_makespan(s, f, b, wp, comm, shared, slots * e->pp / q->ranks_per_node, w, &span);
    /* The busiest rank's own compute and collectives. */
    e->t_work = e->t_tp = 0;
    for (int rank = 0; rank < e->pp && st == CAI_OK; rank++) {
        double w = 0, t = 0;
        for (int c = 0; c < e->virtual_stages; c++) {
            const int stage = cai_pp_stage_of(&spec, rank, c);
            w += (f[stage] + b[stage] - tp_f[stage] - tp_b[stage]) * e->microbatches;
            t += (tp_f[stage] + tp_b[stage]) * e->microbatches;
        }
        if (w + t > e->t_work + e->t_tp) {
            e->t_work = w;
            e->t_tp = t;
        }
    }
    cai_free(f);
    if (st != CAI_OK) goto done;
    e->t_pipe = span - e->t_work - e->t_tp;
    /* AdamW over the rank's shard (stage >= 1: 1/dp of it), every rank at once. */
    const double shard = e->zero >= 1 ? elems / e->dp : elems;
    e->t_opt = shard * k->adamw / alone * share;
    e->t_dp = dp_time(k, e, elems);
    /* A tied embedding and head on two stages exchange their gradients after the pipeline. */
    if (e->pp > 1 && mf->rc.tie_embeddings)
        e->t_dp +=
            k->latency + (double)cai_model_config_padded_vocab(&mf->rc) / e->tp * mf->d_model * 4.0 / k->bandwidth;
    e->time = span + e->t_opt + e->t_dp;
done:
    cai_pp_schedule_free(s);
    return st;
}

/* ------------------------------------------------------------------ enumeration */

typedef struct {
    cai_plan_entry *e;
    int n, cap;
} entry_list;

static cai_status push(entry_list *l, const cai_plan_entry *e) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        cai_plan_entry *ne = NULL;
        CAI_CALL(cai_malloc((void **)&ne, (size_t)cap * sizeof *ne, "plan layouts"));
        if (l->n) memcpy(ne, l->e, (size_t)l->n * sizeof *ne);
        cai_free(l->e);
        l->e = ne;
        l->cap = cap;
    }
    l->e[l->n++] = *e;
    return CAI_OK;
}

/* Why (dp, tp, pp) cannot hold the model or the batch, or "" when it can. */
static void indivisible(const cai_plan_request *q, const model_facts *mf, int dp, int tp, int pp, char *why,
                        size_t cap) {
    why[0] = 0;
    if (mf->heads % tp) snprintf(why, cap, "model.n_heads=%d is not divisible by tp=%d", mf->heads, tp);
    else if (mf->kv_heads % tp) snprintf(why, cap, "model.n_kv_heads=%d is not divisible by tp=%d", mf->kv_heads, tp);
    else if (mf->rc.ffn_hidden % tp)
        snprintf(why, cap, "model.ffn_hidden=%d is not divisible by tp=%d", mf->rc.ffn_hidden, tp);
    else if (mf->n_layers % pp) snprintf(why, cap, "model.n_layers=%d is not divisible by pp=%d", mf->n_layers, pp);
    else if (q->global_batch % dp)
        snprintf(why, cap, "plan.global_batch=%d is not divisible by dp=%d", q->global_batch, dp);
    else if (q->micro_batch && q->global_batch % (dp * q->micro_batch))
        snprintf(why, cap, "plan.global_batch=%d is not divisible by dp=%d x plan.micro_batch=%d", q->global_batch, dp,
                 q->micro_batch);
}

static int runs(const cai_plan_request *q, const cai_plan_entry *e, char *why, size_t cap) {
    if (e->pp > 1 && !(q->run_styles & (1u << e->style))) {
        snprintf(why, cap, "fits, but colossal-pretrain does not run the %s schedule yet", cai_pp_style_name(e->style));
        return 0;
    }
    if (e->pp > 1 && e->zero > q->run_pp_zero) {
        snprintf(why, cap, "fits, but colossal-pretrain does not run ZeRO stage %d with pipelines yet (stage <= %d)",
                 e->zero, q->run_pp_zero);
        return 0;
    }
    return 1;
}

static cai_status add_layout(const cai_plan_request *q, const model_facts *mf, cai_plan_entry *e, entry_list *l) {
    CAI_CALL(evaluate(q, mf, e));
    const double mib = 1048576.0;
    if (q->mem_limit && e->bytes > q->mem_limit) {
        e->verdict = CAI_PLAN_OVER_MEMORY;
        snprintf(e->reason, sizeof e->reason, "does not fit: %.1f MiB on pp rank %d is %.1f MiB over the limit",
                 e->bytes / mib, e->bytes_rank, (e->bytes - q->mem_limit) / mib);
    } else if (!runs(q, e, e->reason, sizeof e->reason)) {
        e->verdict = CAI_PLAN_NOT_RUN;
    } else {
        e->verdict = CAI_PLAN_FITS;
    }
    return push(l, e);
}

/* Every schedule, chunk count, ZeRO stage and recompute choice of one
 * (dp, tp, pp, microbatch size). */
static cai_status add_shapes(const cai_plan_request *q, const model_facts *mf, int dp, int tp, int pp, int mb,
                             entry_list *l) {
    const int m = q->global_batch / (dp * mb);
    cai_pp_style styles[] = {CAI_PP_1F1B, CAI_PP_GPIPE, CAI_PP_INTERLEAVED, CAI_PP_ZB_H1, CAI_PP_ZB_V};
    const int n_styles = pp > 1 ? 5 : 1;
    for (int si = 0; si < n_styles; si++) {
        const int vmin = cai_pp_style_default_virtual(styles[si]);
        const int vmax = styles[si] == CAI_PP_INTERLEAVED ? q->max_virtual : vmin;
        /* a split backward's weight passes read every layer's activations: no recompute */
        const int zb = styles[si] == CAI_PP_ZB_H1 || styles[si] == CAI_PP_ZB_V;
        for (int v = vmin; v <= vmax; v++) {
            if (mf->n_layers % (pp * v)) continue;
            if (styles[si] == CAI_PP_INTERLEAVED && m % pp) continue;
            for (int z = 0; z <= (dp > 1 ? 3 : 0); z++) {
                for (int ck = 0; ck <= (zb ? 0 : 1); ck++) {
                    cai_plan_entry e;
                    memset(&e, 0, sizeof e);
                    e.dp = dp;
                    e.tp = tp;
                    e.pp = pp;
                    e.virtual_stages = v;
                    e.style = styles[si];
                    e.zero = z;
                    e.micro_batch = mb;
                    e.microbatches = m;
                    e.ckpt = ck;
                    CAI_CALL(add_layout(q, mf, &e, l));
                }
            }
        }
    }
    return CAI_OK;
}

static int entry_cmp(const void *pa, const void *pb) {
    const cai_plan_entry *a = pa, *b = pb;
    if (a->verdict != b->verdict) return a->verdict < b->verdict ? -1 : 1;
    if (a->verdict == CAI_PLAN_OVER_MEMORY && a->bytes != b->bytes) return a->bytes < b->bytes ? -1 : 1;
    if (a->verdict != CAI_PLAN_INDIVISIBLE && a->time != b->time) return a->time < b->time ? -1 : 1;
    return 0;
}

/* Always eight words, so a row splits into the same columns. */
static void layout_name(const cai_plan_entry *e, char *buf, size_t cap) {
    snprintf(buf, cap, "dp=%d tp=%d pp=%d sched=%s v=%d zero=%d mb=%dx%d ckpt=%s", e->dp, e->tp, e->pp,
             e->pp > 1 ? cai_pp_style_name(e->style) : "-", e->virtual_stages, e->zero, e->microbatches, e->micro_batch,
             e->ckpt ? "on" : "off");
}

/* What the winner gains over an entry, in the terms that differ most. */
static void compare_reason(const cai_plan_entry *w, cai_plan_entry *e) {
    const char *what[] = {"compute", "waiting (bubble, shared cores)", "tp collectives", "dp/ZeRO traffic",
                          "the optimizer step"};
    const double dw[] = {w->t_work, w->t_pipe, w->t_tp, w->t_dp, w->t_opt},
                 de[] = {e->t_work, e->t_pipe, e->t_tp, e->t_dp, e->t_opt};
    int worst = 0;
    for (int i = 1; i < 5; i++)
        if (de[i] - dw[i] > de[worst] - dw[worst]) worst = i;
    snprintf(e->reason, sizeof e->reason, "fits; %.1f%% slower than the winner, most in %s (+%.3g s)",
             100.0 * (e->time / w->time - 1.0), what[worst], de[worst] - dw[worst]);
}

cai_status cai_plan_layouts(const cai_plan_request *q, cai_plan_entry **out, int *n) {
    CAI_CHECK_ARG(q && out && n && q->dev, "cai_plan_layouts: NULL argument");
    *out = NULL;
    *n = 0;
    if (q->np < 1 || q->seq_len < 1 || q->global_batch < 1 || q->micro_batch < 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "plan: np=%d, plan.seq_len=%d, plan.global_batch=%d must be >= 1", q->np,
                         q->seq_len, q->global_batch);
    const cai_plan_costs *k = &q->costs;
    if (!(k->block_f > 0 && k->block_b > 0 && k->head_f > 0 && k->head_b > 0 && k->tokens > 0 && k->bandwidth > 0 &&
          k->latency >= 0 && q->cores >= 1 && q->ranks_per_node >= 1))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "plan: costs must be measured first (block %g/%g s, head %g/%g s, %d tokens, bandwidth %g "
                         "B/s, latency %g s, %d cores, %d ranks per node)",
                         k->block_f, k->block_b, k->head_f, k->head_b, k->tokens, k->bandwidth, k->latency, q->cores,
                         q->ranks_per_node);
    model_facts mf;
    cai_model_config c = q->model;
    c.max_seq_len = q->seq_len;
    CAI_CALL(cai_model_config_resolve(&c, &mf.rc));
    mf.n_layers = mf.rc.n_layers;
    mf.d_model = mf.rc.d_model;
    mf.heads = mf.rc.n_heads;
    mf.kv_heads = mf.rc.n_kv_heads;
    entry_list l = {NULL, 0, 0};
    cai_status st = CAI_OK;
    for (int tp = 1; tp <= q->np; tp++) {
        if (q->np % tp) continue;
        for (int pp = 1; pp <= q->np / tp; pp++) {
            if ((q->np / tp) % pp) continue;
            const int dp = q->np / tp / pp;
            cai_plan_entry e;
            memset(&e, 0, sizeof e);
            e.dp = dp;
            e.tp = tp;
            e.pp = pp;
            e.virtual_stages = 1;
            e.style = CAI_PP_1F1B;
            indivisible(q, &mf, dp, tp, pp, e.reason, sizeof e.reason);
            if (e.reason[0]) {
                e.verdict = CAI_PLAN_INDIVISIBLE;
                CAI_CALL_GOTO(push(&l, &e), st, fail);
                continue;
            }
            const int per = q->global_batch / dp;
            for (int mb = q->micro_batch ? q->micro_batch : 1; mb <= per; mb = q->micro_batch ? per + 1 : 2 * mb)
                if (per % mb == 0) CAI_CALL_GOTO(add_shapes(q, &mf, dp, tp, pp, mb, &l), st, fail);
        }
    }
    qsort(l.e, (size_t)l.n, sizeof *l.e, entry_cmp);
    const cai_plan_entry *w = l.n && l.e[0].verdict == CAI_PLAN_FITS ? &l.e[0] : NULL;
    for (int i = 0; i < l.n && w; i++) {
        cai_plan_entry *e = &l.e[i];
        if (e == w) {
            const cai_plan_entry *next = l.n > 1 && l.e[1].verdict == CAI_PLAN_FITS ? &l.e[1] : NULL;
            char nm[128] = "";
            if (next) layout_name(next, nm, sizeof nm);
            if (next)
                snprintf(e->reason, sizeof e->reason,
                         "wins: the fastest that fits and runs; the next, %s, is %.1f%% slower", nm,
                         100.0 * (next->time / w->time - 1.0));
            else snprintf(e->reason, sizeof e->reason, "wins: the only layout that fits and runs");
        } else if (e->verdict == CAI_PLAN_FITS) {
            compare_reason(w, e);
        }
    }
    *out = l.e;
    *n = l.n;
    return CAI_OK;
fail:
    cai_free(l.e);
    return st;
}

cai_status cai_plan_pick(const cai_plan_request *q, const cai_plan_entry *e, int n, int *winner) {
    CAI_CHECK_ARG(q && winner && (e || n == 0), "cai_plan_pick: NULL argument");
    *winner = -1;
    const cai_plan_entry *small = NULL;
    int divides = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].verdict == CAI_PLAN_FITS) {
            *winner = i;
            return CAI_OK;
        }
        if (e[i].verdict == CAI_PLAN_INDIVISIBLE) continue;
        divides++;
        if (!small || e[i].bytes < small->bytes) small = &e[i];
    }
    if (!divides) {
        char why[512] = "";
        size_t at = 0;
        for (int i = 0; i < n && at < sizeof why; i++)
            at += (size_t)snprintf(why + at, sizeof why - at, "%sdp=%d tp=%d pp=%d: %s", i ? "; " : "", e[i].dp,
                                   e[i].tp, e[i].pp, e[i].reason);
        return CAI_ERROR(CAI_ERR_LAYOUT, "plan: no layout of %d ranks divides the model and the batch (%s)", q->np,
                         why);
    }
    char nm[128];
    layout_name(small, nm, sizeof nm);
    const int notrun = small->verdict == CAI_PLAN_NOT_RUN;
    if (notrun)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "plan: every layout of %d ranks that fits %.1f MiB is one colossal-pretrain does not run "
                         "yet; the smallest, %s, needs %.1f MiB (%s)",
                         q->np, q->mem_limit / 1048576.0, nm, small->bytes / 1048576.0, small->reason);
    return CAI_ERROR(CAI_ERR_NOMEM,
                     "plan: no layout of %d ranks fits the memory limit of %.1f MiB per rank; the smallest, %s, needs "
                     "%.1f MiB (%zu bytes) on pp rank %d",
                     q->np, q->mem_limit / 1048576.0, nm, small->bytes / 1048576.0, small->bytes, small->bytes_rank);
}

static const char *verdict_name(cai_plan_verdict v) {
    switch (v) {
    case CAI_PLAN_FITS: return "fits";
    case CAI_PLAN_NOT_RUN: return "not-run";
    case CAI_PLAN_OVER_MEMORY: return "over-memory";
    default: return "indivisible";
    }
}

void cai_plan_print(const cai_plan_request *q, const cai_plan_entry *e, int n, int top, FILE *out) {
    const cai_model_config *c = &q->model;
    const cai_plan_costs *k = &q->costs;
    fprintf(out,
            "layout plan: %s, %d layers, d_model %d, %d heads (%d kv), vocab %d; %d ranks, global batch %d x %d "
            "tokens, memory limit %s",
            cai_model_family_name(c->family), c->n_layers, c->d_model, c->n_heads,
            c->n_kv_heads ? c->n_kv_heads : c->n_heads, c->vocab_size, q->np, q->global_batch, q->seq_len,
            q->mem_limit ? "" : "none");
    if (q->mem_limit) fprintf(out, "%.1f MiB per rank", q->mem_limit / 1048576.0);
    if (q->fp8 && q->fp8->enabled) fprintf(out, "; FP8 linears in blocks '%s'", q->fp8->layers);
    fprintf(out, "\n");
    fprintf(out,
            "costs: block forward %.4f s, backward %.4f s (split: weight pass %.4f s); embedding+head forward %.4f "
            "s, backward %.4f s; at %d tokens; AdamW %.3f ns per parameter; measured with %d rank%s x %d thread%s "
            "computing on %d core%s; planned: %d rank%s per node\n",
            k->block_f, k->block_b, k->block_w, k->head_f, k->head_b, k->tokens, k->adamw * 1e9, k->concurrency,
            k->concurrency == 1 ? "" : "s", k->threads, k->threads == 1 ? "" : "s", q->cores, q->cores == 1 ? "" : "s",
            q->ranks_per_node, q->ranks_per_node == 1 ? "" : "s");
    fprintf(out,
            "links: %.3f GB/s bus bandwidth, %.1f us latency per collective; a rank waiting in MPI takes %.2f of "
            "a computing rank's share of a core\n",
            k->bandwidth / 1e9, k->latency * 1e6, wait_share(k, (double)q->cores / (k->threads > 0 ? k->threads : 1)));
    fprintf(out, "%4s %-62s %10s %9s %8s %8s %8s %8s %8s  %-11s %s\n", "#", "layout", "MiB/rank", "step(s)", "work",
            "wait", "tp", "dp", "optim", "verdict", "reason");
    int shown = 0;
    for (int i = 0; i < n; i++) {
        const cai_plan_entry *x = &e[i];
        if (top > 0 && shown >= top && x->verdict != CAI_PLAN_INDIVISIBLE) continue;
        char nm[128];
        if (x->verdict == CAI_PLAN_INDIVISIBLE) {
            snprintf(nm, sizeof nm, "dp=%d tp=%d pp=%d sched=- v=- zero=- mb=- ckpt=-", x->dp, x->tp, x->pp);
            fprintf(out, "%4s %-62s %10s %9s %8s %8s %8s %8s %8s  %-11s %s\n", "-", nm, "-", "-", "-", "-", "-", "-",
                    "-", verdict_name(x->verdict), x->reason);
            continue;
        }
        layout_name(x, nm, sizeof nm);
        fprintf(out, "%4d %-62s %10.1f %9.3f %8.3f %8.3f %8.3f %8.3f %8.3f  %-11s %s\n", i + 1, nm,
                x->bytes / 1048576.0, x->time, x->t_work, x->t_pipe, x->t_tp, x->t_dp, x->t_opt,
                verdict_name(x->verdict), x->reason);
        shown++;
    }
    if (top > 0 && shown >= top) fprintf(out, "(%d layouts shown of those that divide; plan.top=0 lists all)\n", top);
}

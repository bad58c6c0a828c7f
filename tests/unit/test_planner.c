/* The memory planner without MPI: byte counts against parameter counts
 * derived by hand from the model shapes, activations against what a real
 * model allocates, the planner's units against the model's own, and the
 * refusal message naming exactly the options that would fit. (The plan vs
 * the engine's allocations and the process' RSS: tests/mpi/test_zero.c.) */
#include "cai_config.h"

#include <math.h>
#include "colossal/model.h"
#include "colossal/parallel.h"
#include "parallel/zero_internal.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

static cai_device_t *dev;

static cai_model_config small_model(cai_model_family f) {
    cai_model_config c = cai_model_config_default(f);
    c.vocab_size = 500;
    c.vocab_multiple = 64;
    c.n_layers = 8; /* deep enough that stage 2/3 windows are a fraction of the model */
    c.d_model = 64;
    c.n_heads = 4;
    c.n_kv_heads = f == CAI_MODEL_LLAMA ? 2 : 4;
    c.ffn_hidden = f == CAI_MODEL_LLAMA ? 160 : 0;
    c.max_seq_len = 32;
    return c;
}

static cai_mem_plan_request request(cai_model_config c, int stage, int offload, int dp) {
    cai_mem_plan_request r;
    memset(&r, 0, sizeof r);
    r.model = c;
    r.batch = 4;
    r.seq_len = 32;
    r.view = cai_rank_view_single();
    r.dp = dp;
    cai_zero_config_init(&r.zero);
    r.zero.stage = stage;
    r.zero.offload = offload;
    r.zero.bucket_bytes = 64 * 1024; /* several buckets: stage 2 keeps only some of them whole */
    r.dev = dev;
    return r;
}

static size_t r16(size_t x) { return (x + 15) / 16 * 16; }

/* Flat elements of the model, parameter by parameter from its shapes (each
 * rounded to the 16-element alignment), not from the registry. */
static size_t flat_by_hand(const cai_model_config *c) {
    size_t V = 512, C = (size_t)c->d_model, T = (size_t)c->max_seq_len, D = C / (size_t)c->n_heads;
    size_t Hq = (size_t)c->n_heads, Hk = (size_t)c->n_kv_heads, W = (Hq + 2 * Hk) * D;
    size_t n = r16(V * C); /* wte */
    if (c->family == CAI_MODEL_GPT2) {
        size_t F = 4 * C;
        n += r16(T * C);
        size_t layer =
            4 * r16(C) + r16(W * C) + r16(W) + r16(C * C) + r16(C) + r16(F * C) + r16(F) + r16(C * F) + r16(C);
        n += (size_t)c->n_layers * layer + 2 * r16(C);
    } else {
        size_t F = (size_t)c->ffn_hidden;
        size_t layer = 2 * r16(C) + r16(W * C) + r16(C * Hq * D) + 3 * r16(F * C);
        n += (size_t)c->n_layers * layer + r16(C);
    }
    return n + r16(V * C); /* lm_head */
}

START_TEST(plan_matches_the_shapes) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = small_model(f ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
        size_t n = flat_by_hand(&c);
        cai_mem_plan p;
        /* Stage 0: the model's F32 masters and gradients, two moments. */
        cai_mem_plan_request r = request(c, 0, 0, 4);
        OK(cai_mem_plan_compute(&r, &p));
        ck_assert_uint_eq(p.n_flat, n);
        ck_assert_uint_eq(p.params, 0);
        ck_assert_uint_eq(p.grads, 4 * n);
        ck_assert_uint_eq(p.master, 4 * n);
        ck_assert_uint_eq(p.optim, 8 * n);
        ck_assert_uint_eq(p.host, 0);
        ck_assert_uint_eq(p.device, p.grads + p.master + p.optim + p.acts);
        const size_t stage0 = p.device;
        /* Stages 1-3 over dp 4: shards of a quarter (plus per-bucket padding). */
        size_t prev = stage0;
        for (int s = 1; s <= 3; s++) {
            r = request(c, s, 0, 4);
            OK(cai_mem_plan_compute(&r, &p));
            size_t S = p.n_flat / 4;
            ck_assert_uint_eq(p.n_flat % (4 * 16), 0);
            ck_assert_uint_ge(p.n_flat, n);
            ck_assert_uint_lt(p.n_flat, n + 64 * (size_t)(c.n_layers + 2)); /* < one pad per bucket */
            ck_assert_uint_eq(p.master, 0); /* f32: the masters are the working weights' own chunks */
            ck_assert_uint_eq(p.optim, 8 * S);
            ck_assert_uint_eq(p.params, s == 3 ? 4 * S : 4 * p.n_flat);
            ck_assert_uint_eq(p.grads, s == 1 ? 4 * p.n_flat : 4 * S); /* stage 1 reduces in place */
            ck_assert_uint_eq(p.windows == 0, s < 2);
            ck_assert_msg(p.device < prev, "stage %d (%zu bytes) does not save over stage %d (%zu)", s, p.device, s - 1,
                          prev);
            prev = p.device;
        }
        /* Without overlap every gradient window lives to the end of backward. */
        r = request(c, 2, 0, 4);
        cai_mem_plan q;
        OK(cai_mem_plan_compute(&r, &p));
        r.zero.overlap = 0;
        OK(cai_mem_plan_compute(&r, &q));
        ck_assert_uint_gt(q.windows, p.windows);
        ck_assert_uint_ge(q.windows, 4 * q.n_flat); /* the whole gradient, in windows */
        /* Offload moves masters, moments and their staging to the host. */
        r = request(c, 3, 1, 4);
        OK(cai_mem_plan_compute(&r, &p));
        size_t S = p.n_flat / 4;
        ck_assert_uint_eq(p.host, 4 * S + 8 * S + 4 * S + 4 * S); /* masters, moments, gradient and weight staging */
        ck_assert_uint_eq(p.device, p.params + p.grads + p.windows + p.acts);
        /* bf16 working weights on a host device: a bf16 copy and the F32 compute copy. */
        c.param_dtype = CAI_DTYPE_BF16;
        r = request(c, 0, 0, 1);
        OK(cai_mem_plan_compute(&r, &p));
        ck_assert_uint_eq(p.params, 2 * n + 4 * n);
        r = request(c, 2, 0, 2);
        OK(cai_mem_plan_compute(&r, &p));
        ck_assert_uint_eq(p.staging, 2 * (p.n_flat / 2)); /* the rounding scratch */
        ck_assert_uint_eq(p.master, 4 * (p.n_flat / 2));  /* bf16 working weights: separate f32 masters */
    }
}
END_TEST

/* Whole models, and pipeline ranks with 2 chunks and 3 activation slots
 * (the first and the last rank of pp 2), with and without a split
 * backward's kept gradients. */
START_TEST(activations_match_the_model) {
    for (int f = 0; f < 2; f++)
        for (int ckpt = 0; ckpt <= 1; ckpt++)
            for (int pr = -1; pr < 4; pr++) {
                const int split = pr >= 2; /* ranks 2, 3: ranks 0, 1 split */
                cai_model_config c = small_model(f ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
                c.activation_checkpointing = ckpt;
                c.n_layers = 4;
                cai_mem_plan p;
                cai_mem_plan_request r = request(c, 0, 0, 1);
                if (split && ckpt) continue;
                if (pr >= 0) {
                    r.view.pp_size = 2;
                    r.view.pp_rank = pr % 2;
                    r.view.pp_chunks = 2;
                    r.pp_inflight = 3;
                    r.pp_split = split;
                }
                OK(cai_mem_plan_compute(&r, &p));
                cai_model_options mo = cai_model_options_default(&c);
                mo.batch = r.batch;
                mo.seq_len = r.seq_len;
                mo.view = r.view;
                mo.act_slots = r.pp_inflight;
                mo.split_backward = split;
                cai_model_t *m = NULL;
                OK(cai_model_create(&m, dev, &c, &mo));
                size_t pb = 0, ab = 0;
                cai_model_memory(m, &pb, &ab);
                ck_assert_uint_eq(p.acts, ab);
                ck_assert_uint_eq(p.params + p.grads + p.master, pb);
                if (pr < 0) ck_assert_uint_lt(p.acts_recompute, p.acts_full); /* a 1-layer chunk recomputes nothing */
                ck_assert_uint_eq(ckpt ? p.acts_recompute : p.acts_full, ab);
                cai_model_free(m);
            }
}
END_TEST

/* What a frozen model of the request's shape holds once loaded (the copy
 * its layers read: cai_model_keep_compute) and its activations; with
 * `loading`, what it holds while it loads (its whole storage) instead. */
static void frozen_model_bytes_at(const cai_model_config *c, const cai_mem_plan_request *r, int loading, size_t *pb,
                                  size_t *ab) {
    cai_model_options mo = cai_model_options_default(c);
    mo.batch = r->batch;
    mo.seq_len = r->seq_len;
    mo.frozen = 1;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, c, &mo));
    if (!loading) OK(cai_model_keep_compute(m));
    cai_model_memory(m, pb, ab);
    cai_model_free(m);
}
static void frozen_model_bytes(const cai_model_config *c, const cai_mem_plan_request *r, size_t *pb, size_t *ab) {
    frozen_model_bytes_at(c, r, 0, pb, ab);
}

/* An RL run's frozen models (reference, reward model) and the rollout
 * engine's KV pool: each frozen model as a frozen model of the request's
 * shape allocates, whatever ZeRO stage the trained one runs; while they
 * load (before the trained model), the last one's whole storage beside the
 * kept copies before it, which is the plan's peak where the trained model
 * is sharded thin. */
START_TEST(frozen_models_match_the_model) {
    for (int f = 0; f < 4; f++)
        for (int ckpt = 0; ckpt <= 1; ckpt++)
            for (int stage = 0; stage <= 3; stage += 3) {
                cai_model_config c = small_model(f % 2 ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
                if (f >= 2) c.param_dtype = CAI_DTYPE_BF16; /* f32 masters and a bf16 copy: only the copy stays */
                c.activation_checkpointing = ckpt;
                cai_mem_plan_request r = request(c, stage, 0, 2);
                cai_mem_plan alone, p;
                OK(cai_mem_plan_compute(&r, &alone));
                ck_assert_uint_eq(alone.frozen, 0);
                ck_assert_uint_eq(alone.rollout, 0);
                r.frozen_models = 2;
                r.rollout_bytes = (size_t)3 << 20;
                OK(cai_mem_plan_compute(&r, &p));
                size_t pb = 0, ab = 0;
                frozen_model_bytes(&c, &r, &pb, &ab);
                ck_assert_msg(p.frozen == 2 * (pb + ab), "f %d ckpt %d stage %d: %zu %zu %zu %zu", f, ckpt, stage,
                              p.frozen, p.frozen_weights, pb, ab);
                ck_assert_uint_eq(p.rollout, (size_t)3 << 20);
                ck_assert_uint_eq(p.device, alone.device + p.frozen + p.rollout);
                /* loading: the second model's whole storage beside the first's kept copy */
                size_t lb = 0, la = 0;
                frozen_model_bytes_at(&c, &r, 1, &lb, &la);
                ck_assert_uint_eq(la, ab);
                ck_assert_uint_eq(p.frozen_load, lb + la + pb + ab);
                r.frozen_on_host = 1; /* each goes to host memory once loaded */
                OK(cai_mem_plan_compute(&r, &p));
                ck_assert_uint_eq(p.frozen_load, lb + la);
            }
    /* a trained model sharded over many ranks holds less than a frozen one
     * while it loads: the load is the plan's peak */
    {
        cai_model_config c = small_model(CAI_MODEL_LLAMA);
        c.param_dtype = c.act_dtype = CAI_DTYPE_BF16;
        cai_mem_plan_request r = request(c, 3, 0, 64);
        r.batch = 1, r.seq_len = 8; /* activations small beside the weights */
        r.frozen_models = 2;
        cai_device_t gpu = *dev; /* a device apart from host memory, for the check below */
        gpu.kind = CAI_DEVICE_CUDA;
        r.dev = &gpu;
        cai_mem_plan p;
        OK(cai_mem_plan_compute(&r, &p));
        size_t lb = 0, la = 0, pb = 0, ab = 0;
        frozen_model_bytes_at(&c, &r, 1, &lb, &la);
        frozen_model_bytes(&c, &r, &pb, &ab);
        ck_assert_uint_eq(p.frozen_load, lb + la + pb + ab);
        ck_assert_uint_eq(p.device, p.frozen_load);
        const size_t steady =
            p.params + p.grads + p.master + p.optim + p.staging + p.windows + p.acts + p.pipe + p.fp8 + p.frozen;
        ck_assert_uint_gt(p.frozen_load, steady);
        /* a limit the steady state meets but the load does not: refused, naming the load */
        ck_assert_int_eq(cai_mem_plan_check(&r, &p, (steady + p.frozen_load) / 2, 0), CAI_ERR_NOMEM);
        ck_assert_msg(strstr(cai_error_message(), "the device peak is the frozen models' load") != NULL, "%s",
                      cai_error_message());
        cai_error_clear();
    }
    cai_mem_plan_request r = request(small_model(CAI_MODEL_GPT2), 0, 0, 1);
    r.frozen_models = -1;
    cai_mem_plan p;
    ck_assert_int_eq(cai_mem_plan_compute(&r, &p), CAI_ERR_INVALID_ARG);
    ck_assert(strstr(cai_error_message(), "frozen_models=-1") != NULL);
    cai_error_clear();
}
END_TEST

/* Frozen models on the host: they (weights and activation arenas) and the
 * rollout KV pool take turns in device memory (the larger of the two
 * counts, not both) and the weights' copy is host memory. On a GPU a limit
 * between the two plans is met by offering placement.frozen=host; on the
 * host device, where both sides are the same RAM, only what the turns save
 * counts. */
START_TEST(frozen_on_host_takes_turns_with_the_pool) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = small_model(f ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
        cai_device_t gpu = *dev;
        gpu.kind = CAI_DEVICE_CUDA;
        cai_mem_plan_request r = request(c, 0, 0, 1);
        r.dev = &gpu;
        r.frozen_models = 2;
        size_t pb = 0, ab = 0;
        frozen_model_bytes(&c, &r, &pb, &ab);
        /* a pool smaller, then larger than the two models (weights and activations) */
        const size_t pools[2] = {pb / 2, 5 * (pb + ab)};
        for (int k = 0; k < 2; k++) {
            r.rollout_bytes = pools[k];
            r.frozen_on_host = 0;
            cai_mem_plan dev_p, host_p;
            OK(cai_mem_plan_compute(&r, &dev_p));
            r.frozen_on_host = 1;
            OK(cai_mem_plan_compute(&r, &host_p));
            ck_assert_uint_eq(host_p.frozen_weights, 2 * pb);
            ck_assert_uint_eq(host_p.frozen, 2 * (pb + ab));
            ck_assert_int_eq(host_p.frozen_on_host, 1);
            const size_t frozen = 2 * (pb + ab), turn = frozen > pools[k] ? frozen : pools[k];
            ck_assert_uint_eq(host_p.device, dev_p.device - frozen - pools[k] + turn);
            ck_assert_uint_eq(host_p.host, dev_p.host + 2 * pb);
            /* a limit only the turns meet: offered */
            r.frozen_on_host = 0;
            ck_assert_int_eq(cai_mem_plan_check(&r, &dev_p, host_p.device, 0), CAI_ERR_NOMEM);
            ck_assert_msg(strstr(cai_error_message(), "placement.frozen=host") != NULL, "%s", cai_error_message());
            cai_error_clear();
            r.frozen_on_host = 1;
            OK(cai_mem_plan_check(&r, &host_p, host_p.device, 0));
            /* printed as the two rows and the pool's turn */
            char *text = NULL;
            size_t len = 0;
            FILE *out = open_memstream(&text, &len);
            cai_mem_plan_print(&host_p, out);
            fclose(out);
            ck_assert_msg(strstr(text, "frozen models' weights") && strstr(text, "in turn with the frozen weights"),
                          "%s", text);
            free(text);
        }
        /* no frozen model: nothing takes turns */
        r.frozen_models = 0;
        cai_mem_plan none;
        OK(cai_mem_plan_compute(&r, &none));
        ck_assert_int_eq(none.frozen_on_host, 0);
        /* the host device, one RAM for both sides: a pool smaller than the
         * weights saves nothing by taking turns (not offered); a larger
         * one saves the activation arenas (offered, with that total) */
        for (int k = 0; k < 2; k++) {
            cai_mem_plan_request h = request(c, 0, 0, 1);
            h.frozen_models = 2;
            h.rollout_bytes = pools[k];
            cai_mem_plan hp, hh;
            OK(cai_mem_plan_compute(&h, &hp));
            h.frozen_on_host = 1;
            OK(cai_mem_plan_compute(&h, &hh));
            h.frozen_on_host = 0;
            const size_t total = hp.device + hp.host, turns = hh.device + hh.host;
            ck_assert_int_eq(cai_mem_plan_check(&h, &hp, (k ? turns : total - 1), 0), CAI_ERR_NOMEM);
            ck_assert_msg((strstr(cai_error_message(), "placement.frozen=host") != NULL) == k, "%s",
                          cai_error_message());
            cai_error_clear();
            if (k) ck_assert_uint_eq(turns, total - 2 * ab);
        }
    }
}
END_TEST

/* Split-gather sequence parallelism divides the residual stream over tp:
 * per rank, the layers' saved activations shrink by the norms' and
 * residuals' (tp-1)/tp share and the scratch grows by two whole-sequence
 * buffers. The same arithmetic, done by hand, against the planner's. */
START_TEST(sequence_parallel_shrinks_activations) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = small_model(f ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
        cai_model_config r;
        OK(cai_model_config_resolve(&c, &r));
        cai_rank_view v = cai_rank_view_single();
        v.tp_size = 2;
        const int B = 2, T = 16, L = r.n_layers;
        size_t full0 = 0, rec0 = 0, full1 = 0, rec1 = 0;
        OK(cai_model_activation_bytes(dev, &c, &v, B, T, 0, L, 1, 1, &full0, &rec0));
        OK(cai_model_activation_bytes(dev, &c, &v, B, T, 1, L, 1, 1, &full1, &rec1));
        const size_t row = (size_t)r.d_model * sizeof(float), half = (size_t)B * T / 2, f32 = sizeof(float);
        /* Per layer: ln1, ln2, res_mid [tokens, C] and 2 (RMSNorm) or 4 (LayerNorm) statistics [tokens]. */
        const size_t stats = f ? 2 : 4, per_layer = half * (3 * row + stats * f32);
        /* The residual stream: L + 1 layer inputs and d_stream; the head's norm statistics. */
        const size_t stream = (size_t)(L + 2) * half * row + half * (f ? 1 : 2) * f32;
        const size_t extra = 2 * (size_t)B * T * row + 2 * (size_t)r.d_model * f32;
        /* Up to the arena's 64-byte rounding of each buffer. */
        const double want = (double)full0 - (double)(L * per_layer + stream) + (double)extra;
        ck_assert_msg(fabs((double)full1 - want) <= 64.0 * (12 * L + 16), "gpt2/llama %d: %zu bytes with sp vs %.0f", f,
                      full1, want);
        ck_assert_uint_lt(full1, full0);
        ck_assert_uint_lt(rec1, rec0 + extra);
    }
}
END_TEST

START_TEST(units_match_the_model) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = small_model(f ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
        cai_model_options mo = cai_model_options_default(&c);
        mo.batch = 1;
        mo.seq_len = 8;
        mo.external_params = 1;
        cai_model_t *m = NULL;
        OK(cai_model_create(&m, dev, &c, &mo));
        int nu = 0, **units = NULL, *np = NULL;
        OK(zl_units_from_registry(cai_model_registry(m), cai_model_view(m), &nu, &units, &np));
        ck_assert_int_eq(nu, cai_model_unit_count(m));
        int idx[64];
        for (int u = 0; u < nu; u++) {
            int n = cai_model_unit_params(m, u, idx, 64);
            ck_assert_int_eq(n, np[u]);
            for (int k = 0; k < n; k++) ck_assert_int_eq(idx[k], units[u][k]);
        }
        /* The tied GPT-2 head reads the embedding, not its own copy. */
        if (c.family == CAI_MODEL_GPT2) {
            int wte = cai_registry_find(cai_model_registry(m), "wte.weight");
            int found = 0;
            for (int k = 0; k < np[nu - 1]; k++) found |= units[nu - 1][k] == wte;
            ck_assert(found);
        }
        zl_units_free(nu, units, np);
        cai_model_free(m);
    }
}
END_TEST

static int fits(const cai_device_t *d, const cai_mem_plan *p, size_t dl, size_t hl) {
    if (d->kind == CAI_DEVICE_HOST) return p->device + p->host <= dl;
    return p->device <= dl && (!hl || p->host <= hl);
}

/* Every option the message offers fits, and every single change that fits
 * (stage, offload, recompute) is offered. */
static void check_suggestions(cai_mem_plan_request r, size_t dl, size_t hl) {
    cai_mem_plan p;
    OK(cai_mem_plan_compute(&r, &p));
    ck_assert(!fits(r.dev, &p, dl, hl));
    ck_assert_int_eq(cai_mem_plan_check(&r, &p, dl, hl), CAI_ERR_NOMEM);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", cai_error_message());
    cai_error_clear();
    ck_assert_msg(strstr(msg, "exceeds") != NULL, "%s", msg);
    char key[64];
    for (int s = r.zero.stage + 1; s <= 3; s++) {
        cai_mem_plan_request v = r;
        v.zero.stage = s;
        cai_mem_plan q;
        OK(cai_mem_plan_compute(&v, &q));
        snprintf(key, sizeof key, "zero.stage=%d (", s);
        ck_assert_msg((strstr(msg, key) != NULL) == fits(r.dev, &q, dl, hl), "stage %d: %s", s, msg);
    }
    cai_mem_plan_request v = r;
    v.zero.offload = 1;
    cai_mem_plan q;
    OK(cai_mem_plan_compute(&v, &q));
    /* The plain entry, not "zero.stage=3 with zero.offload=true". */
    int offered = strstr(msg, "with: zero.offload=true (") || strstr(msg, "; zero.offload=true (");
    ck_assert_msg(offered == fits(r.dev, &q, dl, hl), "offload: %s", msg);
    v = r;
    v.model.activation_checkpointing = 1;
    OK(cai_mem_plan_compute(&v, &q));
    ck_assert_msg((strstr(msg, "model.activation_checkpointing=true") != NULL) == fits(r.dev, &q, dl, hl),
                  "recompute: %s", msg);
}

START_TEST(refusal_names_what_would_fit) {
    cai_model_config c = small_model(CAI_MODEL_GPT2);
    cai_mem_plan_request r = request(c, 0, 0, 4);
    cai_mem_plan p;
    OK(cai_mem_plan_compute(&r, &p));
    size_t total = p.device + p.host;
    OK(cai_mem_plan_check(&r, &p, total, 0)); /* exactly at the limit fits */
    OK(cai_mem_plan_check(&r, &p, 0, 0));     /* 0: unlimited */
    /* Host device: ZeRO stages save, offload does not (same RAM). */
    check_suggestions(r, total - total / 10, 0);
    check_suggestions(r, total / 2, 0);
    /* Activation-bound: only recompute or a smaller microbatch helps. */
    cai_mem_plan_request big = r;
    big.batch = 64;
    OK(cai_mem_plan_compute(&big, &p));
    check_suggestions(big, p.device - p.acts + p.acts_recompute + 1024, 0);
    ck_assert_int_eq(cai_mem_plan_check(&big, &p, p.device / 2, 0), CAI_ERR_NOMEM);
    ck_assert_msg(strstr(cai_error_message(), "train.micro_batch=") != NULL, "%s", cai_error_message());
    cai_error_clear();
    /* A caller that runs stages up to 2 is offered none above (but the
     * stages up to it and offload, where they fit). */
    cai_mem_plan_request capped = r;
    capped.zero_max_stage = 2;
    OK(cai_mem_plan_compute(&capped, &p));
    ck_assert_int_eq(cai_mem_plan_check(&capped, &p, total / 2, 0), CAI_ERR_NOMEM);
    ck_assert_msg(strstr(cai_error_message(), "zero.stage=3") == NULL, "%s", cai_error_message());
    cai_error_clear();
    ck_assert_int_eq(cai_mem_plan_check(&capped, &p, p.device - p.optim / 2, 0), CAI_ERR_NOMEM);
    ck_assert_msg(strstr(cai_error_message(), "zero.stage=1") != NULL, "%s", cai_error_message());
    cai_error_clear();
    /* Nothing fits. */
    ck_assert_int_eq(cai_mem_plan_check(&r, &p, 1024, 0), CAI_ERR_NOMEM);
    ck_assert_msg(strstr(cai_error_message(), "no single change fits") != NULL, "%s", cai_error_message());
    cai_error_clear();
    /* A GPU (sizes from the same op table): offload relieves device memory. */
    cai_device_t gpu = *dev;
    gpu.kind = CAI_DEVICE_CUDA;
    cai_mem_plan_request g = r;
    g.dev = &gpu;
    OK(cai_mem_plan_compute(&g, &p));
    check_suggestions(g, p.device - p.optim / 2, 0);
    g.zero.offload = 1;
    OK(cai_mem_plan_compute(&g, &p));
    ck_assert_int_eq(cai_mem_plan_check(&g, &p, 0, p.host - 1), CAI_ERR_NOMEM);
    ck_assert_msg(strstr(cai_error_message(), "host memory") != NULL, "%s", cai_error_message());
    cai_error_clear();
}
END_TEST

START_TEST(plan_prints_every_line) {
    cai_mem_plan_request r = request(small_model(CAI_MODEL_LLAMA), 3, 1, 4);
    r.frozen_models = 1;
    r.rollout_bytes = (size_t)1 << 20;
    cai_mem_plan p;
    OK(cai_mem_plan_compute(&r, &p));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cai_mem_plan_print(&p, f);
    fclose(f);
    const char *want[] = {"ZeRO stage 3 + CPU offload over dp 4",
                          "parameters",
                          "gradients",
                          "windows",
                          "master weights",
                          "optimizer state",
                          "activations",
                          "without recompute",
                          "frozen models",
                          "rollout KV pool",
                          "total"};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        ck_assert_msg(strstr(buf, want[k]) != NULL, "missing '%s' in:\n%s", want[k], buf);
    free(buf);
    /* Bad requests fail with the field named. */
    r.zero.stage = 4;
    ck_assert_int_eq(cai_mem_plan_compute(&r, &p), CAI_ERR_CONFIG);
    ck_assert(strstr(cai_error_message(), "zero.stage=4") != NULL);
    cai_error_clear();
}
END_TEST

int main(void) {
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1) != CAI_OK) return EXIT_FAILURE;
    Suite *s = suite_create("planner");
    TCase *tc = tcase_create("planner");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, plan_matches_the_shapes);
    tcase_add_test(tc, activations_match_the_model);
    tcase_add_test(tc, frozen_models_match_the_model);
    tcase_add_test(tc, frozen_on_host_takes_turns_with_the_pool);
    tcase_add_test(tc, units_match_the_model);
    tcase_add_test(tc, sequence_parallel_shrinks_activations);
    tcase_add_test(tc, refusal_names_what_would_fit);
    tcase_add_test(tc, plan_prints_every_line);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

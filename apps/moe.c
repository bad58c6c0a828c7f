/* colossal-moe: pretrain a Mixtral-style model (Llama blocks whose MLPs
 * are mixtures of experts) on the embedded corpus or Megatron data, with
 * experts sharded over mesh.ep, data parallel over mesh.dp (= edp x ep) and
 * the attention tensor parallel over mesh.tp.
 *
 *   mpirun -np N colossal-moe --config examples/moe-tiny.yaml [--key=value ...]
 *
 * The data pipeline is colossal-pretrain's (apps/pretrain_data.c); the
 * step driver at ep > 1 and zero.stage=0 is the expert-parallel one (dense
 * gradients averaged over dp, experts over their edp replicas), at stages
 * >= 1 the ZeRO engine's (dense optimizer state sharded over dp, experts'
 * over edp). Each step adds a
 * "moe" record to metrics.jsonl: tokens per expert (min, max, coefficient
 * of variation per layer, averaged over layers), dropped assignments, aux
 * and z losses. See docs/moe.md. */
#include "cai_config.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/moe.h"
#include "colossal/run.h"
#include "pretrain.h"

typedef struct {
    pt_config pt; /* the data, train, optim, zero, run and log keys colossal-pretrain has */
    int ep, n_experts, top_k, expert_ffn, shared, router, routing, every;
    double capacity_factor, aux_coef, z_coef;
} moe_app_config;

static const char *k_routers[CAI_MOE_ROUTER_COUNT + 1];
static const char *k_routings[CAI_MOE_ROUTING_COUNT + 1];

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(moe_app_config, field), def, doc, __VA_ARGS__, NULL, NULL }
#define E(key, field, def, doc, choices) \
    { key, CAI_CFG_ENUM, offsetof(moe_app_config, field), def, doc, CAI_CFG_NO_RANGE, choices, NULL }
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)
#define BIG 1e15

static const cai_config_field k_fields[] = {
    F("model.n_layers", CAI_CFG_INT, pt.n_layers, "4", "transformer blocks", 1, 1024),
    F("model.d_model", CAI_CFG_INT, pt.d_model, "128", "hidden size", 8, 1 << 16),
    F("model.n_heads", CAI_CFG_INT, pt.n_heads, "4", "attention heads (must divide d_model)", 1, 4096),
    F("model.n_kv_heads", CAI_CFG_INT, pt.n_kv_heads, "0", "key/value heads (grouped-query attention); 0: n_heads", 0,
      4096),
    F("model.ffn_hidden", CAI_CFG_INT, pt.ffn_hidden, "0", "dense MLP hidden size (blocks without experts)", 0,
      1 << 20),
    F("model.vocab_size", CAI_CFG_INT, pt.vocab_size, "0", "vocabulary; 0: the tokenizer's", 0, 1 << 24),
    F("model.rope_theta", CAI_CFG_DOUBLE, pt.rope_theta, "0", "RoPE base; 0: 10000", 0, 1e12),
    F("model.init_std", CAI_CFG_DOUBLE, pt.init_std, "0", "N(0, std^2) init; 0: 0.02", 0, 10),
    F("model.seed", CAI_CFG_INT64, pt.model_seed, "1234", "parameter initialisation seed", 0, BIG),
    F("model.activation_checkpointing", CAI_CFG_BOOL, pt.act_ckpt, "false",
      "keep only each layer's input and recompute it in backward", CAI_CFG_NO_RANGE),

    F("moe.experts", CAI_CFG_INT, n_experts, "8", "experts per MoE layer (E)", 1, 1 << 16),
    F("moe.top_k", CAI_CFG_INT, top_k, "2", "experts per token", 1, 1 << 16),
    F("moe.ffn", CAI_CFG_INT, expert_ffn, "0", "hidden size of each expert; 0: model.ffn_hidden", 0, 1 << 20),
    F("moe.shared", CAI_CFG_INT, shared, "0", "shared experts applied to every token (DeepSeek); 0: none", 0, 64),
    E("moe.router", router, "softmax", "softmax (Mixtral), topk_softmax or sigmoid (DeepSeek-V3)", k_routers),
    E("moe.routing", routing, "dropless", "dropless, or capacity (assignments past an expert's capacity dropped)",
      k_routings),
    F("moe.capacity_factor", CAI_CFG_DOUBLE, capacity_factor, "1.0",
      "capacity routing: each expert takes ceil(factor * tokens * top_k / experts) assignments", 0, 1e6),
    F("moe.aux_coef", CAI_CFG_DOUBLE, aux_coef, "0.01", "load-balancing loss coefficient; 0: off", 0, 1e6),
    F("moe.z_coef", CAI_CFG_DOUBLE, z_coef, "0.001", "router z-loss coefficient; 0: off", 0, 1e6),
    F("moe.every", CAI_CFG_INT, every, "1", "every n-th block (layers l with l % n == 0) has experts", 1, 1024),

    F("mesh.dp", CAI_CFG_INT, pt.dp, "0", "data-parallel ranks (edp x ep); 0: world / tp", 0, 1 << 20),
    F("mesh.ep", CAI_CFG_INT, ep, "1", "expert-parallel ranks: each holds moe.experts / ep experts (divides mesh.dp)",
      1, 1 << 20),
    F("mesh.tp", CAI_CFG_INT, pt.tp, "1", "tensor-parallel ranks (attention; the experts run whole on each)", 1,
      1 << 20),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, pt.watchdog, "300",
      "seconds a collective may stall before every rank aborts naming the late one; 0: off", 0, 1e9),

    F("train.steps", CAI_CFG_INT64, pt.steps, "200", "optimizer steps", 1, BIG),
    F("train.micro_batch", CAI_CFG_INT, pt.micro_batch, "8", "sequences per forward on each rank", 1, 1 << 20),
    F("train.grad_accum", CAI_CFG_INT, pt.grad_accum, "1", "microbatches per step on each rank", 1, 1 << 20),
    F("train.seq_len", CAI_CFG_INT, pt.seq_len, "128", "tokens per sequence (also the model's maximum)", 2, 1 << 20),
    F("train.seed", CAI_CFG_INT64, pt.data_seed, "1234", "sample order seed", 0, BIG),

    TC_OPTIM_FIELDS(moe_app_config, pt.tr, "1e-3", "1e-4"),
    TC_ZERO_FIELDS(moe_app_config, pt.tr),

    F("eval.interval", CAI_CFG_INT64, pt.eval_interval, "100",
      "validate every this many steps and at the end; 0: never", 0, BIG),
    F("eval.batches", CAI_CFG_INT, pt.eval_batches, "4", "global batches per validation", 1, 1 << 20),

    S("data.path", pt.data_path, "",
      "Megatron data path: PREFIX or \"W1 PREFIX1 W2 PREFIX2\"; empty: the embedded corpus"),
    S("data.split", pt.split, "98,2,0", "train,valid,test weights over each prefix's documents"),
    S("data.tokenizer", pt.tokenizer, "",
      "directory with vocab.json and merges.txt; empty: byte-level, or BPE trained on the embedded corpus"),
    S("data.eod", pt.eod, "<|endoftext|>", "BPE special token that ends every document"),
    F("data.corpus_docs", CAI_CFG_INT64, pt.corpus_docs, "20000", "embedded corpus: documents to generate", 1, BIG),
    F("data.corpus_seed", CAI_CFG_INT64, pt.corpus_seed, "1234", "embedded corpus: generator seed", 0, BIG),
    F("data.corpus_vocab", CAI_CFG_INT, pt.corpus_vocab, "1000",
      "embedded corpus: train a BPE tokenizer of this many tokens on it; 0: byte-level", 0, 1 << 24),
    F("data.corpus_split_digits", CAI_CFG_BOOL, pt.corpus_split_digits, "false",
      "embedded corpus tokenizer: every digit its own pre-token, never merged (HF Digits(individual_digits))",
      CAI_CFG_NO_RANGE),

    CAI_RUN_FIELDS(moe_app_config, pt.run, "runs/moe"),
    CAI_APP_COMMON_FIELDS(moe_app_config, pt.common),
};
#undef F
#undef E
#undef S
#undef BIG

static const cai_config_schema k_schema = {"colossal-moe", "pretrain a mixture-of-experts (Mixtral-style) model",
                                           k_fields, CAI_CFG_NFIELDS(k_fields)};

static void fill_choices(void) {
    for (int i = 0; i < CAI_MOE_ROUTER_COUNT; i++) k_routers[i] = cai_moe_router_name((cai_moe_router)i);
    for (int i = 0; i < CAI_MOE_ROUTING_COUNT; i++) k_routings[i] = cai_moe_routing_name((cai_moe_routing)i);
    tc_fill_choices();
}

static cai_model_config model_config(const moe_app_config *c, int64_t vocab) {
    const pt_config *p = &c->pt;
    cai_model_config m = cai_model_config_default(CAI_MODEL_LLAMA);
    m.vocab_size = (int)vocab;
    m.n_layers = p->n_layers;
    m.d_model = p->d_model;
    m.n_heads = p->n_heads;
    m.n_kv_heads = p->n_kv_heads;
    m.ffn_hidden = p->ffn_hidden;
    m.max_seq_len = p->seq_len;
    m.rope_theta = (float)p->rope_theta;
    m.init_std = (float)p->init_std;
    m.seed = (uint64_t)p->model_seed;
    m.activation_checkpointing = p->act_ckpt;
    m.moe = cai_moe_config_default();
    m.moe.n_experts = c->n_experts;
    m.moe.top_k = c->top_k;
    m.moe.ffn = c->expert_ffn;
    m.moe.n_shared = c->shared;
    m.moe.router = (cai_moe_router)c->router;
    m.moe.routing = (cai_moe_routing)c->routing;
    m.moe.capacity_factor = (float)c->capacity_factor;
    m.moe.aux_coef = (float)c->aux_coef;
    m.moe.z_coef = (float)c->z_coef;
    m.moe_every = c->every;
    return m;
}

static cai_run_config run_config(const moe_app_config *c, const cai_layout *layout) {
    cai_run_config r = {
        .program = "colossal-moe", .schema = &k_schema, .app_cfg = c, .opt = &c->pt.run, .steps = c->pt.steps};
    cai_mesh_config_init(&r.mesh);
    r.mesh.layout = *layout;
    r.mesh.watchdog_timeout_s = c->pt.watchdog;
    return r;
}

/* The layout and the model's shape, before any allocation, alike on every rank. */
static cai_status check_config(const moe_app_config *c, int world, cai_layout *L) {
    const pt_config *p = &c->pt;
    *L = (cai_layout){1, p->dp ? p->dp : (world % p->tp ? 0 : world / p->tp), c->ep, 1, p->tp, NULL};
    cai_layout_model lm = {p->n_heads, p->n_kv_heads, p->n_layers, c->n_experts, 0, 0};
    CAI_CALL(cai_layout_validate(world, L, &lm));
    if (c->ep > 1 && p->tr.zero_stage == 0 && p->tr.zero_offload)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "zero.offload at mesh.ep=%d needs zero.stage 1, 2 or 3 (stage 0 steps the model's own "
                         "buffers under the expert-parallel driver)",
                         c->ep);
    CAI_CALL(tc_check(&p->tr, p->steps));
    cai_run_config rc = run_config(c, L);
    CAI_CALL(cai_run_check(&rc));
    cai_model_config m = model_config(c, p->vocab_size > 0 ? p->vocab_size : CAI_BYTE_VOCAB), resolved;
    CAI_CALL(cai_model_config_resolve(&m, &resolved));
    return cai_moe_config_check(&resolved.moe, resolved.d_model, c->ep);
}

typedef struct {
    const moe_app_config *cfg;
    tc_engine eng;
    cai_moe_exchange ex;
    int moe_driver; /* eng.driver is cai_moe_driver_create's */
    pt_data data;
    cai_moe_stats *local, *st;
    int64_t *loads;
} moe_job;

static cai_rank_view job_view(cai_run_t *run) {
    cai_rank_view v = cai_run_view(run);
    v.ep_size = cai_mesh_size(cai_run_mesh(run), CAI_AXIS_EP);
    v.ep_rank = cai_mesh_rank(cai_run_mesh(run), CAI_AXIS_EP);
    return v;
}

/* The step's router statistics over dp into metrics.jsonl. Collective over dp. */
static cai_status router_record(moe_job *j, cai_run_t *run, int64_t step) {
    int n = 0;
    const int E = j->cfg->n_experts;
    CAI_CALL(cai_model_moe_stats_take(j->eng.model, j->local, j->loads, j->cfg->pt.n_layers, &n));
    if (n == 0) return CAI_OK;
    CAI_CALL(cai_moe_stats_reduce(cai_run_mesh(run), CAI_AXIS_DP, j->local, j->loads, n, j->st));
    double cv = 0, aux = 0, z = 0, lmin = 1e300, lmax = 0;
    int64_t dropped = 0, assigned = 0;
    for (int l = 0; l < n; l++) {
        cv += j->st[l].load_cv / n;
        aux += j->st[l].aux_loss;
        z += j->st[l].z_loss;
        lmin = fmin(lmin, (double)j->st[l].load_min);
        lmax = fmax(lmax, (double)j->st[l].load_max);
        dropped += j->st[l].dropped;
        assigned += j->st[l].assignments;
    }
    const double mean = (double)assigned / ((double)n * E);
    cai_run_json(run,
                 "\"kind\":\"moe\",\"step\":%lld,\"layers\":%d,\"tokens_per_expert_min\":%.0f,"
                 "\"tokens_per_expert_max\":%.0f,\"tokens_per_expert_mean\":%.1f,\"cv\":%.6f,\"cv_layer0\":%.6f,"
                 "\"dropped_fraction\":%.6f,\"aux_loss\":%.9g,\"z_loss\":%.9g",
                 (long long)step, n, lmin, lmax, mean, cv, j->st[0].load_cv,
                 assigned > 0 ? (double)dropped / (double)assigned : 0.0, aux, z);
    return CAI_OK;
}

static cai_status step_hook(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *st) {
    moe_job *j = ctx;
    CAI_CALL(pt_data_next(&j->data));
    CAI_CALL(tc_engine_step(&j->eng, run, step, j->data.tokens, j->data.targets, j->cfg->pt.grad_accum, st));
    return router_record(j, run, step);
}

/* Mean validation loss over eval.batches global batches. Collective over the world. */
static cai_status eval_hook(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran) {
    moe_job *j = ctx;
    (void)step;
    cai_mesh_t *mesh = cai_run_mesh(run);
    *ran = j->data.valid_samples > 0;
    if (!*ran) return CAI_OK;
    int B = 0, T = 0;
    cai_model_shape(j->eng.model, &B, &T);
    const size_t per = (size_t)B * (size_t)T;
    double sum = 0;
    for (int b = 0; b < j->cfg->pt.eval_batches; b++) {
        CAI_CALL(pt_data_valid_batch(&j->data, b, cai_mesh_rank(mesh, CAI_AXIS_DP)));
        for (int k = 0; k < j->cfg->pt.grad_accum; k++) {
            float l = 0;
            CAI_CALL(cai_model_forward(j->eng.model, j->data.tokens + (size_t)k * per,
                                       j->data.targets + (size_t)k * per, &l));
            sum += l;
        }
    }
    sum /= (double)j->cfg->pt.eval_batches * j->cfg->pt.grad_accum;
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_AVG));
    *loss = sum;
    return CAI_OK;
}

static cai_status save_hook(void *ctx, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                            size_t cap, cai_ckpt_stats *st) {
    moe_job *j = ctx;
    m->consumed_samples = cai_sampler_consumed(j->data.sampler);
    m->data_seed = (uint64_t)j->cfg->pt.data_seed;
    m->rng_seed = (uint64_t)j->cfg->pt.model_seed;
    return tc_engine_save(&j->eng, run, m, dir, keep, path, cap, st);
}

static cai_status load_hook(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    moe_job *j = ctx;
    CAI_CALL(tc_engine_load(&j->eng, run, path, m, st));
    return pt_data_seek(&j->data, &j->cfg->pt, cai_run_mesh(run), m->consumed_samples);
}

/* Model (experts of this ep rank), optimizer, engine and, at ep > 1 with
 * ZeRO stage 0, the expert-parallel driver (the engine then only holds
 * buckets it never reduces). The engine's creation is collective over dp. */
static cai_status build(moe_job *j, cai_run_t *run, int64_t vocab) {
    const moe_app_config *c = j->cfg;
    cai_model_config m = model_config(c, vocab), resolved;
    tc_apply_precision(&c->pt.tr, cai_run_device(run), &m);
    CAI_CALL(cai_model_config_resolve(&m, &resolved));
    cai_model_options mo = cai_model_options_default(&resolved);
    mo.batch = c->pt.micro_batch;
    mo.seq_len = c->pt.seq_len;
    mo.view = job_view(run);
    mo.mesh = cai_run_mesh(run);
    CAI_CALL(cai_moe_ep_exchange_init(&j->ex, cai_run_mesh(run)));
    mo.moe_exchange = &j->ex;
    CAI_CALL(tc_engine_create(&j->eng, run, &c->pt.tr, c->pt.steps, &resolved, &mo, NULL, NULL));
    j->moe_driver = mo.view.ep_size > 1 && j->eng.zc.reduce_only;
    if (j->moe_driver) CAI_CALL(cai_moe_driver_create(j->eng.model, j->eng.optim, cai_run_mesh(run), &j->eng.driver));
    CAI_CALL(tc_engine_ready(&j->eng, run, &c->pt.tr, &resolved, !j->moe_driver));
    const size_t L = (size_t)c->pt.n_layers;
    CAI_CALL(cai_calloc((void **)&j->local, L, sizeof *j->local, "moe statistics"));
    CAI_CALL(cai_calloc((void **)&j->st, L, sizeof *j->st, "moe statistics"));
    CAI_CALL(cai_calloc((void **)&j->loads, L * (size_t)c->n_experts, sizeof *j->loads, "moe statistics"));
    return CAI_OK;
}

static void job_free(moe_job *j) {
    if (j->moe_driver) cai_moe_driver_free(&j->eng.driver);
    tc_engine_free(&j->eng);
    cai_moe_ep_exchange_free(&j->ex);
    pt_data_free(&j->data);
    cai_free(j->local);
    cai_free(j->st);
    cai_free(j->loads);
}

static void print_header(moe_job *j, cai_run_t *run, const cai_app *app) {
    const moe_app_config *c = j->cfg;
    const cai_model_config *mc = cai_model_config_of(j->eng.model);
    char layout[128];
    cai_layout_str(cai_mesh_layout(cai_run_mesh(run)), layout, sizeof layout);
    const double total = (double)cai_registry_global_numel(cai_model_registry(j->eng.model));
    printf("colossal-moe %s: %d rank%s, %s\n", cai_version_string(), app->size, app->size == 1 ? "" : "s", layout);
    printf(
        "model: llama with experts, %d layers (every %d-th block MoE), d_model %d, %d heads (%d kv), vocab %d: "
        "%.2fM parameters\n",
        mc->n_layers, mc->moe_every, mc->d_model, mc->n_heads, mc->n_kv_heads, mc->vocab_size, total / 1e6);
    printf(
        "moe: %d experts (%d per ep rank) of ffn %d, top-%d %s router, %s routing, %d shared, aux %g, z %g; "
        "router statistics per step in metrics.jsonl\n",
        mc->moe.n_experts, mc->moe.n_experts / c->ep, mc->moe.ffn, mc->moe.top_k, cai_moe_router_name(mc->moe.router),
        cai_moe_routing_name(mc->moe.routing), mc->moe.n_shared, (double)mc->moe.aux_coef, (double)mc->moe.z_coef);
    printf("data: %s\n", j->data.source);
    printf("batch: %lld sequences x %d tokens per step; %s driver\n", (long long)j->data.global_batch, c->pt.seq_len,
           j->eng.driver.name);
    tc_engine_print_optim(&j->eng);
    printf("run dir: %s (config.yaml, metrics.jsonl)\n", c->pt.run.dir);
    fflush(stdout);
}

int main(int argc, char **argv) {
    cai_run_signals_install();
    fill_choices();
    moe_app_config cfg;
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(moe_app_config, pt.common));
    cfg.pt.family = CAI_MODEL_LLAMA;
    cfg.pt.pp = cfg.pt.sp = 1;
    cai_layout layout;
    cai_app_check_all(check_config(&cfg, app.size, &layout), 2);

    cai_run_t *run = NULL;
    cai_run_config rc = run_config(&cfg, &layout);
    cai_app_check_all(cai_run_init(&run, &rc, MPI_COMM_WORLD), 1);
    moe_job job = {.cfg = &cfg};
    int64_t vocab = 0;
    cai_app_check_all(pt_data_init(&job.data, &cfg.pt, cai_run_mesh(run), &vocab), 1);
    cai_app_check(build(&job, run, vocab));
    cai_run_hooks hooks = {&job, step_hook, eval_hook, save_hook, load_hook};
    cai_app_check_all(cai_run_resume(run, &hooks), 1);
    cai_app_check(cai_run_start(run, job.eng.model, cfg.pt.seq_len, job.data.global_batch * cfg.pt.seq_len));
    if (app.rank == 0) print_header(&job, run, &app);
    cai_app_check(cai_run_train(run, &hooks, cfg.pt.eval_interval));
    cai_app_check(cai_run_finish(run));
    int exit_code = cai_run_exit_code(run);
    job_free(&job);
    cai_run_free(run);
    int rc_final = cai_app_finalize(&k_schema, &cfg);
    return exit_code ? exit_code : rc_final;
}

/* colossal-pretrain: train a GPT-2 or Llama model from scratch, data
 * parallel over the mesh's dp axis.
 *
 *   mpirun -np N colossal-pretrain --config examples/pretrain-tiny.yaml [--key=value ...]
 *
 * Every rank trains on its slice of each global batch (micro_batch x
 * grad_accum sequences); gradients are reduced over dp in buckets while the
 * backward runs; AdamW steps with the LR schedule and clipping; zero.stage,
 * zero.offload and precision shard the state, move it to the host and train
 * in bf16/f16. The run module does the rest of the job (signals, memory
 * plan, checkpoints and resume, metrics.jsonl); greedy samples close a run
 * that finished. See docs/pretrain.md, docs/run.md and docs/parallel.md. */
#include "cai_config.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/ckpt.h"
#include "colossal/parallel.h"
#include "colossal/run.h"
#include "colossal/seq_parallel.h"
#include "pretrain.h"

/* ------------------------------------------------------------------ config */

/* Filled from the library's own names before parsing, so a family or
 * schedule added there is accepted here without an edit. */
static const char *k_families[CAI_MODEL_FAMILY_COUNT + 1];
/* Index == cai_dtype for the first three. */
static const char *const k_dtypes[] = {"f32", "bf16", "f16", NULL};
static const char *const k_tie[] = {"auto", "false", "true", NULL};
static const char *const k_sp_modes[] = {"off", "split_gather", "all_to_all", "ring", NULL}; /* pt_config.sp_mode */
enum { SP_SPLIT_GATHER = 1, SP_ALL_TO_ALL = 2, SP_RING = 3 };

/* Ulysses or ring: the sequence is sharded over the mesh's sp axis. */
static int sp_sharded(const pt_config *c) { return c->sp_mode >= SP_ALL_TO_ALL; }
static cai_sp_mode sp_kind(const pt_config *c) { return c->sp_mode == SP_RING ? CAI_SP_RING : CAI_SP_ULYSSES; }
/* The attention problem the sp ranks share: the layers' n_heads/tp heads. */
static cai_sp_attn_shape sp_shape(const pt_config *c, const cai_model_config *m) {
    return (cai_sp_attn_shape){c->micro_batch,          c->seq_len, m->n_heads / c->tp, m->n_kv_heads / c->tp,
                               m->d_model / m->n_heads, c->sp};
}
/* Tokens of each sequence one rank's model holds. */
static int local_seq_len(const pt_config *c) { return sp_sharded(c) ? c->seq_len / c->sp : c->seq_len; }

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(pt_config, field), def, doc, __VA_ARGS__, NULL, NULL }
#define E(key, field, def, doc, choices) \
    { key, CAI_CFG_ENUM, offsetof(pt_config, field), def, doc, CAI_CFG_NO_RANGE, choices, NULL }
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)
#define BIG 1e15

static const cai_config_field k_fields[] = {
    E("model.family", family, "gpt2", "gpt2 (LayerNorm, GELU, learned positions) or llama (RMSNorm, SwiGLU, RoPE)",
      k_families),
    F("model.n_layers", CAI_CFG_INT, n_layers, "4", "transformer blocks", 1, 1024),
    F("model.d_model", CAI_CFG_INT, d_model, "128", "hidden size", 8, 1 << 16),
    F("model.n_heads", CAI_CFG_INT, n_heads, "4", "attention heads (must divide d_model)", 1, 4096),
    F("model.n_kv_heads", CAI_CFG_INT, n_kv_heads, "0",
      "key/value heads for grouped-query attention (llama); 0: n_heads", 0, 4096),
    F("model.ffn_hidden", CAI_CFG_INT, ffn_hidden, "0", "MLP hidden size; 0: 4*d_model (gpt2), 8/3*d_model (llama)", 0,
      1 << 20),
    F("model.vocab_size", CAI_CFG_INT, vocab_size, "0", "vocabulary; 0: the tokenizer's", 0, 1 << 24),
    F("model.vocab_multiple", CAI_CFG_INT, vocab_multiple, "0", "pad embedding rows to a multiple of this; 0: 128", 0,
      1 << 16),
    E("model.tie_embeddings", tie, "auto", "share the token embedding with the LM head (auto: gpt2 yes, llama no)",
      k_tie),
    F("model.rope_theta", CAI_CFG_DOUBLE, rope_theta, "0", "RoPE base (llama); 0: 10000", 0, 1e12),
    F("model.norm_eps", CAI_CFG_DOUBLE, norm_eps, "0", "norm epsilon; 0: 1e-5", 0, 1),
    F("model.init_std", CAI_CFG_DOUBLE, init_std, "0", "N(0, std^2) init, residual projections scaled; 0: 0.02", 0, 10),
    F("model.seed", CAI_CFG_INT64, model_seed, "1234", "parameter initialisation seed", 0, BIG),
    E("model.param_dtype", param_dtype, "f32", "working copy of the weights: f32, bf16 or f16 (masters stay f32)",
      k_dtypes),
    E("model.act_dtype", act_dtype, "f32", "activations and compute: f32, bf16 or f16", k_dtypes),
    F("model.activation_checkpointing", CAI_CFG_BOOL, act_ckpt, "false",
      "keep only each layer's input and recompute it in backward", CAI_CFG_NO_RANGE),

    F("mesh.dp", CAI_CFG_INT, dp, "0", "data-parallel ranks; 0: world / (tp*pp*sp)", 0, 1 << 20),
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tensor-parallel ranks (Megatron-style: heads, MLP and vocabulary split)", 1,
      1 << 20),
    F("mesh.pp", CAI_CFG_INT, pp, "1",
      "pipeline stages (train.grad_accum microbatches go through the pipeline; composes with dp, tp and ZeRO stage "
      "0/1)",
      1, 1 << 20),
    TC_PP_FIELDS(pt_config, pp_schedule, pp_virtual, pp_layers, pp_slots),
    F("pp.trace", CAI_CFG_STRING, pp_trace, "",
      "mesh.pp > 1: write the last step's measured pipeline timeline here (Chrome trace JSON) and print its bubble "
      "beside the schedule's",
      CAI_CFG_NO_RANGE),
    F("mesh.sp", CAI_CFG_INT, sp, "1",
      "sequence-parallel ranks: each holds seq_len/sp tokens of every sequence (mesh.sp_mode all_to_all or ring)", 1,
      1 << 20),
    E("mesh.sp_mode", sp_mode, "off",
      "sequence parallelism: off; split_gather (Megatron's, over the tp ranks: the residual stream and norms hold "
      "micro_batch*seq_len/tp tokens per rank; needs mesh.tp > 1); all_to_all (Ulysses) or ring (ring attention, "
      "zigzag split) over the mesh.sp ranks",
      k_sp_modes),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, watchdog, "300",
      "seconds a collective may stall before every rank aborts naming the late one; 0: off", 0, 1e9),

    F("train.steps", CAI_CFG_INT64, steps, "400", "optimizer steps", 1, BIG),
    F("train.micro_batch", CAI_CFG_INT, micro_batch, "8", "sequences per forward on each rank", 1, 1 << 20),
    F("train.grad_accum", CAI_CFG_INT, grad_accum, "1", "microbatches per step on each rank", 1, 1 << 20),
    F("train.seq_len", CAI_CFG_INT, seq_len, "128", "tokens per sequence (also the model's maximum)", 2, 1 << 20),
    F("train.seed", CAI_CFG_INT64, data_seed, "1234", "sample order seed", 0, BIG),

    TC_OPTIM_FIELDS(pt_config, tr, "1e-3", "1e-4"),

    TC_ZERO_FIELDS(pt_config, tr),

    F("eval.interval", CAI_CFG_INT64, eval_interval, "100", "validate every this many steps and at the end; 0: never",
      0, BIG),
    F("eval.batches", CAI_CFG_INT, eval_batches, "4", "global batches per validation", 1, 1 << 20),

    S("data.path", data_path, "",
      "Megatron data path: PREFIX or \"W1 PREFIX1 W2 PREFIX2\" (.bin/.idx); empty: the embedded corpus"),
    S("data.split", split, "98,2,0", "train,valid,test weights over each prefix's documents"),
    S("data.tokenizer", tokenizer, "",
      "directory with vocab.json and merges.txt; empty: byte-level, or BPE trained on the embedded corpus"),
    S("data.eod", eod, "<|endoftext|>", "BPE special token that ends every document"),
    F("data.corpus_docs", CAI_CFG_INT64, corpus_docs, "20000", "embedded corpus: documents to generate", 1, BIG),
    F("data.corpus_seed", CAI_CFG_INT64, corpus_seed, "1234", "embedded corpus: generator seed", 0, BIG),
    F("data.corpus_vocab", CAI_CFG_INT, corpus_vocab, "1000",
      "embedded corpus: train a BPE tokenizer of this many tokens on it; 0: byte-level", 0, 1 << 24),
    F("data.corpus_split_digits", CAI_CFG_BOOL, corpus_split_digits, "false",
      "embedded corpus tokenizer: every digit its own pre-token, never merged (HF Digits(individual_digits))",
      CAI_CFG_NO_RANGE),

    S("generate.prompts", prompts,
      "Once upon a time,|Q: What is 7 times 8? A:", "prompts for the greedy samples at the end, separated by |"),
    F("generate.tokens", CAI_CFG_INT, gen_tokens, "48", "tokens per sample; 0: no samples", 0, 1 << 20),

    CAI_RUN_FIELDS(pt_config, run, "runs/pretrain"),
    CAI_APP_COMMON_FIELDS(pt_config, common),
};
#undef F
#undef E
#undef S
#undef BIG

static const cai_config_schema k_schema = {"colossal-pretrain",
                                           "train a GPT-2 or Llama model from scratch, data parallel", k_fields,
                                           CAI_CFG_NFIELDS(k_fields)};

static void fill_choices(void) {
    for (int i = 0; i < CAI_MODEL_FAMILY_COUNT; i++) k_families[i] = cai_model_family_name((cai_model_family)i);
    tc_fill_choices();
}

static cai_model_config model_config(const pt_config *c, int64_t vocab) {
    cai_model_config m = cai_model_config_default((cai_model_family)c->family);
    m.vocab_size = (int)vocab;
    m.vocab_multiple = c->vocab_multiple;
    m.n_layers = c->n_layers;
    m.d_model = c->d_model;
    m.n_heads = c->n_heads;
    m.n_kv_heads = c->n_kv_heads;
    m.ffn_hidden = c->ffn_hidden;
    m.max_seq_len = c->seq_len;
    m.rope_theta = (float)c->rope_theta;
    m.norm_eps = (float)c->norm_eps;
    m.init_std = (float)c->init_std;
    if (c->tie != PT_TIE_AUTO) m.tie_embeddings = c->tie == PT_TIE_TRUE;
    m.seed = (uint64_t)c->model_seed;
    m.param_dtype = (cai_dtype)c->param_dtype;
    m.act_dtype = (cai_dtype)c->act_dtype;
    m.activation_checkpointing = c->act_ckpt;
    return m;
}

static cai_run_config run_config(const pt_config *c, const cai_layout *layout) {
    cai_run_config r = {
        .program = "colossal-pretrain", .schema = &k_schema, .app_cfg = c, .opt = &c->run, .steps = c->steps};
    cai_mesh_config_init(&r.mesh);
    r.mesh.layout = *layout;
    r.mesh.watchdog_timeout_s = c->watchdog;
    r.mesh.nccl_overlap_ctas = c->tr.zero_overlap_ctas;
    return r;
}

static tc_pp_options pp_options(const pt_config *c) {
    return (tc_pp_options){c->pp, c->pp_schedule, c->pp_virtual, c->pp_slots, c->pp_layers};
}

/* Everything decided from the config alone, identically on every rank and
 * before any data preparation or allocation: the layout, the loss scaling,
 * the optimizer, the run's options, the model's shape (only the vocabulary
 * waits for the tokenizer). */
static cai_status check_config(const pt_config *c, int world, cai_layout *L) {
    int rest = c->tp * c->pp * c->sp;
    *L = (cai_layout){c->pp, c->dp ? c->dp : (world % rest ? 0 : world / rest), 1, c->sp, c->tp, NULL};
    /* the layer split over pipeline stages is tc_pp_layout's (pp.layers may be uneven) */
    cai_layout_model lm = {c->n_heads, c->n_kv_heads, c->pp > 1 ? 0 : c->n_layers, 0, 0, 0};
    CAI_CALL(cai_layout_validate(world, L, &lm));
    if (c->sp > 1 && !sp_sharded(c))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "mesh.sp=%d shards each sequence over its own axis: set mesh.sp_mode=all_to_all or ring "
                         "(mesh.sp_mode=%s; split_gather splits over the tp ranks, with mesh.sp=1)",
                         c->sp, k_sp_modes[c->sp_mode]);
    if (sp_sharded(c) && c->sp < 2)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "mesh.sp_mode=%s shards each sequence over mesh.sp ranks; mesh.sp=%d (set >= 2)",
                         k_sp_modes[c->sp_mode], c->sp);
    if (sp_sharded(c) && c->pp > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "mesh.sp_mode=%s composes with dp, tp and ZeRO; not with mesh.pp=%d (the pipeline executor "
                         "drives whole sequences)",
                         k_sp_modes[c->sp_mode], c->pp);
    if (c->pp > 1 && (c->tr.zero_stage > 1 || c->tr.zero_offload || c->sp_mode))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "mesh.pp=%d composes with dp and tp at ZeRO stage 0 or 1 without offload and sp_mode: "
                         "zero.stage=%d zero.offload=%s mesh.sp_mode=%s (stages 2/3 reduce and gather per microbatch "
                         "inside the engine's own loop)",
                         c->pp, c->tr.zero_stage, c->tr.zero_offload ? "true" : "false", k_sp_modes[c->sp_mode]);
    if (c->pp > 1) {
        const tc_pp_options po = pp_options(c);
        CAI_CALL(tc_pp_layout(&po, c->n_layers, c->grad_accum, c->act_ckpt, NULL, NULL));
    }
    CAI_CALL(tc_check(&c->tr, c->steps));
    cai_run_config rc = run_config(c, L);
    CAI_CALL(cai_run_check(&rc));
    cai_model_config m = model_config(c, c->vocab_size > 0 ? c->vocab_size : CAI_BYTE_VOCAB), resolved;
    CAI_CALL(cai_model_config_resolve(&m, &resolved));
    if (resolved.ffn_hidden % c->tp != 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "mesh.tp=%d does not divide model.ffn_hidden=%d (the MLP splits over tp)",
                         c->tp, resolved.ffn_hidden);
    if (c->sp_mode == SP_SPLIT_GATHER && c->tp < 2)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "mesh.sp_mode=%s splits the sequence over the tensor-parallel ranks; mesh.tp=%d has none to "
                         "split it over (set mesh.tp >= 2, or mesh.sp_mode=off)",
                         k_sp_modes[c->sp_mode], c->tp);
    if (c->sp_mode == SP_SPLIT_GATHER && ((int64_t)c->micro_batch * c->seq_len) % c->tp != 0)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "mesh.sp_mode=%s: mesh.tp=%d does not divide the train.micro_batch*train.seq_len = %d*%d "
                         "tokens of a microbatch",
                         k_sp_modes[c->sp_mode], c->tp, c->micro_batch, c->seq_len);
    if (sp_sharded(c)) {
        /* The layers hold n_heads/tp query heads; Ulysses splits those. */
        cai_sp_attn_shape s = sp_shape(c, &resolved);
        cai_status st = sp_kind(c) == CAI_SP_RING ? cai_ring_attn_validate(&s) : cai_ulysses_validate(&s);
        if (st != CAI_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", cai_error_message());
            cai_error_clear();
            return CAI_ERROR(CAI_ERR_CONFIG, "mesh.sp=%d mesh.sp_mode=%s train.seq_len=%d mesh.tp=%d: %s", c->sp,
                             k_sp_modes[c->sp_mode], c->seq_len, c->tp, why);
        }
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ the job's state and hooks */

typedef struct {
    const pt_config *cfg;
    tc_engine eng;
    cai_pipeline_t *pipe; /* mesh.pp > 1: the driver runs the schedule; the engine only saves and loads */
    pt_data data;
    tc_pp pp; /* mesh.pp > 1 */
    /* mesh.sp_mode all_to_all / ring: the model's attention over the sp
     * axis and this rank's shard of the batch's tokens and targets */
    cai_sp_attention sp_att;
    int32_t *sp_tokens, *sp_targets;
} pt_job;

/* This rank's seq_len/sp tokens of each of `rows` sequences (its zigzag
 * chunks under ring), or the batch itself without a sharded sequence. */
static cai_status sp_shard(pt_job *j, cai_run_t *run, int64_t rows, const int32_t **tokens, const int32_t **targets) {
    const pt_config *c = j->cfg;
    if (!sp_sharded(c)) return CAI_OK;
    cai_mesh_t *mesh = cai_run_mesh(run);
    const int r = cai_mesh_rank(mesh, CAI_AXIS_SP);
    CAI_CALL(cai_sp_shard_rows(sp_kind(c), *tokens, rows, c->seq_len, c->sp, r, j->sp_tokens));
    CAI_CALL(cai_sp_shard_rows(sp_kind(c), *targets, rows, c->seq_len, c->sp, r, j->sp_targets));
    *tokens = j->sp_tokens;
    *targets = j->sp_targets;
    return CAI_OK;
}

/* This rank's view: the mesh's, with the pipeline's chunks and layer split. */
static cai_status job_view(pt_job *j, cai_run_t *run, cai_rank_view *v) {
    const pt_config *c = j->cfg;
    *v = cai_run_view(run);
    if (c->pp <= 1) return CAI_OK;
    if (!j->pp.stage_of) {
        const tc_pp_options po = pp_options(c);
        CAI_CALL(tc_pp_init(&j->pp, &po, c->n_layers, c->grad_accum, c->act_ckpt, v->pp_rank));
    }
    tc_pp_view(&j->pp, v);
    return CAI_OK;
}

static cai_status step_hook(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *st) {
    pt_job *j = ctx;
    cai_timer_begin("pretrain: data");
    CAI_CALL(pt_data_next(&j->data));
    const int32_t *tokens = j->data.tokens, *targets = j->data.targets;
    CAI_CALL(sp_shard(j, run, j->data.local_batch, &tokens, &targets));
    cai_timer_end("pretrain: data");
    cai_timer_begin("pretrain: step");
    CAI_CALL(tc_engine_step(&j->eng, run, step, tokens, targets, j->cfg->grad_accum, st));
    cai_timer_end("pretrain: step");
    return CAI_OK;
}

/* Mean loss over eval.batches global batches of the validation split.
 * Collective over the dp axis. */
static cai_status eval_hook(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran) {
    pt_job *j = ctx;
    cai_mesh_t *mesh = cai_run_mesh(run);
    *ran = j->data.valid_samples > 0;
    if (!*ran) return CAI_OK;
    int B = 0, T = 0;
    cai_model_shape(j->eng.model, &B, &T);
    size_t per = (size_t)B * (size_t)T;
    double sum = 0;
    cai_timer_begin("pretrain: validation");
    for (int b = 0; b < j->cfg->eval_batches; b++) {
        CAI_CALL(pt_data_valid_batch(&j->data, b, cai_mesh_rank(mesh, CAI_AXIS_DP)));
        const int32_t *tokens = j->data.tokens, *targets = j->data.targets;
        CAI_CALL(sp_shard(j, run, j->data.local_batch, &tokens, &targets));
        if (j->pipe) {
            double l = 0;
            CAI_CALL(cai_pipeline_eval(j->pipe, j->data.tokens, j->data.targets, j->cfg->grad_accum, &l));
            sum += l * j->cfg->grad_accum;
            continue;
        }
        for (int k = 0; k < j->cfg->grad_accum; k++) {
            float l = 0;
            CAI_CALL(cai_model_forward(j->eng.model, tokens + (size_t)k * per, targets + (size_t)k * per, &l));
            sum += l;
        }
    }
    sum /= (double)j->cfg->eval_batches * j->cfg->grad_accum;
    /* Each rank's mean over its tokens; ranks sharing a sequence hold equal counts. */
    CAI_CALL(cai_allreduce(mesh, sp_sharded(j->cfg) ? CAI_AXIS_DP_SP : CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64,
                           CAI_RED_AVG));
    cai_timer_end("pretrain: validation");
    *loss = sum;
    return CAI_OK;
}

static cai_status save_hook(void *ctx, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                            size_t cap, cai_ckpt_stats *st) {
    pt_job *j = ctx;
    m->consumed_samples = cai_sampler_consumed(j->data.sampler);
    m->data_seed = (uint64_t)j->cfg->data_seed;
    m->rng_seed = (uint64_t)j->cfg->model_seed;
    return tc_engine_save(&j->eng, run, m, dir, keep, path, cap, st);
}

/* Any layout: the optimizer state reshards onto this run's dp, stage and offload. */
static cai_status load_hook(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    pt_job *j = ctx;
    CAI_CALL(tc_engine_load(&j->eng, run, path, m, st));
    CAI_CALL(pt_data_seek(&j->data, j->cfg, cai_run_mesh(run), m->consumed_samples));
    if (m->data_seed != (uint64_t)j->cfg->data_seed)
        CAI_WARN("%s was trained with train.seed=%llu, this run uses %lld: the sample order changes from here", path,
                 (unsigned long long)m->data_seed, (long long)j->cfg->data_seed);
    return CAI_OK;
}

/* ------------------------------------------------------------------ building */

/* The model's final config (the tokenizer's vocabulary, the precision) and
 * its memory plan, printed and checked against train.mem_limit before
 * anything is allocated. Decided alike on every rank. */
static cai_status plan(pt_job *j, cai_run_t *run, int64_t vocab, cai_model_config *resolved) {
    const pt_config *c = j->cfg;
    cai_model_config m = model_config(c, vocab);
    tc_apply_precision(&c->tr, cai_run_device(run), &m);
    CAI_CALL(cai_model_config_resolve(&m, resolved));
    cai_rank_view view;
    CAI_CALL(job_view(j, run, &view));
    cai_mem_plan_request q = {.model = *resolved,
                              .batch = c->micro_batch,
                              .seq_len = local_seq_len(c),
                              .view = view,
                              .seq_parallel = c->sp_mode == SP_SPLIT_GATHER,
                              .dp = cai_mesh_size(cai_run_mesh(run), sp_sharded(c) ? CAI_AXIS_DP_SP : CAI_AXIS_DP),
                              .zero = tc_zero_config(&c->tr),
                              .dev = cai_run_device(run),
                              .pp_inflight = j->pp.slots,
                              .pp_microbatches = c->pp > 1 ? c->grad_accum : 0,
                              .pp_split = c->pp > 1 && tc_pp_split_backward(&j->pp)};
    const cai_fp8_config f8 = tc_fp8_config(&c->tr);
    q.fp8 = &f8;
    if (c->pp > 1) CAI_CALL(cai_pipeline_boundaries_shared(cai_run_mesh(run), cai_run_device(run), &q.pp_shared));
    if (sp_sharded(c)) {
        const cai_sp_attn_shape s = sp_shape(c, resolved);
        CAI_CALL(sp_kind(c) == CAI_SP_RING ? cai_ring_attn_workspace_bytes(cai_run_device(run), &s, &q.seq_attn_bytes)
                                           : cai_ulysses_workspace_bytes(cai_run_device(run), &s, &q.seq_attn_bytes));
    }
    return cai_run_plan_memory(run, &q);
}

/* Model, optimizer, ZeRO engine and loss scaler. This rank's allocations;
 * the engine's creation is collective over dp. */
static cai_status build(pt_job *j, cai_run_t *run, const cai_model_config *resolved) {
    const pt_config *c = j->cfg;
    cai_model_options mo = cai_model_options_default(resolved);
    mo.batch = c->micro_batch;
    mo.seq_len = local_seq_len(c);
    CAI_CALL(job_view(j, run, &mo.view));
    mo.act_slots = j->pp.slots;
    mo.split_backward = c->pp > 1 && tc_pp_split_backward(&j->pp);
    mo.mesh = cai_run_mesh(run);
    mo.seq_parallel = c->sp_mode == SP_SPLIT_GATHER;
    CAI_CALL(tc_engine_create(&j->eng, run, &c->tr, c->steps, resolved, &mo, NULL, NULL));
    if (sp_sharded(c)) {
        cai_mesh_t *mesh = cai_run_mesh(run);
        const int Tl = local_seq_len(c);
        cai_sp_attn_shape s = sp_shape(c, resolved);
        CAI_CALL(cai_sp_attention_init(&j->sp_att, mesh, CAI_AXIS_SP, cai_run_device(run), sp_kind(c), &s));
        const size_t n = (size_t)j->data.local_batch * (size_t)Tl;
        CAI_CALL(cai_malloc((void **)&j->sp_tokens, n * sizeof(int32_t), "sequence shard tokens"));
        CAI_CALL(cai_malloc((void **)&j->sp_targets, n * sizeof(int32_t), "sequence shard targets"));
        int32_t *pos = j->sp_tokens; /* the positions pass through the model's own copy */
        CAI_CALL(cai_sp_positions(sp_kind(c), c->seq_len, c->sp, cai_mesh_rank(mesh, CAI_AXIS_SP), pos));
        CAI_CALL(cai_model_set_seq_attention(j->eng.model, &j->sp_att.hook, pos));
    }
    if (c->pp > 1) {
        CAI_CALL(cai_pipeline_create(&j->pipe, cai_run_mesh(run), j->eng.model, (cai_pp_style)c->pp_schedule));
        CAI_CALL(cai_pipeline_set_zero(j->pipe, j->eng.zero));
        cai_pipeline_set_trace(j->pipe, c->pp_trace && c->pp_trace[0]);
        CAI_CALL(cai_pipeline_driver(j->pipe, j->eng.optim, &j->eng.driver));
    }
    CAI_CALL(tc_engine_ready(&j->eng, run, &c->tr, resolved, c->pp <= 1));
    return CAI_OK;
}

static void job_free(pt_job *j) {
    cai_free(j->sp_tokens);
    cai_free(j->sp_targets);
    tc_pp_free(&j->pp);
    cai_pipeline_free(j->pipe);
    tc_engine_free(&j->eng);
    cai_sp_attention_free(&j->sp_att);
    pt_data_free(&j->data);
}

static void print_header(pt_job *j, cai_run_t *run, const cai_app *app) {
    const pt_config *c = j->cfg;
    const cai_model_config *mc = cai_model_config_of(j->eng.model);
    cai_mesh_t *mesh = cai_run_mesh(run);
    size_t pbytes = 0, abytes = 0;
    cai_model_memory(j->eng.model, &pbytes, &abytes);
    char layout[128];
    cai_layout_str(cai_mesh_layout(mesh), layout, sizeof layout);
    uint64_t nparams = cai_registry_global_numel(cai_model_registry(j->eng.model));
    const int dp = cai_mesh_size(mesh, CAI_AXIS_DP);
    const int64_t tokens_per_step = j->data.global_batch * c->seq_len;
    double fpt = 0, peak = 0;
    int64_t mparams = 0;
    cai_run_flops(run, &fpt, &mparams, &peak);
    printf("colossal-pretrain %s: %d rank%s on %d node%s, %s, device %s\n", cai_version_string(), app->size,
           app->size == 1 ? "" : "s", app->n_nodes, app->n_nodes == 1 ? "" : "s", layout, cai_run_device(run)->name);
    /* Under ZeRO stages >= 1 the engine holds weights and gradients: the memory plan above counts them. */
    if (cai_model_external_params(j->eng.model)) pbytes = 0;
    printf(
        "model: %s, %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d (padded %lld), %s%s: %.2fM "
        "parameters; per rank %.1f MiB weights+grads in the model, %.1f MiB activations\n",
        cai_model_family_name(mc->family), mc->n_layers, mc->d_model, mc->n_heads, mc->n_kv_heads, mc->ffn_hidden,
        mc->vocab_size, (long long)cai_model_padded_vocab(j->eng.model), mc->tie_embeddings ? "tied" : "untied",
        mc->activation_checkpointing ? ", activation checkpointing" : "", (double)nparams / 1e6,
        (double)pbytes / 1048576.0, (double)abytes / 1048576.0);
    printf("data: %s\n", j->data.source);
    printf(
        "batch: %lld sequences x %d tokens = %lld tokens per step (micro_batch %d x grad_accum %d x dp %d); "
        "%lld steps = %.2fM tokens\n",
        (long long)j->data.global_batch, c->seq_len, (long long)tokens_per_step, c->micro_batch, c->grad_accum, dp,
        (long long)c->steps, (double)(c->steps * tokens_per_step) / 1e6);
    if (j->pipe) {
        double bubble = 0;
        const char *formula = NULL;
        if (!cai_pp_bubble_formula(&j->pp.spec, &bubble, &formula)) { /* zero bubble: the simulated one */
            cai_pp_schedule *s = NULL;
            cai_pp_stats ps;
            if (cai_pp_schedule_build(&j->pp.spec, &s) == CAI_OK && cai_pp_schedule_check(s, NULL, &ps) == CAI_OK)
                bubble = ps.bubble;
            cai_pp_schedule_free(s);
        }
        char chunks[160] = "";
        size_t at = 0;
        for (int k = 0; k < cai_model_chunk_count(j->eng.model) && at < sizeof chunks; k++) {
            int lb = 0, le = 0;
            cai_model_chunk(j->eng.model, k, &lb, &le, NULL, NULL);
            at += (size_t)snprintf(chunks + at, sizeof chunks - at, "%s[%d, %d)", k ? " " : "", lb, le);
        }
        printf(
            "pipeline: %s over pp %d x %d chunk%s, %d microbatches a step (train.grad_accum), bubble %.1f%% by the "
            "schedule; rank 0 holds layers %s; activation slots %d of the %d in flight%s; boundaries over %s\n",
            tc_pp_schedules[c->pp_schedule], c->pp, j->pp.spec.virtual_stages,
            j->pp.spec.virtual_stages == 1 ? "" : "s", c->grad_accum, 100.0 * bubble, chunks, j->pp.slots,
            j->pp.slots_needed, j->pp.slots < j->pp.slots_needed ? " (the others recompute their forward)" : "",
            cai_pipeline_transport(j->pipe));
    }
    tc_engine_print_optim(&j->eng);
    printf(
        "flops: %.3g per token = 6 x %.3gM matmul parameters + 12 x %d layers x %d tokens x %d d_model; peak "
        "%.3g TFLOP/s over all ranks (%s)\n",
        fpt, (double)mparams / 1e6, mc->n_layers, c->seq_len, mc->d_model, peak / 1e12,
        c->run.peak_tflops > 0 ? "run.peak_tflops" : "measured matmul");
    tc_engine_print_zero(&j->eng, &c->tr, dp);
    printf("run dir: %s (config.yaml, metrics.jsonl)\n", c->run.dir);
    if (c->run.ckpt_every > 0)
        printf("checkpoints: every %lld steps, at the end and on SIGUSR1/SIGTERM, to %s (keeping %d)\n",
               (long long)c->run.ckpt_every, cai_run_ckpt_dir(run), c->run.ckpt_keep);
    fflush(stdout);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    cai_run_signals_install(); /* first: a signal during start-up waits for the first step */
    fill_choices();
    pt_config cfg;
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(pt_config, common));
    cai_layout layout;
    cai_app_check_all(check_config(&cfg, app.size, &layout), 2);

    cai_run_t *run = NULL;
    cai_run_config rc = run_config(&cfg, &layout);
    cai_app_check_all(cai_run_init(&run, &rc, MPI_COMM_WORLD), 1);
    pt_job job = {.cfg = &cfg};
    int64_t vocab = 0;
    cai_app_check_all(pt_data_init(&job.data, &cfg, cai_run_mesh(run), &vocab), 1);
    cai_model_config model;
    cai_app_check_all(plan(&job, run, vocab, &model), 2);
    cai_app_check(build(&job, run, &model));
    cai_run_hooks hooks = {&job, step_hook, eval_hook, save_hook, load_hook};
    cai_app_check_all(cai_run_resume(run, &hooks), 1);
    cai_app_check(cai_run_start(run, job.eng.model, cfg.seq_len, job.data.global_batch * cfg.seq_len));
    if (app.rank == 0) print_header(&job, run, &app);

    cai_app_check(cai_run_train(run, &hooks, cfg.eval_interval));
    /* Replicas that drifted apart would make every later step wrong
     * silently; sharded stages hold one copy of each weight. */
    if (!cai_model_external_params(job.eng.model))
        cai_app_check(cai_dp_check_replicas(cai_run_mesh(run), job.eng.model));
    cai_app_check(cai_run_finish(run));
    /* The first dp replica decodes (its tp ranks together); ZeRO-3
     * forwards gather weights over dp: every rank decodes then. */
    if (job.pipe && cfg.pp_trace && cfg.pp_trace[0] && !cai_run_stopped_by(run) &&
        cai_run_first_step(run) <= cfg.steps) {
        cai_pp_trace_stats ts;
        cai_app_check(cai_pipeline_trace_stats(job.pipe, cfg.pp_trace, &ts));
        const int traced = cai_pipeline_traced_steps(job.pipe);
        const int kept = traced < CAI_PP_TRACE_KEEP ? traced : CAI_PP_TRACE_KEEP;
        if (app.rank == 0)
            printf(
                "pipeline trace: %s (the last %d step%s): bubble %.1f%% measured (median of %d step%s%s), %.1f%% by "
                "the schedule (%.1f%% at the measured compute times, %.1f%% with the measured transfers of %.0f "
                "us; %.1f%% replayed at each action's time)\n",
                cfg.pp_trace, kept, kept > 1 ? "s" : "", 100.0 * ts.measured, ts.steps, ts.steps > 1 ? "s" : "",
                kept == traced && traced > 1 ? " after the first" : "", 100.0 * ts.textbook, 100.0 * ts.at_costs,
                100.0 * ts.with_transfers, 1e6 * ts.transfer, 100.0 * ts.replay);
        if (app.rank == 0 && ts.equal_us > 0)
            printf(
                "pipeline trace: computes padded to %lld us a unit (CAI_PP_EQUAL_COMPUTE_US): %d of %d outlasted "
                "it\n",
                ts.equal_us, ts.equal_overruns, ts.equal_actions);
    }
    if (cfg.pp > 1 || sp_sharded(&cfg)) {
        if (app.rank == 0 && cfg.gen_tokens > 0 && !cai_run_stopped_by(run))
            printf(
                "generate: not run under mesh.%s (a rank holds part of the %s); colossal-infer serves the "
                "checkpoint\n",
                cfg.pp > 1 ? "pp" : "sp", cfg.pp > 1 ? "model" : "sequence");
    } else if (!cai_run_stopped_by(run) &&
               (cai_mesh_rank(cai_run_mesh(run), CAI_AXIS_DP) == 0 || cfg.tr.zero_stage == 3)) {
        cai_app_check(pt_generate(job.eng.model, cai_run_mesh(run), &job.data.tok, &cfg, app.rank == 0));
    }
    if (cai_log_get_level() >= CAI_LOG_DEBUG) cai_timer_report(stderr);

    int exit_code = cai_run_exit_code(run);
    job_free(&job);
    cai_run_free(run);
    int rc_final = cai_app_finalize(&k_schema, &cfg);
    return exit_code ? exit_code : rc_final;
}

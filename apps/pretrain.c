/* colossal-pretrain: train a GPT-2 or Llama model from scratch, data
 * parallel over the mesh's dp axis.
 *
 *   mpirun -np N colossal-pretrain --config examples/pretrain-tiny.yaml [--key=value ...]
 *
 * Parse the config, build the mesh, the data and the model, run the loop:
 * every rank trains on its slice of each global batch (micro_batch x
 * grad_accum sequences), gradients are averaged over dp, AdamW steps with
 * the LR schedule and clipping. A progress line per log interval, a
 * metrics.jsonl record per step, validation every eval.interval steps,
 * greedy samples at the end. SIGINT/SIGTERM/SIGUSR1 stop every rank at the
 * next step boundary. With checkpoint.every a parallel HDF5 checkpoint is
 * written every that many steps, at the end, and when SIGUSR1/SIGTERM (or
 * train.stop_at) stops the run, which then exits with status 3; --resume
 * continues from one, bit for bit on the same layout. Gradients are reduced
 * in buckets while the backward runs; zero.stage / zero.offload / precision
 * shard the state, move it to the host and train in bf16/f16, and the
 * memory plan is printed (and enforced) before anything is allocated. See
 * docs/pretrain.md, docs/checkpoint.md and docs/parallel.md. */
#include "cai_config.h"

#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/ckpt.h"
#include "colossal/parallel.h"
#include "pretrain.h"

/* ------------------------------------------------------------------ config */

/* Filled from the library's own names before parsing, so a family or
 * schedule added there is accepted here without an edit. */
static const char *k_families[CAI_MODEL_FAMILY_COUNT + 1];
static const char *k_schedules[CAI_LR_KIND_COUNT + 1];
/* Index == cai_dtype for the first three. */
static const char *const k_dtypes[] = {"f32", "bf16", "f16", NULL};
static const char *const k_devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const k_tie[] = {"auto", "false", "true", NULL};
static const char *const k_precisions[] = {"auto", "f32", "bf16", "f16", NULL}; /* PT_PRECISION_* */
static const char *const k_reduce_dtypes[] = {"f32", "bf16", NULL};

#define F(key, type, field, def, doc, ...) {key, type, offsetof(pt_config, field), def, doc, __VA_ARGS__, NULL, NULL}
#define E(key, field, def, doc, choices) \
    {key, CAI_CFG_ENUM, offsetof(pt_config, field), def, doc, CAI_CFG_NO_RANGE, choices, NULL}
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)
#define BIG 1e15

static const cai_config_field k_fields[] = {
    E("model.family", family, "gpt2", "gpt2 (LayerNorm, GELU, learned positions) or llama (RMSNorm, SwiGLU, RoPE)",
      k_families),
    F("model.n_layers", CAI_CFG_INT, n_layers, "4", "transformer blocks", 1, 1024),
    F("model.d_model", CAI_CFG_INT, d_model, "128", "hidden size", 8, 1 << 16),
    F("model.n_heads", CAI_CFG_INT, n_heads, "4", "attention heads (must divide d_model)", 1, 4096),
    F("model.n_kv_heads", CAI_CFG_INT, n_kv_heads, "0", "key/value heads for grouped-query attention (llama); 0: n_heads",
      0, 4096),
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
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tensor-parallel ranks (only 1 for now)", 1, 1 << 20),
    F("mesh.pp", CAI_CFG_INT, pp, "1", "pipeline stages (only 1 for now)", 1, 1 << 20),
    F("mesh.sp", CAI_CFG_INT, sp, "1", "sequence-parallel ranks (only 1 for now)", 1, 1 << 20),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, watchdog, "300",
      "seconds a collective may stall before every rank aborts naming the late one; 0: off", 0, 1e9),

    F("train.steps", CAI_CFG_INT64, steps, "400", "optimizer steps", 1, BIG),
    F("train.micro_batch", CAI_CFG_INT, micro_batch, "8", "sequences per forward on each rank", 1, 1 << 20),
    F("train.grad_accum", CAI_CFG_INT, grad_accum, "1", "microbatches per step on each rank", 1, 1 << 20),
    F("train.seq_len", CAI_CFG_INT, seq_len, "128", "tokens per sequence (also the model's maximum)", 2, 1 << 20),
    F("train.seed", CAI_CFG_INT64, data_seed, "1234", "sample order seed", 0, BIG),
    F("train.stop_at", CAI_CFG_INT64, stop_at, "0",
      "stop after this step as SIGUSR1 would (checkpoint, exit status 3); 0: run to train.steps", 0, BIG),

    E("optim.schedule", schedule, "cosine", "learning rate after the linear warmup", k_schedules),
    F("optim.lr", CAI_CFG_DOUBLE, lr, "1e-3", "peak learning rate", 0, 10),
    F("optim.min_lr", CAI_CFG_DOUBLE, min_lr, "1e-4", "learning rate at the end of the decay", 0, 10),
    F("optim.warmup_steps", CAI_CFG_INT64, warmup, "20", "linear warmup steps", 0, BIG),
    F("optim.decay_steps", CAI_CFG_INT64, decay_steps, "0", "step at which the decay reaches min_lr; 0: train.steps",
      0, BIG),
    F("optim.beta1", CAI_CFG_DOUBLE, beta1, "0.9", "AdamW beta1", 0, 1),
    F("optim.beta2", CAI_CFG_DOUBLE, beta2, "0.95", "AdamW beta2", 0, 1),
    F("optim.eps", CAI_CFG_DOUBLE, eps, "1e-8", "AdamW epsilon", 0, 1),
    F("optim.weight_decay", CAI_CFG_DOUBLE, weight_decay, "0.1", "decoupled weight decay (matrices only)", 0, 10),
    F("optim.grad_clip", CAI_CFG_DOUBLE, grad_clip, "1.0", "maximum global gradient norm; 0: no clipping", 0, 1e9),

    F("zero.stage", CAI_CFG_INT, zero_stage, "0",
      "ZeRO stage over mesh.dp: 0 replicated, 1 optimizer state sharded, 2 + gradients, 3 + weights", 0, 3),
    F("zero.offload", CAI_CFG_BOOL, zero_offload, "false",
      "keep f32 master weights and AdamW moments in host memory and step there", CAI_CFG_NO_RANGE),
    F("zero.bucket_mb", CAI_CFG_DOUBLE, zero_bucket_mb, "25",
      "gradient bucket (MiB of f32 gradients) reduced as soon as its layers' backward finishes", 1e-3, 1e6),
    E("zero.reduce_dtype", zero_reduce_dtype, "f32",
      "dtype gradient reductions move and sum in: f32, or bf16 (half the bytes)", k_reduce_dtypes),
    F("zero.overlap", CAI_CFG_BOOL, zero_overlap, "true",
      "reduce each bucket during the backward; false: all of them after it (for comparison)", CAI_CFG_NO_RANGE),
    F("zero.overlap_ctas", CAI_CFG_INT, zero_overlap_ctas, "4",
      "GPU: thread blocks NCCL may use for reductions that overlap the backward (the last bucket gets all); 0: no "
      "limit (4: 1.88x -> 1.91x on 2 H200s, bench/RESULTS.md)", 0, 64),
    E("precision", precision, "auto",
      "auto (model.param_dtype / act_dtype), f32, bf16 or f16 (dynamic loss scaling); masters stay f32", k_precisions),
    F("loss_scale.initial", CAI_CFG_DOUBLE, ls_init, "65536", "f16: initial loss scale", 1, 1e30),
    F("loss_scale.growth_interval", CAI_CFG_INT, ls_window, "1000", "f16: good steps before the scale doubles", 1,
      1 << 30),
    F("loss_scale.hysteresis", CAI_CFG_INT, ls_hysteresis, "2", "f16: overflows tolerated before the scale halves",
      1, 1 << 20),
    F("loss_scale.min", CAI_CFG_DOUBLE, ls_min, "1", "f16: smallest loss scale", 1e-30, 1e30),
    F("loss_scale.max", CAI_CFG_DOUBLE, ls_max, "16777216", "f16: largest loss scale", 1e-30, 1e30),
    S("train.mem_limit", mem_limit, "auto",
      "refuse to start when the memory plan exceeds this per rank (e.g. 3GiB, 800MiB); auto: host RAM / ranks on "
      "the node (no limit on a GPU); 0: none"),

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

    S("run.dir", dir, "runs/pretrain", "run directory: config.yaml, metrics.jsonl, data/, tokenizer/"),
    E("run.device", device, "auto", "auto (a GPU per rank when the build and node have them), cpu or cuda",
      k_devices),
    F("run.threads", CAI_CFG_INT, threads, "0", "CPU threads per rank; 0: the OpenMP default", 0, 4096),
    F("run.peak_tflops", CAI_CFG_DOUBLE, peak_tflops, "0",
      "per-rank peak for MFU (e.g. 989 for H100/H200 bf16); 0: measure this device's matmul", 0, 1e6),

    F("log.interval", CAI_CFG_INT64, log_interval, "10", "steps between progress lines", 1, BIG),

    S("generate.prompts", prompts, "Once upon a time,|Q: What is 7 times 8? A:",
      "prompts for the greedy samples at the end, separated by |"),
    F("generate.tokens", CAI_CFG_INT, gen_tokens, "48", "tokens per sample; 0: no samples", 0, 1 << 20),

    S("checkpoint.dir", ckpt_dir, "", "checkpoint directory (step-N.h5 files and `latest`); empty: run.dir/checkpoints"),
    F("checkpoint.every", CAI_CFG_INT64, ckpt_every, "0",
      "save every this many steps, at the end, and when SIGUSR1/SIGTERM stops the run; 0: no checkpoints", 0, BIG),
    F("checkpoint.keep", CAI_CFG_INT, ckpt_keep, "3", "checkpoints kept in checkpoint.dir (the newest); 0: all", 0,
      1 << 20),
    {"checkpoint.resume", CAI_CFG_STRING, offsetof(pt_config, resume), "",
     "resume from: latest (checkpoint.dir's), auto (latest if there is one, else start), or a checkpoint file or "
     "directory; empty: start from step 1",
     CAI_CFG_NO_RANGE, NULL, "resume"},

    CAI_APP_COMMON_FIELDS(pt_config, common),
};
#undef F
#undef E
#undef S
#undef BIG

static const cai_config_schema k_schema = {
    "colossal-pretrain", "train a GPT-2 or Llama model from scratch, data parallel", k_fields,
    CAI_CFG_NFIELDS(k_fields)};

static void fill_choices(void) {
    for (int i = 0; i < CAI_MODEL_FAMILY_COUNT; i++) k_families[i] = cai_model_family_name((cai_model_family)i);
    for (int i = 0; i < CAI_LR_KIND_COUNT; i++) k_schedules[i] = cai_lr_kind_name((cai_lr_kind)i);
}

/* Everything decided from the config alone, identically on every rank. */
static cai_status check_layout(const pt_config *c, int world, cai_layout *L) {
    int rest = c->tp * c->pp * c->sp;
    *L = (cai_layout){c->pp, c->dp ? c->dp : (world % rest ? 0 : world / rest), 1, c->sp, c->tp, NULL};
    cai_layout_model lm = {c->n_heads, c->n_kv_heads, c->n_layers, 0, 0, 0};
    CAI_CALL(cai_layout_validate(world, L, &lm));
    if (c->tp > 1 || c->pp > 1 || c->sp > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "colossal-pretrain is data parallel only for now: mesh.tp=%d mesh.pp=%d mesh.sp=%d must be 1 "
                         "(use mesh.dp=%d on %d ranks)",
                         c->tp, c->pp, c->sp, world, world);
    return CAI_OK;
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

static cai_adamw_config optim_config(const pt_config *c) {
    cai_adamw_config o = cai_adamw_config_default();
    o.schedule = (cai_lr_schedule){(cai_lr_kind)c->schedule, (float)c->lr, (float)c->min_lr, c->warmup,
                                   c->decay_steps ? c->decay_steps : c->steps};
    o.beta1 = (float)c->beta1;
    o.beta2 = (float)c->beta2;
    o.eps = (float)c->eps;
    o.weight_decay = (float)c->weight_decay;
    o.grad_clip = (float)c->grad_clip;
    return o;
}

/* ------------------------------------------------------------------ ZeRO, precision, memory plan */

/* Stage 0 without offload keeps the model's own buffers and optimizer; the
 * engine then only reduces the gradient buckets. (Checkpoints cover every
 * stage: cai_ckpt_save_zero.) */
static cai_zero_config zero_config(const pt_config *c) {
    cai_zero_config z;
    cai_zero_config_init(&z);
    z.stage = c->zero_stage;
    z.offload = c->zero_offload;
    z.bucket_bytes = (size_t)(c->zero_bucket_mb * 1048576.0);
    z.overlap = c->zero_overlap;
    z.reduce_dtype = c->zero_reduce_dtype == 1 ? CAI_DTYPE_BF16 : CAI_DTYPE_F32;
    z.reduce_only = z.stage == 0 && !z.offload;
    return z;
}

static cai_status check_zero(const pt_config *c) {
    cai_loss_scale_config l = cai_loss_scale_config_default();
    l.init_scale = (float)c->ls_init;
    l.min_scale = (float)c->ls_min;
    l.max_scale = (float)c->ls_max;
    CAI_CALL(cai_loss_scale_config_check(&l));
    return CAI_OK;
}

/* precision=f32/bf16/f16 sets the working weights; the CPU backend computes
 * in f32 over them, a GPU in the same dtype. */
static void apply_precision(const pt_config *c, const cai_device_t *dev, cai_model_config *m) {
    if (c->precision == PT_PRECISION_AUTO) return;
    cai_dtype dt = c->precision == PT_PRECISION_BF16 ? CAI_DTYPE_BF16
                   : c->precision == PT_PRECISION_F16 ? CAI_DTYPE_F16 : CAI_DTYPE_F32;
    m->param_dtype = dt;
    m->act_dtype = dev->kind == CAI_DEVICE_HOST ? CAI_DTYPE_F32 : dt;
}

/* train.mem_limit in bytes: "auto", "0", or a number with an optional
 * K/M/G/T (KiB...) suffix. */
static cai_status mem_limit(const pt_config *c, const cai_app *app, const cai_device_t *dev, size_t *out) {
    *out = 0;
    if (strcmp(c->mem_limit, "auto") == 0) {
        if (dev->kind != CAI_DEVICE_HOST) return CAI_OK;
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) *out = (size_t)pages * (size_t)page / (size_t)(app->local_size ? app->local_size : 1);
        return CAI_OK;
    }
    char *end = NULL;
    double v = strtod(c->mem_limit, &end);
    double mul = 1;
    switch (end && *end ? *end : 0) {
    case 0: break;
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: mul = -1;
    }
    if (end && (*end == 'i' || *end == 'I')) end++;
    if (end && (*end == 'b' || *end == 'B')) end++;
    if (end == c->mem_limit || mul < 0 || (end && *end) || !(v >= 0))
        return CAI_ERROR(CAI_ERR_CONFIG, "train.mem_limit='%s' is not a size (e.g. 3GiB, 800M, 0 for none, auto)",
                         c->mem_limit);
    *out = (size_t)(v * mul);
    return CAI_OK;
}

/* The memory plan of this layout and precision, printed by rank 0 before
 * anything is allocated; refused (saying what would fit) over the limit. */
static cai_status plan_memory(const pt_config *c, const cai_app *app, const cai_device_t *dev,
                              const cai_model_config *m, int dp, const cai_zero_config *z) {
    cai_mem_plan_request q = {.model = *m, .batch = c->micro_batch, .seq_len = c->seq_len,
                              .view = cai_rank_view_single(), .dp = dp, .zero = *z, .dev = dev};
    cai_mem_plan p;
    size_t limit = 0;
    CAI_CALL(cai_mem_plan_compute(&q, &p));
    CAI_CALL(mem_limit(c, app, dev, &limit));
    if (app->rank == 0) {
        cai_mem_plan_print(&p, stdout);
        if (limit) printf("  limit                        %10.2f MiB  (train.mem_limit=%s)\n", limit / 1048576.0,
                          c->mem_limit);
        fflush(stdout);
    }
    CAI_CALL(cai_mem_plan_check(&q, &p, limit, 0));
    return CAI_OK;
}

/* auto: a GPU per rank (by node-local rank) when this build has CUDA and
 * the node has one, else the host. */
static cai_status open_device(const pt_config *c, const cai_app *app, cai_device_t **dev) {
    if (c->device != PT_DEVICE_CPU) {
        cai_status st = cai_device_init(dev, CAI_DEVICE_CUDA, app->local_rank, c->threads);
        if (st == CAI_OK || c->device == PT_DEVICE_CUDA) return st;
        CAI_DEBUG("run.device=auto: no GPU (%s); using the host", cai_error_message());
        cai_error_clear();
    }
    return cai_device_init(dev, CAI_DEVICE_HOST, 0, c->threads);
}

/* ------------------------------------------------------------------ steps */

/* Mean loss over eval.batches global batches of the validation split.
 * Collective over the dp axis. */
static cai_status evaluate(cai_mesh_t *mesh, cai_model_t *m, pt_data *d, const pt_config *c, double *loss) {
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    size_t per = (size_t)B * (size_t)T;
    double sum = 0;
    cai_timer_begin("pretrain: validation");
    for (int b = 0; b < c->eval_batches; b++) {
        CAI_CALL(pt_data_valid_batch(d, b, cai_mesh_rank(mesh, CAI_AXIS_DP)));
        for (int k = 0; k < c->grad_accum; k++) {
            float l = 0;
            CAI_CALL(cai_model_forward(m, d->tokens + (size_t)k * per, d->targets + (size_t)k * per, &l));
            sum += l;
        }
    }
    sum /= (double)c->eval_batches * c->grad_accum;
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_AVG));
    cai_timer_end("pretrain: validation");
    *loss = sum;
    return CAI_OK;
}

/* ------------------------------------------------------------------ signals */

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

/* SA_RESETHAND: a second Ctrl-C kills at once instead of waiting for the
 * step to end. */
static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* The signal any rank received (0: none), the same on every rank, so all
 * stop after the same step. Collective over the world. */
static cai_status stop_requested(cai_mesh_t *mesh, int *sig) {
    int32_t s = g_signal;
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_WORLD, &s, &s, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    *sig = s;
    return CAI_OK;
}

/* ------------------------------------------------------------------ run */

typedef struct {
    cai_mesh_t *mesh;
    cai_device_t *dev;
    cai_model_t *model;
    cai_optim_t *optim;   /* stage 0 without offload; else the engine holds the optimizer state */
    cai_zero_t *zero;     /* gradient buckets and ZeRO */
    cai_adamw_config oc;
    cai_loss_scaler scaler;
    int scaled;           /* f16: dynamic loss scaling */
    pt_data data;
    pt_report report;
    /* checkpoints */
    char ckpt_dir[4096];
    int64_t tokens;     /* trained on so far, across resumes */
    int64_t last_saved; /* step of the newest checkpoint (0: none) */
    cai_step_stats last;
} pt_run;

/* ------------------------------------------------------------------ checkpoints */

/* A checkpoint of the state after `step`. Collective over the world. */
static cai_status save_checkpoint(pt_run *r, const pt_config *c, int64_t step) {
    cai_ckpt_meta m = cai_ckpt_meta_init();
    m.step = step;
    /* Fewer than `step` when f16 steps were skipped: the schedule follows the updates. */
    m.optim_step = r->optim ? cai_optim_step_count(r->optim) : cai_zero_step_count(r->zero);
    m.tokens = r->tokens;
    m.consumed_samples = cai_sampler_consumed(r->data.sampler);
    m.data_seed = (uint64_t)c->data_seed;
    m.rng_seed = (uint64_t)c->model_seed;
    m.rng_offset = (uint64_t)step;
    m.last_lr = r->last.lr;
    m.last_loss = r->last.loss;
    if (r->scaled) {
        m.loss_scale = r->scaler.scale;
        m.loss_scale_good_steps = r->scaler.good_steps;
        m.loss_scale_hysteresis_left = r->scaler.hysteresis_left;
        m.loss_scale_overflows = r->scaler.overflows;
    }
    snprintf(m.app, sizeof m.app, "colossal-pretrain");
    char *text = NULL;
    CAI_CALL(cai_config_write_string(&k_schema, c, &text));
    m.config_text = text;
    char path[4096];
    cai_ckpt_stats st;
    cai_timer_begin("pretrain: checkpoint");
    cai_status s = cai_ckpt_save_step_zero(r->mesh, r->ckpt_dir, c->ckpt_keep, r->zero, r->optim, &r->oc, &m, path,
                                           sizeof path, &st);
    cai_timer_end("pretrain: checkpoint");
    free(text);
    CAI_CALL(s);
    r->last_saved = step;
    /* The save is not training time: keep it out of the next tokens/s. */
    r->report.t_last += st.seconds;
    if (r->report.rank == 0) {
        printf("checkpoint at step %lld: %s (%.1f MB in %.2f s, %.2f GB/s)\n", (long long)step, path,
               (double)st.bytes / 1e6, st.seconds, st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0.0);
        fflush(stdout);
        pt_report_json(&r->report, "\"kind\":\"checkpoint\",\"step\":%lld,\"path\":\"%s\",\"bytes\":%llu,\"seconds\":%.3f",
                       (long long)step, path, (unsigned long long)st.bytes, st.seconds);
    }
    return CAI_OK;
}

/* checkpoint.resume: load the checkpoint into the model and optimizer, move
 * the sampler to where it was, and set c->first_step. Collective over the
 * world (every rank reads the same `latest`, so every rank decides alike). */
static cai_status resume(pt_run *r, pt_config *c) {
    c->first_step = 1;
    if (!*c->resume) return CAI_OK;
    char path[4096];
    int is_auto = strcmp(c->resume, "auto") == 0;
    if (is_auto || strcmp(c->resume, "latest") == 0) {
        int found = 0;
        CAI_CALL(cai_ckpt_latest(r->ckpt_dir, path, sizeof path, &found));
        if (!found && is_auto) {
            CAI_INFO("checkpoint.resume=auto: no checkpoint in %s yet; starting from step 1", r->ckpt_dir);
            return CAI_OK;
        }
        if (!found)
            return CAI_ERROR(CAI_ERR_CONFIG, "checkpoint.resume=latest: %s holds no checkpoint (no 'latest' file); "
                             "resume=auto starts from step 1 when there is none", r->ckpt_dir);
    } else {
        CAI_CALL(cai_ckpt_resolve(c->resume, path, sizeof path));
    }
    cai_ckpt_meta m;
    cai_ckpt_stats st;
    /* Any layout: the optimizer state reshards onto this run's dp, stage and offload. */
    CAI_CALL(cai_ckpt_load_zero(r->mesh, path, r->zero, r->optim, &m, &st));
    cai_status s = pt_data_seek(&r->data, c, r->mesh, m.consumed_samples);
    if (s == CAI_OK && m.data_seed != (uint64_t)c->data_seed)
        CAI_WARN("%s was trained with train.seed=%llu, this run uses %lld: the sample order changes from here", path,
                 (unsigned long long)m.data_seed, (long long)c->data_seed);
    if (s == CAI_OK) {
        if (r->scaled) { /* f16: the dynamic loss scale continues where it was */
            r->scaler.scale = (float)m.loss_scale;
            r->scaler.good_steps = (int)m.loss_scale_good_steps;
            r->scaler.hysteresis_left = (int)m.loss_scale_hysteresis_left;
            r->scaler.overflows = m.loss_scale_overflows;
        }
        r->tokens = m.tokens;
        r->last_saved = m.step;
        c->first_step = m.step + 1;
        char was[128];
        cai_layout_str(&m.layout, was, sizeof was);
        CAI_INFO("resumed from %s: step %lld, %.2fM tokens, %lld samples consumed; saved on %d rank%s (%s) (%.1f MB "
                 "in %.2f s)", path, (long long)m.step, (double)m.tokens / 1e6, (long long)m.consumed_samples,
                 m.world_size, m.world_size == 1 ? "" : "s", was, (double)st.bytes / 1e6, st.seconds);
    }
    cai_ckpt_meta_free(&m);
    return s;
}

static void print_header(const pt_run *r, const pt_config *c, const cai_app *app) {
    const cai_model_config *mc = cai_model_config_of(r->model);
    size_t pbytes = 0, abytes = 0;
    cai_model_memory(r->model, &pbytes, &abytes);
    char layout[128];
    cai_layout_str(cai_mesh_layout(r->mesh), layout, sizeof layout);
    uint64_t nparams = cai_registry_global_numel(cai_model_registry(r->model));
    const cai_adamw_config *oc = &r->oc;
    printf("colossal-pretrain %s: %d rank%s on %d node%s, %s, device %s\n", cai_version_string(), app->size,
           app->size == 1 ? "" : "s", app->n_nodes, app->n_nodes == 1 ? "" : "s", layout, r->dev->name);
    /* Under ZeRO stages >= 1 the engine holds weights and gradients: the memory plan above counts them. */
    if (cai_model_external_params(r->model)) pbytes = 0;
    printf("model: %s, %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d (padded %lld), %s%s: %.2fM "
           "parameters; per rank %.1f MiB weights+grads in the model, %.1f MiB activations\n",
           cai_model_family_name(mc->family), mc->n_layers, mc->d_model, mc->n_heads, mc->n_kv_heads, mc->ffn_hidden,
           mc->vocab_size, (long long)cai_model_padded_vocab(r->model), mc->tie_embeddings ? "tied" : "untied",
           mc->activation_checkpointing ? ", activation checkpointing" : "", (double)nparams / 1e6,
           (double)pbytes / 1048576.0, (double)abytes / 1048576.0);
    printf("data: %s\n", r->data.source);
    printf("batch: %lld sequences x %d tokens = %lld tokens per step (micro_batch %d x grad_accum %d x dp %d); "
           "%lld steps = %.2fM tokens\n",
           (long long)r->data.global_batch, c->seq_len, (long long)r->report.tokens_per_step, c->micro_batch,
           c->grad_accum, cai_mesh_size(r->mesh, CAI_AXIS_DP), (long long)c->steps,
           (double)(c->steps * r->report.tokens_per_step) / 1e6);
    printf("optim: AdamW lr %g, %s to %g over %lld steps after %lld warmup, betas (%g, %g), weight decay %g, clip %g\n",
           (double)oc->schedule.lr, cai_lr_kind_name(oc->schedule.kind), (double)oc->schedule.min_lr,
           (long long)oc->schedule.decay_steps, (long long)oc->schedule.warmup_steps, (double)oc->beta1,
           (double)oc->beta2, (double)oc->weight_decay, (double)oc->grad_clip);
    printf("flops: %.3g per token = 6 x %.3gM matmul parameters + 12 x %d layers x %d tokens x %d d_model; peak "
           "%.3g TFLOP/s over all ranks (%s)\n",
           r->report.flops_per_token, (double)r->report.matmul_params / 1e6, mc->n_layers, c->seq_len, mc->d_model,
           r->report.peak_flops / 1e12, c->peak_tflops > 0 ? "run.peak_tflops" : "measured matmul");
    cai_zero_stats zs;
    cai_zero_get_stats(r->zero, &zs);
    printf("zero: stage %d%s over dp %d, %d gradient bucket%s of <= %g MiB%s; weights %s, compute %s%s\n",
           c->zero_stage, c->zero_offload ? " + CPU offload" : "", cai_mesh_size(r->mesh, CAI_AXIS_DP), zs.n_buckets,
           zs.n_buckets == 1 ? "" : "s", c->zero_bucket_mb, c->zero_reduce_dtype == 1 ? " reduced in bf16" : "",
           cai_dtype_name(mc->param_dtype), cai_dtype_name(mc->act_dtype), r->scaled ? ", dynamic loss scaling" : "");
    printf("run dir: %s (config.yaml, metrics.jsonl)\n", c->dir);
    if (c->ckpt_every > 0)
        printf("checkpoints: every %lld steps, at the end and on SIGUSR1/SIGTERM, to %s (keeping %d)\n",
               (long long)c->ckpt_every, r->ckpt_dir, c->ckpt_keep);
    fflush(stdout);
    pt_report_json((pt_report *)&r->report,
                   "\"kind\":\"start\",\"ranks\":%d,\"dp\":%d,\"params\":%llu,\"matmul_params\":%lld,"
                   "\"flops_per_token\":%.6g,\"peak_flops\":%.6g,\"tokens_per_step\":%lld,\"steps\":%lld",
                   app->size, cai_mesh_size(r->mesh, CAI_AXIS_DP), (unsigned long long)nparams,
                   (long long)r->report.matmul_params, r->report.flops_per_token, r->report.peak_flops,
                   (long long)r->report.tokens_per_step, (long long)c->steps);
}

#define PT_STOP_AT (-1) /* "signal" of a train.stop_at stop */

/* The training loop; *stopped_by receives the signal that ended it early
 * (PT_STOP_AT for train.stop_at). */
static cai_status train(pt_run *r, const pt_config *c, int64_t *last_step, int *stopped_by) {
    double loss_val = 0;
    for (int64_t step = c->first_step; step <= c->steps; step++) {
        double t0 = cai_time_now();
        cai_timer_begin("pretrain: data");
        CAI_CALL(pt_data_next(&r->data));
        cai_timer_end("pretrain: data");
        cai_zero_step_stats zs;
        cai_timer_begin("pretrain: step");
        CAI_CALL(cai_train_step_zero(r->zero, r->optim, &r->oc, r->scaled ? &r->scaler : NULL, r->data.tokens,
                                     r->data.targets, c->grad_accum, &zs));
        cai_timer_end("pretrain: step");
        if (zs.skipped && r->report.rank == 0)
            printf("step %lld skipped: gradients overflowed at loss scale %g (now %g)\n", (long long)step,
                   (double)zs.loss_scale, (double)r->scaler.scale);
        cai_step_stats st = {zs.loss, zs.grad_norm, zs.lr};
        pt_report_step(&r->report, c, step, &st, cai_time_now() - t0);
        *last_step = step;
        r->tokens += r->report.tokens_per_step;
        r->last = st;
        if (r->data.valid_samples && c->eval_interval > 0 && (step % c->eval_interval == 0 || step == c->steps)) {
            CAI_CALL(evaluate(r->mesh, r->model, &r->data, c, &loss_val));
            pt_report_eval(&r->report, step, loss_val);
        }
        CAI_CALL(stop_requested(r->mesh, stopped_by));
        if (!*stopped_by && c->stop_at > 0 && step >= c->stop_at && step < c->steps) *stopped_by = PT_STOP_AT;
        if (c->ckpt_every > 0 && step % c->ckpt_every == 0) CAI_CALL(save_checkpoint(r, c, step));
        if (*stopped_by) break;
    }
    return CAI_OK;
}

int main(int argc, char **argv) {
    /* First thing: a SIGUSR1 or SIGTERM during start-up (data preparation
     * can take minutes) must not kill the rank; the flag waits for the
     * first step boundary. */
    install_signals();
    fill_choices();
    pt_config cfg;
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(pt_config, common));
    cai_layout layout;
    cai_app_check_all(check_layout(&cfg, app.size, &layout), 2);
    cai_app_check_all(check_zero(&cfg), 2);
    if ((cfg.ckpt_every > 0 || *cfg.resume) && !cai_ckpt_available())
        cai_app_check_all(CAI_ERROR(CAI_ERR_UNSUPPORTED, "checkpoint.every=%lld / checkpoint.resume='%s': this build "
                                    "has no parallel HDF5, so no checkpoints (install libhdf5-openmpi-dev and re-run "
                                    "configure)", (long long)cfg.ckpt_every, cfg.resume),
                          2);
    /* The model's shape is checked before any data work; only the
     * vocabulary waits for the tokenizer. */
    cai_model_config model_cfg = model_config(&cfg, cfg.vocab_size > 0 ? cfg.vocab_size : CAI_BYTE_VOCAB), resolved;
    cai_app_check_all(cai_model_config_resolve(&model_cfg, &resolved), 2);

    pt_run r;
    memset(&r, 0, sizeof r);
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = layout;
    mc.watchdog_timeout_s = cfg.watchdog;
    mc.nccl_overlap_ctas = cfg.zero_overlap_ctas;
    cai_app_check_all(cai_mesh_init(&r.mesh, MPI_COMM_WORLD, &mc), 1);
    cai_app_check(open_device(&cfg, &app, &r.dev));
    cai_app_check_all(app.rank == 0 ? cai_config_write_file(&k_schema, &cfg, cfg.dir) : CAI_OK, 1);

    int64_t vocab = 0;
    cai_app_check_all(pt_data_init(&r.data, &cfg, r.mesh, &vocab), 1);
    model_cfg = model_config(&cfg, vocab);
    apply_precision(&cfg, r.dev, &model_cfg);
    cai_app_check_all(cai_model_config_resolve(&model_cfg, &resolved), 2);
    cai_zero_config zc = zero_config(&cfg);
    cai_app_check_all(plan_memory(&cfg, &app, r.dev, &resolved, layout.dp, &zc), 2);
    cai_model_options mo = cai_model_options_default(&resolved);
    mo.batch = cfg.micro_batch;
    mo.seq_len = cfg.seq_len;
    cai_zero_model_options(&zc, &mo);
    cai_app_check(cai_model_create(&r.model, r.dev, &resolved, &mo));
    r.oc = optim_config(&cfg);
    if (zc.reduce_only) cai_app_check_all(cai_optim_create_for_model(&r.optim, r.model, &r.oc), 2);
    cai_app_check(cai_zero_create(&r.zero, r.mesh, r.model, &zc));
    r.scaled = resolved.param_dtype == CAI_DTYPE_F16 || resolved.act_dtype == CAI_DTYPE_F16;
    cai_loss_scale_config lsc = cai_loss_scale_config_default();
    lsc.init_scale = (float)cfg.ls_init;
    lsc.growth_interval = cfg.ls_window;
    lsc.hysteresis = cfg.ls_hysteresis;
    lsc.min_scale = (float)cfg.ls_min;
    lsc.max_scale = (float)cfg.ls_max;
    cai_loss_scaler_init(&r.scaler, &lsc);
    if (zc.reduce_only) cai_app_check(cai_dp_check_replicas(r.mesh, r.model));
    snprintf(r.ckpt_dir, sizeof r.ckpt_dir, "%s%s", *cfg.ckpt_dir ? cfg.ckpt_dir : cfg.dir,
             *cfg.ckpt_dir ? "" : "/checkpoints");
    cai_app_check_all(resume(&r, &cfg), 1);
    cai_app_check(pt_report_init(&r.report, &cfg, r.model, r.dev, app.rank, app.size));
    r.report.tokens_per_step = r.data.global_batch * cfg.seq_len;
    if (app.rank == 0) print_header(&r, &cfg, &app);

    double t0 = cai_time_now();
    int64_t steps_done = cfg.first_step - 1;
    int sig = 0;
    cai_app_check(train(&r, &cfg, &steps_done, &sig));
    double seconds = cai_time_now() - t0;
    /* A checkpoint of where the run ended, unless the last step wrote one.
     * SIGINT is an interactive stop: no checkpoint. */
    int ckpt_stop = sig == SIGUSR1 || sig == SIGTERM || sig == PT_STOP_AT;
    if (cfg.ckpt_every > 0 && (ckpt_stop || !sig) && steps_done > r.last_saved)
        cai_app_check(save_checkpoint(&r, &cfg, steps_done));
    int checkpointed = cfg.ckpt_every > 0 && ckpt_stop;
    /* Replicas that drifted apart would make every later step wrong
     * silently; the check costs one pass over the weights. */
    /* Sharded stages hold one copy of each weight: nothing to compare. */
    if (!cai_model_external_params(r.model)) cai_app_check(cai_dp_check_replicas(r.mesh, r.model));
    pt_report_summary(&r.report);
    if (app.rank == 0) {
        double tokens = (double)(steps_done - cfg.first_step + 1) * (double)r.report.tokens_per_step;
        if (sig)
            printf("stopped by %s after step %lld of %lld (all ranks at the same step boundary); %.2fM tokens in %.1f "
                   "s%s\n",
                   sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1"
                                             : sig == PT_STOP_AT ? "train.stop_at" : "a signal",
                   (long long)steps_done, (long long)cfg.steps, tokens / 1e6, seconds,
                   checkpointed ? "; checkpoint written, continue with --resume latest" : "");
        else
            printf("done: %lld steps, %.2fM tokens in %.1f s (%.0f tokens/s)\n",
                   (long long)(steps_done - cfg.first_step + 1), tokens / 1e6, seconds,
                   seconds > 0 ? tokens / seconds : 0.0);
        pt_report_json(&r.report, "\"kind\":\"end\",\"status\":\"%s\",\"signal\":%d,\"step\":%lld,\"seconds\":%.3f",
                       sig ? "stopped" : "done", sig, (long long)steps_done, seconds);
        fflush(stdout);
    }
    /* ZeRO-3 forwards gather weights over dp: every rank decodes then. */
    if (!sig && (app.rank == 0 || cfg.zero_stage == 3))
        cai_app_check(pt_generate(r.model, &r.data.tok, &cfg, app.rank == 0));
    if (cai_log_get_level() >= CAI_LOG_DEBUG) cai_timer_report(stderr);

    pt_report_free(&r.report);
    cai_optim_free(r.optim);
    cai_zero_free(r.zero);
    cai_model_free(r.model);
    pt_data_free(&r.data);
    cai_device_free(r.dev);
    cai_mesh_free(r.mesh);
    int rc = cai_app_finalize(&k_schema, &cfg);
    return checkpointed ? PT_EXIT_CHECKPOINTED : rc;
}

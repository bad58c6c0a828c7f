/* colossal-infer: batch inference over a JSONL of requests.
 *
 *   mpirun -np N colossal-infer --model.path DIR_OR_CKPT --infer.input in.jsonl --infer.output out.jsonl
 *
 * Loads a Hugging Face directory (safetensors + tokenizer) or a colossal
 * HDF5 checkpoint into one weights object per rank (tensor parallel over
 * mesh.tp), and runs the continuous-batching engine over the requests:
 * data-parallel replicas (mesh.dp) take every dp-th one, a job array's task
 * its shard of the file. World rank 0 writes every result line whole; a
 * rerun skips the ids the output already holds. infer.score reads a dataset
 * or multiple-choice items instead and scores them. See docs/infer.md. */
#include "cai_config.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/ckpt.h"
#include "infer.h"

/* ------------------------------------------------------------------ config */

static const char *const k_dtypes[] = {"auto", "f32", "bf16", "f16", NULL}; /* IJ_DTYPE_* */
static const char *const k_kv_dtypes[] = {"auto", "f32", "bf16", "f16", NULL};
static const char *const k_on_error[] = {"line", "fail", NULL};
static const char *const k_score[] = {"none", "perplexity", "choice", NULL};

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(ij_config, field), def, doc, __VA_ARGS__, NULL, NULL }
#define E(key, field, def, doc, choices) \
    { key, CAI_CFG_ENUM, offsetof(ij_config, field), def, doc, CAI_CFG_NO_RANGE, choices, NULL }
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)

static const cai_config_field k_fields[] = {
    S("model.path", model_path, "",
      "Hugging Face directory (config.json, safetensors, tokenizer) or colossal checkpoint (file, or directory with "
      "`latest`)"),
    S("model.tokenizer", tokenizer, "",
      "tokenizer directory (tokenizer.json or vocab.json + merges.txt) or `bytes`; empty: model.path's, or for a "
      "checkpoint its run directory's tokenizer/"),
    S("model.eos", eos, "<|endoftext|>", "end-of-text token (finishes a request); absent from the tokenizer: none"),
    S("model.bos", bos, "", "token put before every prompt (e.g. <|begin_of_text|>); empty: none"),
    E("model.dtype", dtype, "auto", "weights and activations: f32, bf16, f16; auto: bf16 on a GPU, f32 on the CPU",
      k_dtypes),
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tensor-parallel ranks per replica", 1, 4096),
    F("mesh.dp", CAI_CFG_INT, dp, "0", "replicas (each takes every dp-th request); 0: world / tp", 0, 1 << 20),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, watchdog, "600", "seconds a collective may wait", 0, 1e9),
    S("infer.input", input, "", "requests (JSONL), or for infer.score the text / JSONL / Megatron dataset"),
    S("infer.output", output, "", "results (JSONL, appended to); {shard} becomes i-of-n in a job array"),
    S("infer.shard", shard, "",
      "this task's part of the input, i/n (every n-th request from the i-th); empty: from SLURM_ARRAY_TASK_ID"),
    E("infer.format", format, "auto", "request lines: native, openai (Batch API) or auto (per line)",
      cai_job_format_names),
    S("infer.chat_template", chat_template, "chatml",
      "how messages become a prompt: plain, chatml, llama3, or a template file (.json; docs/sft.md)"),
    E("infer.on_error", on_error, "line",
      "a bad request: line (a result line with finish_reason \"error\") or fail (stop the job)", k_on_error),
    F("infer.strict_keys", CAI_CFG_BOOL, strict_keys, "true", "refuse unknown keys in a request", CAI_CFG_NO_RANGE),
    E("infer.score", score, "none",
      "none (generate), perplexity (of infer.input) or choice (multiple-choice accuracy by log-likelihood)", k_score),
    F("infer.block_size", CAI_CFG_INT, block_size, "16", "tokens per KV-cache block", 1, 4096),
    F("infer.max_batch", CAI_CFG_INT, max_batch, "64", "sequences per step", 1, 1 << 16),
    F("infer.max_tokens_per_step", CAI_CFG_INT, max_tokens_per_step, "2048",
      "query tokens per step (prefill chunks plus decodes)", 1, 1 << 24),
    {"infer.kv_memory", CAI_CFG_BYTES, offsetof(ij_config, kv_memory), "auto",
     "KV-cache pool per rank (when infer.kv_blocks is 0); auto: half the GPU memory free after the weights, 256 MiB "
     "on the CPU",
     CAI_CFG_NO_RANGE, cai_config_bytes_auto, NULL},
    F("infer.kv_blocks", CAI_CFG_INT64, n_blocks, "0", "KV-cache blocks; 0: as many as infer.kv_memory holds", 0,
      1 << 30),
    E("infer.kv_dtype", kv_dtype, "auto", "KV-cache element type; auto: the activations'", k_kv_dtypes),
    F("infer.prefix_sharing", CAI_CFG_BOOL, prefix_sharing, "true",
      "identical prompt prefixes share KV blocks (copy on write)", CAI_CFG_NO_RANGE),
    F("infer.seed", CAI_CFG_INT64, seed, "0", "requests without a seed sample from (this, their id)", 0, 1e15),
    F("infer.progress", CAI_CFG_DOUBLE, progress, "10", "seconds between progress lines; 0: none", 0, 1e9),
    F("sampling.max_new_tokens", CAI_CFG_INT, max_new_tokens, "128", "default for requests", 1, 1 << 24),
    F("sampling.temperature", CAI_CFG_DOUBLE, temperature, "0", "default; 0: greedy", 0, 1e6),
    F("sampling.top_k", CAI_CFG_INT, top_k, "0", "default; 0: off", 0, 1 << 24),
    F("sampling.top_p", CAI_CFG_DOUBLE, top_p, "1", "default; 1: off", 0, 1),
    F("sampling.min_p", CAI_CFG_DOUBLE, min_p, "0", "default; 0: off", 0, 1),
    F("sampling.repetition_penalty", CAI_CFG_DOUBLE, repetition_penalty, "1", "default; 1: off", 0, 1e6),
    F("sampling.frequency_penalty", CAI_CFG_DOUBLE, frequency_penalty, "0", "default", -2, 2),
    F("sampling.presence_penalty", CAI_CFG_DOUBLE, presence_penalty, "0", "default", -2, 2),
    F("sampling.logprobs", CAI_CFG_INT, logprobs, "-1", "default; -1: none, 0: the chosen token's, n: top n too", -1,
      20),
    S("run.dir", run.dir, "runs/infer", "run directory: config.yaml"),
    E("run.device", run.device, "auto", "auto (a GPU per rank when the build and node have them), cpu or cuda",
      cai_run_device_choices),
    F("run.threads", CAI_CFG_INT, run.threads, "0", "CPU threads per rank; 0: the OpenMP default", 0, 4096),
    CAI_APP_COMMON_FIELDS(ij_config, common),
};
#undef F
#undef E
#undef S

static const cai_config_schema k_schema = {"colossal-infer", "batch inference and evaluation over JSONL", k_fields,
                                           CAI_CFG_NFIELDS(k_fields)};

static cai_sampling_params sampling_defaults(const ij_config *c) {
    cai_sampling_params p = cai_sampling_default();
    p.max_new_tokens = c->max_new_tokens;
    p.temperature = (float)c->temperature;
    p.top_k = c->top_k;
    p.top_p = (float)c->top_p;
    p.min_p = (float)c->min_p;
    p.repetition_penalty = (float)c->repetition_penalty;
    p.frequency_penalty = (float)c->frequency_penalty;
    p.presence_penalty = (float)c->presence_penalty;
    p.logprobs = c->logprobs;
    return p;
}

/* ------------------------------------------------------------------ model */

static void apply_dtype(const ij_config *c, const cai_device_t *dev, cai_model_config *m) {
    cai_dtype dt = c->dtype == IJ_DTYPE_BF16      ? CAI_DTYPE_BF16
                   : c->dtype == IJ_DTYPE_F16     ? CAI_DTYPE_F16
                   : c->dtype == IJ_DTYPE_F32     ? CAI_DTYPE_F32
                   : dev->kind == CAI_DEVICE_HOST ? CAI_DTYPE_F32
                                                  : CAI_DTYPE_BF16;
    m->param_dtype = dt;
    m->act_dtype = dev->kind == CAI_DEVICE_HOST ? CAI_DTYPE_F32 : dt; /* the CPU backend computes in f32 */
    m->activation_checkpointing = 0;
}

static cai_status load_tokenizer(const ij_config *c, const cai_app_model_source *src, ij_tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->eos = t->bos = -1;
    char dir[4096];
    if (strcmp(c->tokenizer, "bytes") == 0) {
        snprintf(t->source, sizeof t->source, "byte-level");
        t->eos = CAI_BYTE_EOD;
        return CAI_OK;
    }
    CAI_CALL(cai_app_model_tokenizer_dir(src, c->model_path, c->tokenizer, dir, sizeof dir));
    CAI_CALL(cai_bpe_load_dir(dir, &t->bpe));
    snprintf(t->source, sizeof t->source, "%s", dir);
    /* vocab.json + merges.txt name no special tokens: the end-of-text (and
     * bos) token the vocabulary spells becomes one, as colossal-pretrain
     * registers it, so prompts may spell it and text leaves it out. */
    if (*c->eos && cai_bpe_token_id(t->bpe, c->eos, &t->eos) == CAI_OK)
        CAI_CALL(cai_bpe_add_special(t->bpe, c->eos, &t->eos));
    else if (*c->eos) {
        cai_error_clear();
        t->eos = -1;
    }
    if (*c->bos && cai_bpe_token_id(t->bpe, c->bos, &t->bos) != CAI_OK)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.bos='%s' is not a token of %s", c->bos, dir);
    if (*c->bos) CAI_CALL(cai_bpe_add_special(t->bpe, c->bos, &t->bos));
    return CAI_OK;
}

/* ------------------------------------------------------------------ generation */

typedef struct {
    int64_t line;        /* input line index */
    cai_job_request req; /* parsed (id kept on failure) */
} ij_req;

typedef struct {
    ij_job *j;
    ij_lines lines;
    cai_id_set_t *done;
    int64_t *mine; /* input lines this replica serves */
    int64_t n_mine, next;
    cai_job_request *live; /* by tag (index into mine) */
    cai_byte_buf text, line;
    cai_token_buf ids;
    double t0, last_progress;
    int64_t total; /* requests of this shard still to answer */
    const char *model_name;
} gen_state;

static cai_status emit_error(gen_state *g, const char *id, cai_job_format fmt, int chat, const char *msg) {
    cai_job_result r = {.id = id ? id : "",
                        .format = fmt == CAI_JOB_OPENAI ? CAI_JOB_OPENAI : CAI_JOB_NATIVE,
                        .chat = chat,
                        .model = g->model_name,
                        .text = "",
                        .finish_reason = "error",
                        .error = msg};
    g->line.len = 0;
    CAI_CALL(cai_job_result_line(&r, &g->line));
    return ij_output_emit(g->j->out, g->line.data, g->line.len, 0);
}

/* A request this job cannot serve: a result line naming why, or the end of the job. */
static cai_status request_failed(gen_state *g, cai_status st, const char *id, cai_job_format fmt, int chat) {
    if (g->j->cfg->on_error == IJ_ON_ERROR_FAIL) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cai_error_message());
    cai_error_clear();
    return emit_error(g, id, fmt, chat, msg);
}

/* Parse, encode and queue input line mine[k]. */
static cai_status submit(gen_state *g, int64_t k, const cai_sampling_params *defaults) {
    const ij_config *c = g->j->cfg;
    const int64_t li = g->mine[k];
    cai_job_request *r = &g->live[k];
    cai_status st = cai_job_request_parse(c->input, li + 1, g->lines.data + g->lines.start[li], g->lines.len[li],
                                          (cai_job_format)c->format, defaults, c->strict_keys, r);
    if (st != CAI_OK) {
        st = request_failed(g, st, r->id, r->format, r->chat);
        cai_job_request_free(r);
        return st;
    }
    g->ids.len = 0;
    if (r->prompt_ids) {
        st = cai_token_buf_append(&g->ids, r->prompt_ids, (size_t)r->n_prompt_ids);
    } else if (r->chat) {
        g->text.len = 0;
        st = cai_chat_template_render(g->j->chat, r->messages, r->n_messages, 1, &g->text);
        if (st == CAI_OK) st = ij_encode(g->j->tok, g->text.data, g->text.len, &g->ids);
    } else {
        st = ij_encode(g->j->tok, r->prompt, strlen(r->prompt), &g->ids);
    }
    if (st == CAI_OK && g->ids.len == 0)
        st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: the prompt is empty", c->input, (long long)(li + 1));
    if (st == CAI_OK) st = cai_engine_add(g->j->engine, k, g->ids.ids, (int64_t)g->ids.len, &r->sampling, 0);
    if (st != CAI_OK) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%s:%lld: %s", c->input, (long long)(li + 1), cai_error_message());
        cai_error_clear();
        st = CAI_ERROR(CAI_ERR_INVALID_ARG, "%s", ctx);
        st = request_failed(g, st, r->id, r->format, r->chat);
        cai_job_request_free(r);
    }
    return st;
}

static cai_status write_result(gen_state *g, cai_engine_output *o) {
    cai_job_request *r = &g->live[o->tag];
    g->text.len = 0;
    CAI_CALL(ij_decode(g->j->tok, o->tokens, (size_t)o->n_tokens, &g->text));
    /* The text ends before a stop string; the end-of-text token spells nothing. */
    if (o->stop_string >= 0) {
        const char *needle = r->sampling.stop[o->stop_string];
        for (size_t off = 0; off + strlen(needle) <= g->text.len; off++)
            if (memcmp(g->text.data + off, needle, strlen(needle)) == 0) {
                g->text.len = off;
                break;
            }
    }
    cai_job_result res = {.id = r->id,
                          .format = r->format,
                          .chat = r->chat,
                          .model = r->model ? r->model : g->model_name,
                          .text = g->text.data ? g->text.data : "",
                          .text_len = g->text.len,
                          .token_ids = o->tokens,
                          .n_tokens = o->n_tokens,
                          .finish_reason = o->finish_reason,
                          .prompt_tokens = o->n_prompt,
                          .logprobs = o->logprobs,
                          .tok = g->j->tok->bpe};
    g->line.len = 0;
    CAI_CALL(cai_job_result_line(&res, &g->line));
    CAI_CALL(ij_output_emit(g->j->out, g->line.data, g->line.len, o->n_tokens));
    cai_job_request_free(r);
    return CAI_OK;
}

static void progress(gen_state *g, int final) {
    ij_output *o = g->j->out;
    if (o->rank != 0) return;
    const double now = cai_time_now(), dt = now - g->t0;
    if (!final && (g->j->cfg->progress <= 0 || now - g->last_progress < g->j->cfg->progress)) return;
    g->last_progress = now;
    const double rate = dt > 0 ? (double)o->done / dt : 0, left = (double)(g->total - o->done);
    printf("infer: %lld/%lld requests (%.0f%%), %.0f generated tokens/s, %.1f requests/s, %s %.0f s\n",
           (long long)o->done, (long long)g->total, g->total ? 100.0 * (double)o->done / (double)g->total : 100.0,
           dt > 0 ? (double)o->tokens / dt : 0.0, rate, final ? "took" : "ETA",
           final ? dt : (rate > 0 ? left / rate : 0.0));
    fflush(stdout);
}

/* Rank 0 learns which input lines already have a result, every rank the
 * same list: the lines of this shard still to answer. */
static cai_status select_lines(gen_state *g) {
    ij_job *j = g->j;
    const ij_config *c = j->cfg;
    const int64_t n = g->lines.n;
    unsigned char *skip = NULL;
    CAI_CALL(cai_calloc((void **)&skip, (size_t)n + 1, 1, "infer skip list"));
    cai_status st = CAI_OK;
    if (j->out->rank == 0) {
        int64_t kept = 0, cut = 0;
        st = cai_job_output_scan(j->out_path, g->done, &kept, &cut);
        if (st == CAI_OK && (kept || cut))
            printf("infer: %s holds %lld results%s; their ids are skipped\n", j->out_path, (long long)kept,
                   cut ? " (a cut-off last line was removed)" : "");
        cai_id_set_t *seen = NULL;
        if (st == CAI_OK) st = cai_id_set_create(&seen);
        for (int64_t i = 0; i < n && st == CAI_OK; i++) {
            if (i % j->n_shards != j->shard || g->lines.len[i] == 0) continue;
            cai_job_request r;
            cai_sampling_params d = cai_sampling_default();
            cai_status ps = cai_job_request_parse(c->input, i + 1, g->lines.data + g->lines.start[i], g->lines.len[i],
                                                  (cai_job_format)c->format, &d, 0, &r);
            if (ps != CAI_OK) cai_error_clear();
            if (r.id) {
                if (cai_id_set_has(seen, r.id)) {
                    st = CAI_ERROR(CAI_ERR_FORMAT,
                                   "%s:%lld: id '%s' is used by an earlier line too; ids must be unique (a rerun "
                                   "skips the ids already answered)",
                                   c->input, (long long)(i + 1), r.id);
                } else {
                    st = cai_id_set_add(seen, r.id);
                    if (cai_id_set_has(g->done, r.id)) skip[i] = 1;
                }
            }
            cai_job_request_free(&r);
        }
        cai_id_set_free(seen);
    }
    int ok = st == CAI_OK;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, j->out->world);
    if (ok) MPI_Bcast(skip, (int)n, MPI_UNSIGNED_CHAR, 0, j->out->world);
    else if (st == CAI_OK) st = CAI_ERROR(CAI_ERR_FORMAT, "infer: rank 0 could not read %s", j->out_path);
    int64_t k = 0;
    if (st == CAI_OK) st = cai_calloc((void **)&g->mine, (size_t)n + 1, sizeof *g->mine, "infer request list");
    for (int64_t i = 0; i < n && st == CAI_OK; i++) {
        if (i % j->n_shards != j->shard || skip[i] || g->lines.len[i] == 0) continue;
        if (k++ % j->n_replicas == j->replica) g->mine[g->n_mine++] = i;
    }
    g->total = k;
    cai_free(skip);
    return st;
}

static cai_status generate(ij_job *j) {
    gen_state g = {.j = j, .model_name = "colossal"};
    const ij_config *c = j->cfg;
    cai_status st = ij_lines_read(c->input, &g.lines);
    int64_t nonblank = 0;
    for (int64_t i = 0; st == CAI_OK && i < g.lines.n; i++) nonblank += g.lines.len[i] > 0;
    if (st == CAI_OK && nonblank == 0)
        st = CAI_ERROR(CAI_ERR_CONFIG, "infer.input: %s holds no request (%lld bytes)", c->input,
                       (long long)g.lines.size);
    if (st == CAI_OK) st = cai_id_set_create(&g.done);
    if (st == CAI_OK) st = select_lines(&g);
    if (st == CAI_OK) st = cai_calloc((void **)&g.live, (size_t)g.n_mine + 1, sizeof *g.live, "infer requests");
    const cai_sampling_params defaults = sampling_defaults(c);
    if (st == CAI_OK) st = cai_sampling_check(&defaults);
    g.t0 = g.last_progress = cai_time_now();
    cai_engine_set_decoder(j->engine, ij_decode, j->tok);
    /* A few batches queued ahead: requests join as others finish. */
    const int64_t ahead = 4 * (int64_t)c->max_batch;
    while (st == CAI_OK && (g.next < g.n_mine || cai_engine_pending(j->engine) > 0)) {
        /* SIGUSR1/SIGTERM: the replica stops after the step its tp ranks agree on; what it wrote is kept and
         * a rerun (a requeued job) answers the rest. */
        int sig = cai_run_signal_pending();
        if (j->tp_comm != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, j->tp_comm);
        if (sig) {
            j->stopped_by = sig;
            break;
        }
        while (st == CAI_OK && g.next < g.n_mine && cai_engine_pending(j->engine) < ahead)
            st = submit(&g, g.next++, &defaults);
        if (st == CAI_OK) st = cai_engine_step(j->engine);
        cai_engine_output o;
        while (st == CAI_OK && cai_engine_take(j->engine, &o)) {
            st = write_result(&g, &o);
            cai_engine_output_free(&o);
        }
        if (st == CAI_OK) st = ij_output_poll(j->out);
        if (st == CAI_OK) progress(&g, 0);
    }
    if (st == CAI_OK) st = ij_output_close(j->out);
    if (st == CAI_OK) progress(&g, 1);
    if (st == CAI_OK && j->stopped_by && j->out->rank == 0)
        printf("infer: stopped by %s; a rerun answers the %lld requests left\n", cai_run_stop_name(j->stopped_by),
               (long long)(g.total - j->out->done));
    for (int64_t k = 0; k < g.n_mine && g.live; k++) cai_job_request_free(&g.live[k]);
    cai_free(g.live);
    cai_free(g.mine);
    cai_id_set_free(g.done);
    ij_lines_free(&g.lines);
    cai_byte_buf_free(&g.text);
    cai_byte_buf_free(&g.line);
    cai_token_buf_free(&g.ids);
    return st;
}

/* ------------------------------------------------------------------ main */

static cai_status check_config(const ij_config *c, int world, const cai_model_config *m, cai_layout *L) {
    if (!*c->input) return CAI_ERROR(CAI_ERR_CONFIG, "infer.input is required");
    if (!*c->output) return CAI_ERROR(CAI_ERR_CONFIG, "infer.output is required");
    const int dp = c->dp ? c->dp : (world % c->tp ? 0 : world / c->tp);
    *L = (cai_layout){1, dp, 1, 1, c->tp, NULL};
    cai_layout_model lm = {m->n_heads, m->n_kv_heads ? m->n_kv_heads : m->n_heads, m->n_layers, 0, 0, 0};
    return cai_layout_validate(world, L, &lm);
}

int main(int argc, char **argv) {
    cai_run_signals_install(); /* first: a signal during start-up stops the job at its first step */
    ij_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(ij_config, common));
    cfg.run.ckpt_dir = cfg.run.resume = (char *)"";
    cfg.run.mem_limit = 0;

    cai_app_model_source src;
    cai_app_check_all(cai_app_model_source_open(cfg.model_path, &src), 2);
    cai_model_config model = src.config;
    const int hf = src.hf;
    const char *ckpt = src.ckpt;
    cai_layout layout;
    cai_app_check_all(check_config(&cfg, app.size, &model, &layout), 2);
    cai_chat_template_t *chat = NULL;
    cai_app_check_all(cai_chat_template_open(cfg.chat_template, &chat), 2);

    cai_run_config rc = {
        .program = "colossal-infer", .schema = &k_schema, .app_cfg = &cfg, .opt = &cfg.run, .steps = 1};
    cai_mesh_config_init(&rc.mesh);
    rc.mesh.layout = layout;
    rc.mesh.watchdog_timeout_s = cfg.watchdog;
    cai_run_t *run = NULL;
    cai_app_check_all(cai_run_init(&run, &rc, MPI_COMM_WORLD), 1);
    cai_mesh_t *mesh = cai_run_mesh(run);
    apply_dtype(&cfg, cai_run_device(run), &model);

    ij_tokenizer tok;
    cai_app_check_all(load_tokenizer(&cfg, &src, &tok), 2);
    cai_weights_t *w = NULL;
    const cai_rank_view view = cai_run_view(run);
    cai_app_check_all(cai_weights_create(&w, cai_run_device(run), &model, &view, 0, 1), 1);
    if (hf) {
        cai_hf_t *h = NULL;
        cai_status st = cai_hf_open(&h, cfg.model_path);
        if (st == CAI_OK) st = cai_hf_import_weights(h, w);
        cai_hf_close(h);
        cai_app_check_all(st, 1);
    } else {
        cai_app_check_all(cai_ckpt_load_weights(mesh, ckpt, w, NULL, NULL), 1);
    }
    cai_engine_options eo = cai_engine_options_default();
    eo.block_size = cfg.block_size;
    eo.max_batch = cfg.max_batch;
    eo.max_tokens_per_step = cfg.max_tokens_per_step;
    eo.kv_memory = (size_t)cfg.kv_memory;
    if (cfg.kv_memory == CAI_CFG_BYTES_AUTO) {
        size_t free_b = 0, total_b = 0;
        cai_device_t *dev = cai_run_device(run);
        eo.kv_memory = (size_t)256 << 20;
        if (dev->kind != CAI_DEVICE_HOST && cai_device_mem_info(dev, &free_b, &total_b) == CAI_OK)
            eo.kv_memory = free_b / 2;
        cai_error_clear();
    }
    eo.n_blocks = cfg.n_blocks;
    eo.kv_dtype = cfg.kv_dtype == 0 ? CAI_DTYPE_COUNT : (cai_dtype)(cfg.kv_dtype - 1);
    eo.prefix_sharing = cfg.prefix_sharing;
    eo.eos_id = tok.eos;
    eo.seed = (uint64_t)cfg.seed;
    cai_engine_t *engine = NULL;
    cai_app_check_all(cai_engine_create(&engine, w, cai_mesh_size(mesh, CAI_AXIS_TP) > 1 ? mesh : NULL, &eo), 1);

    ij_job job = {.cfg = &cfg,
                  .engine = engine,
                  .tok = &tok,
                  .model = cai_weights_config(w),
                  .chat = chat,
                  .replica = cai_mesh_rank(mesh, CAI_AXIS_DP),
                  .n_replicas = cai_mesh_size(mesh, CAI_AXIS_DP)};
    char out_path[4096];
    cai_app_check_all(ij_shard(cfg.shard, &job.shard, &job.n_shards), 2);
    cai_app_check_all(ij_shard_path(cfg.output, job.shard, job.n_shards, out_path, sizeof out_path), 2);
    job.out_path = out_path;
    job.tp_comm = cai_mesh_size(mesh, CAI_AXIS_TP) > 1 ? cai_mesh_comm(mesh, CAI_AXIS_TP) : MPI_COMM_NULL;
    ij_output out;
    cai_app_check_all(ij_output_open(&out, out_path, MPI_COMM_WORLD, cai_mesh_rank(mesh, CAI_AXIS_TP) == 0), 1);
    job.out = &out;
    if (app.rank == 0) {
        char lay[128];
        cai_layout_str(cai_mesh_layout(mesh), lay, sizeof lay);
        cai_engine_stats es;
        cai_engine_get_stats(engine, &es);
        printf(
            "colossal-infer %s: %d rank%s, %s, device %s; %s %s (%d layers, d_model %d, %s), tokenizer %s; "
            "KV cache %lld blocks of %d; shard %d of %d -> %s\n",
            cai_version_string(), app.size, app.size == 1 ? "" : "s", lay, cai_run_device(run)->name,
            cai_model_family_name(model.family), cfg.model_path, model.n_layers, model.d_model,
            cai_dtype_name(model.act_dtype), tok.source, (long long)es.blocks_total, cfg.block_size, job.shard,
            job.n_shards, out_path);
        fflush(stdout);
    }
    cai_app_check(cfg.score == IJ_SCORE_NONE ? generate(&job) : ij_score(&job));
    if (app.rank == 0 && cfg.score == IJ_SCORE_NONE) {
        cai_engine_stats es;
        cai_engine_get_stats(engine, &es);
        printf(
            "engine (rank 0's replica): %lld steps, %lld prefill + %lld decode tokens, %lld prompt tokens from "
            "shared blocks, %lld preemptions, %lld decode graphs\n",
            (long long)es.steps, (long long)es.prefill_tokens, (long long)es.decode_tokens,
            (long long)es.prefix_hit_tokens, (long long)es.preemptions, (long long)es.graphs);
    }
    cai_engine_free(engine);
    cai_weights_free(w);
    cai_bpe_free(tok.bpe);
    cai_chat_template_free(chat);
    cai_run_free(run);
    const int stopped = job.stopped_by != 0;
    const int status = cai_app_finalize(&k_schema, &cfg);
    return stopped ? CAI_RUN_EXIT_CHECKPOINTED : status;
}

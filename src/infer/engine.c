/* The inference engine: continuous batching over a paged KV cache (vLLM's
 * design). A step packs the query tokens of every scheduled sequence into
 * one ragged batch (decode steps and prefill chunks together), runs the
 * weights' layers over it with the KV of each layer written into the
 * sequences' blocks and attention read back through their block tables,
 * computes logits only for the rows that need them, and samples on the
 * host. Under tensor parallelism the layers are those of training (column /
 * row parallel, vocabulary-parallel head) and every tp rank draws the same
 * token from the same gathered logits. */
#include "cai_config.h"
#include "colossal/infer.h"
#include "colossal/ops.h"
#include "kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#define CAI_OMP_THREAD() omp_get_thread_num()
#define CAI_OMP_MAX_THREADS() omp_get_max_threads()
#else
#define CAI_OMP_THREAD() 0
#define CAI_OMP_MAX_THREADS() 1
#endif

enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_DONE };
enum { CAI_ENGINE_MAX_GRAPHS = 16 };

typedef struct {
    int64_t tag, arrival;
    int32_t *tok; /* prompt, then what was generated */
    int64_t n_tok, cap, n_prompt;
    int64_t n_computed; /* tokens whose K and V are in the cache */
    int32_t *blocks;
    int64_t n_blocks;
    int64_t n_registered; /* leading full blocks entered in the prefix index */
    uint64_t last_hash;   /* chained hash of block n_registered - 1 */
    cai_sampling_params sp;
    uint64_t seed;
    int score;
    cai_sample_result *lp; /* max_new_tokens entries when logprobs >= 0 */
    float *plp;            /* score: n_prompt - 1 entries */
    const char *finish;
    int stop_string;
    int64_t preemptions;
} seq_t;

typedef struct {
    seq_t **a;
    int64_t n, cap;
} seq_list;

struct cai_engine {
    cai_engine_options opt;
    cai_weights_t *w;
    const cai_model_config *cfg;
    cai_device_t *dev;
    cai_layer_ctx cx;
    cai_block_kinds kinds;
    int64_t C, Hq, Hkv, D, F, Vl, Voff, Vp, L, max_ctx, max_blocks;
    cai_dtype act, kvd;
    int tp, tp_rank;
    int64_t *tp_voff, *tp_vcount; /* every tp rank's vocabulary shard */

    cai_block_params *blk;
    cai_tensor wte, wpe, lnf_w, lnf_b, head_w;

    cai_kv_pool pool;
    void *kv_base;
    cai_tensor *kc, *vc; /* per layer [n_blocks, bs, Hkv, D] */

    /* step buffers */
    cai_arena_t arena;
    int64_t Nmax, Rmax;
    cai_tensor x, ln, qkv, att, fc, up, act_buf, tp_out, rstd, rows, rows_ln, logits;
    cai_tensor amax; /* I32 [2 Rmax]: a step's R argmax ids, then their R logits (F32 bits) */
    cai_tensor rope_cos, rope_sin;
    cai_tensor idx; /* I32 device: tokens | positions | slots | q_start | ctx_len | row ids | block tables */
    int32_t *h_idx; /* its host staging */
    size_t idx_count;
    void *attn_ws;
    size_t attn_ws_bytes;
    void *h_logits_raw;      /* [Rmax, Vl] act dtype */
    float *h_logits;         /* [Rmax, Vp] F32, gathered over tp */
    float *h_gather;         /* tp > 1: [tp, Rmax * max shard] */
    int32_t *h_amax;         /* staging of amax; tp > 1: [tp, 2 Rmax] gathered */
    uint8_t *host_row;       /* [Rmax]: the step's rows whose logits the host reads */
    cai_sample_ws_t **sws_t; /* one per sampling thread */
    int n_sws;
    seq_t **draw; /* the step's sampled sequences, their logits rows and results */
    int64_t *draw_row;
    cai_sample_result *draw_res;
    cai_byte_buf text;

    seq_list waiting, running, done;
    int64_t arrivals;
    cai_engine_stats st;
    cai_decode_fn decode;
    void *decode_ctx;

    int use_graphs;
    void *graph[CAI_ENGINE_MAX_GRAPHS]; /* decode steps of 2^k sequences */

    /* the current step */
    seq_t **sel;
    int64_t *sel_q;
};

cai_engine_options cai_engine_options_default(void) {
    cai_engine_options o;
    memset(&o, 0, sizeof o);
    o.block_size = 16;
    o.kv_memory = (size_t)256 << 20;
    o.kv_dtype = CAI_DTYPE_COUNT;
    o.max_batch = 64;
    o.max_tokens_per_step = 2048;
    o.max_score_rows = 512;
    o.prefix_sharing = 1;
    o.eos_id = -1;
    o.graphs = 1;
    return o;
}

/* ------------------------------------------------------------ lists */

static cai_status list_push(seq_list *l, seq_t *s) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        seq_t **a = realloc(l->a, (size_t)cap * sizeof *a);
        if (!a) return CAI_ERROR(CAI_ERR_NOMEM, "engine: request list of %lld", (long long)cap);
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = s;
    return CAI_OK;
}

static cai_status list_push_front(seq_list *l, seq_t *s) {
    CAI_CALL(list_push(l, s));
    memmove(l->a + 1, l->a, (size_t)(l->n - 1) * sizeof *l->a);
    l->a[0] = s;
    return CAI_OK;
}

static void list_remove(seq_list *l, int64_t i) {
    memmove(l->a + i, l->a + i + 1, (size_t)(l->n - i - 1) * sizeof *l->a);
    l->n--;
}

static void seq_free(seq_t *s) {
    if (!s) return;
    free(s->tok);
    free(s->blocks);
    free(s->lp);
    free(s->plp);
    cai_sampling_free(&s->sp);
    free(s);
}

/* ------------------------------------------------------------ create */

static cai_status carve(cai_engine_t *e, cai_arena_t *a, size_t *bytes) {
    const int64_t N = e->Nmax, R = e->Rmax, W = (e->Hq + 2 * e->Hkv) * e->D;
    cai_device_t *dev = e->dev;
    struct {
        cai_tensor *t;
        cai_dtype dt;
        int64_t d0, d1;
    } bufs[] = {
        {&e->x, e->act, N, e->C},
        {&e->ln, e->act, N, e->C},
        {&e->qkv, e->act, N, W},
        {&e->att, e->act, N, e->Hq * e->D},
        {&e->fc, e->act, N, e->F},
        {&e->up, e->act, N, e->F},
        {&e->act_buf, e->act, N, e->F},
        {&e->tp_out, e->act, N, e->C},
        {&e->rstd, CAI_DTYPE_F32, N, 1},
        {&e->rows, e->act, R, e->C},
        {&e->rows_ln, e->act, R, e->C},
        {&e->logits, e->act, R, e->Vl},
        {&e->rope_cos, CAI_DTYPE_F32, e->cfg->max_seq_len, e->D / 2},
        {&e->rope_sin, CAI_DTYPE_F32, e->cfg->max_seq_len, e->D / 2},
        {&e->idx, CAI_DTYPE_I32, (int64_t)e->idx_count, 1},
        {&e->amax, CAI_DTYPE_I32, 2 * R, 1},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        size_t b = (size_t)bufs[i].d0 * (size_t)bufs[i].d1 * cai_dtype_size(bufs[i].dt);
        total += (b + 255) / 256 * 256;
        if (a) CAI_CALL(cai_tensor_arena(bufs[i].t, a, dev, bufs[i].dt, 2, (int64_t[]){bufs[i].d0, bufs[i].d1}));
    }
    total += e->attn_ws_bytes + 256;
    if (a && e->attn_ws_bytes) CAI_CALL(cai_arena_alloc(a, e->attn_ws_bytes, 256, &e->attn_ws));
    if (bytes) *bytes = total + 1024;
    return CAI_OK;
}

static cai_status bind_weights(cai_engine_t *e) {
    CAI_CALL(cai_calloc((void **)&e->blk, (size_t)e->L, sizeof *e->blk, "engine layer weights"));
    for (int64_t l = 0; l < e->L; l++) CAI_CALL(cai_weights_block(e->w, (int)l, &e->blk[l]));
    CAI_CALL(cai_weights_find(e->w, "wte.weight", 1, &e->wte));
    CAI_CALL(cai_weights_find(e->w, "wpe.weight", 1, &e->wpe));
    CAI_CALL(cai_weights_find(e->w, "ln_f.weight", 1, &e->lnf_w));
    CAI_CALL(cai_weights_find(e->w, "ln_f.bias", 1, &e->lnf_b));
    /* A tied head reads the embedding (the lm_head copy is kept equal to it). */
    CAI_CALL(cai_weights_find(e->w, "lm_head.weight", 1, &e->head_w));
    if (!e->head_w.data) CAI_CALL(cai_weights_find(e->w, "wte.weight", 1, &e->head_w));
    return CAI_OK;
}

/* Every tp rank's vocabulary shard of the head, from the registry. */
static cai_status vocab_shards(cai_engine_t *e) {
    const cai_registry_t *reg = cai_weights_registry(e->w);
    int idx = cai_registry_find(reg, "lm_head.weight");
    CAI_CALL(cai_calloc((void **)&e->tp_voff, (size_t)e->tp, sizeof *e->tp_voff, "engine vocab shards"));
    CAI_CALL(cai_calloc((void **)&e->tp_vcount, (size_t)e->tp, sizeof *e->tp_vcount, "engine vocab shards"));
    for (int r = 0; r < e->tp; r++) {
        cai_rank_view v = *cai_weights_view(e->w);
        v.tp_rank = r;
        cai_param_shard sh;
        CAI_CALL(cai_registry_shard(reg, idx, &v, &sh));
        e->tp_voff[r] = (int64_t)sh.slab[0].offset[0];
        e->tp_vcount[r] = (int64_t)sh.local_shape[0];
    }
    e->Voff = e->tp_voff[e->tp_rank];
    e->Vl = e->tp_vcount[e->tp_rank];
    return CAI_OK;
}

/* What the engine holds in device memory apart from the weights: the KV
 * pool (one allocation, per layer a K and a V tensor), the step buffers
 * and the decode graphs that capture both. */
/* Elements of one layer's K (or V) pool, and bytes of the whole pool. */
static int64_t pool_per_layer(const cai_engine_t *e) { return e->opt.n_blocks * e->opt.block_size * e->Hkv * e->D; }
static size_t pool_bytes(const cai_engine_t *e) {
    return 2 * (size_t)e->L * (size_t)pool_per_layer(e) * cai_dtype_size(e->kvd);
}

static cai_status alloc_device_state(cai_engine_t *e) {
    const cai_engine_options *o = &e->opt;
    const int64_t per = pool_per_layer(e);
    CAI_CALL(cai_device_alloc(e->dev, pool_bytes(e), "KV cache", &e->kv_base));
    for (int64_t l = 0; l < e->L; l++) {
        char *k = (char *)e->kv_base + (size_t)(2 * l) * (size_t)per * cai_dtype_size(e->kvd);
        char *v = k + (size_t)per * cai_dtype_size(e->kvd);
        e->kc[l] = cai_tensor_4d(e->dev, k, e->kvd, o->n_blocks, o->block_size, e->Hkv, e->D);
        e->vc[l] = cai_tensor_4d(e->dev, v, e->kvd, o->n_blocks, o->block_size, e->Hkv, e->D);
    }
    size_t step_bytes = 0;
    CAI_CALL(carve(e, NULL, &step_bytes));
    CAI_CALL(cai_device_arena_init(e->dev, &e->arena, step_bytes, "engine step buffers"));
    CAI_CALL(carve(e, &e->arena, NULL));
    if (e->kinds.pos == CAI_POS_ROPE)
        CAI_CALL(e->dev->ops->rope_tables(e->dev, &e->rope_cos, &e->rope_sin, (double)e->cfg->rope_theta));
    return CAI_OK;
}

static void free_device_state(cai_engine_t *e) {
    for (int k = 0; k < CAI_ENGINE_MAX_GRAPHS; k++) {
        if (e->graph[k]) e->dev->ops->graph_free(e->dev, e->graph[k]);
        e->graph[k] = NULL;
    }
    if (e->arena.base) cai_device_arena_free(e->dev, &e->arena);
    memset(&e->arena, 0, sizeof e->arena);
    cai_device_dealloc(e->dev, e->kv_base);
    e->kv_base = NULL;
}

cai_status cai_engine_create(cai_engine_t **out, cai_weights_t *w, cai_mesh_t *mesh, const cai_engine_options *opt) {
    CAI_CHECK_ARG(out && w, "cai_engine_create: NULL argument");
    *out = NULL;
    if (!cai_weights_have_storage(w))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "engine: the weights object has no storage");
    const cai_rank_view *view = cai_weights_view(w);
    if (view->pp_size != 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "engine: pipeline-parallel inference (pp=%d) is not supported; use tp",
                         view->pp_size);
    if (view->tp_size > 1 && (!mesh || cai_mesh_size(mesh, CAI_AXIS_TP) != view->tp_size ||
                              cai_mesh_rank(mesh, CAI_AXIS_TP) != view->tp_rank))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "engine: the weights are tp rank %d of %d; the mesh's tp axis differs",
                         view->tp_rank, view->tp_size);
    cai_engine_options o = opt ? *opt : cai_engine_options_default();
    if (o.block_size < 1 || o.block_size > 4096)
        return CAI_ERROR(CAI_ERR_CONFIG, "infer.block_size=%d: must be 1..4096 (16 is usual)", o.block_size);
    if (o.max_batch < 1 || o.max_tokens_per_step < 1 || o.max_score_rows < 1)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "infer.max_batch=%d, infer.max_tokens_per_step=%d and infer.max_score_rows=%d must be >= 1",
                         o.max_batch, o.max_tokens_per_step, o.max_score_rows);
    cai_engine_t *e = NULL;
    CAI_CALL(cai_calloc((void **)&e, 1, sizeof *e, "engine"));
    cai_status st = CAI_OK;
    e->w = w;
    e->cfg = cai_weights_config(w);
    e->dev = cai_weights_device(w);
    e->tp = view->tp_size;
    e->tp_rank = view->tp_rank;
    e->cx = (cai_layer_ctx){e->dev, mesh, e->tp, e->tp_rank, 0, NULL, NULL, NULL};
    e->kinds = cai_model_family_kinds(e->cfg->family);
    e->C = e->cfg->d_model;
    e->Hq = e->cfg->n_heads / e->tp;
    e->Hkv = e->cfg->n_kv_heads / e->tp;
    e->D = e->cfg->d_model / e->cfg->n_heads;
    e->F = e->cfg->ffn_hidden / e->tp;
    e->L = e->cfg->n_layers;
    e->Vp = cai_model_config_padded_vocab(e->cfg);
    e->act = e->cfg->act_dtype;
    e->kvd = o.kv_dtype == CAI_DTYPE_COUNT ? e->act : o.kv_dtype;
    if (e->kvd != CAI_DTYPE_F32 && e->kvd != CAI_DTYPE_BF16 && e->kvd != CAI_DTYPE_F16) {
        st = CAI_ERROR(CAI_ERR_CONFIG, "infer.kv_dtype=%s: the cache holds f32, bf16 or f16", cai_dtype_name(e->kvd));
        goto fail;
    }
    e->max_ctx = e->cfg->max_seq_len;
    e->max_blocks = (e->max_ctx + o.block_size - 1) / o.block_size;
    if (o.n_blocks <= 0) {
        const size_t per_block =
            2 * (size_t)e->L * (size_t)o.block_size * (size_t)e->Hkv * (size_t)e->D * cai_dtype_size(e->kvd);
        o.n_blocks = (int64_t)(o.kv_memory / per_block);
        if (o.n_blocks < 1) {
            st = CAI_ERROR(CAI_ERR_CONFIG, "infer.kv_memory=%zu bytes holds no KV block (one is %zu bytes)",
                           o.kv_memory, per_block);
            goto fail;
        }
    }
    e->opt = o;
    e->use_graphs = o.graphs && e->dev->ops->graph_begin && e->tp == 1;
    CAI_CALL_GOTO(vocab_shards(e), st, fail);
    CAI_CALL_GOTO(bind_weights(e), st, fail);
    CAI_CALL_GOTO(cai_kv_pool_init(&e->pool, o.n_blocks, o.block_size), st, fail);

    CAI_CALL_GOTO(cai_calloc((void **)&e->kc, (size_t)e->L, sizeof *e->kc, "engine kv views"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->vc, (size_t)e->L, sizeof *e->vc, "engine kv views"), st, fail);
    e->Nmax = o.max_tokens_per_step;
    e->Rmax = (int64_t)o.max_batch + o.max_score_rows;
    /* tokens, positions, slots [N]; q_start [B+1]; ctx_len [B]; rows [R]; block tables [B, max_blocks] */
    e->idx_count =
        (size_t)(3 * e->Nmax + 2 * (int64_t)o.max_batch + 1 + e->Rmax + (int64_t)o.max_batch * e->max_blocks);
    e->attn_ws_bytes =
        e->dev->ops->paged_attention_workspace_bytes(e->dev, e->Nmax, o.max_batch, e->Hq, e->D, e->max_ctx);
    CAI_CALL_GOTO(alloc_device_state(e), st, fail);
    CAI_CALL_GOTO(cai_device_alloc_staging(e->dev, e->idx_count * sizeof(int32_t), "engine index staging",
                                           (void **)&e->h_idx),
                  st, fail);
    CAI_CALL_GOTO(cai_device_alloc_staging(e->dev, (size_t)(e->Rmax * e->Vl) * cai_dtype_size(e->act),
                                           "engine logits staging", &e->h_logits_raw),
                  st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&e->h_logits, (size_t)(e->Rmax * e->Vp) * sizeof(float), "engine logits"), st,
                  fail);
    CAI_CALL_GOTO(cai_device_alloc_staging(e->dev, (size_t)(2 * e->tp * e->Rmax) * sizeof(int32_t),
                                           "engine argmax staging", (void **)&e->h_amax),
                  st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->host_row, (size_t)e->Rmax, 1, "engine logits rows"), st, fail);
    if (e->tp > 1) {
        int64_t mx = 0;
        for (int r = 0; r < e->tp; r++) mx = e->tp_vcount[r] > mx ? e->tp_vcount[r] : mx;
        CAI_CALL_GOTO(cai_malloc((void **)&e->h_gather, (size_t)(e->tp * e->Rmax * mx) * sizeof(float),
                                 "engine logits gather"),
                      st, fail);
    }
    e->n_sws = CAI_OMP_MAX_THREADS();
    if (e->n_sws > 16) e->n_sws = 16; /* sampling is a small part of a step: a few cores suffice */
    if (e->n_sws < 1) e->n_sws = 1;
    CAI_CALL_GOTO(cai_calloc((void **)&e->sws_t, (size_t)e->n_sws, sizeof *e->sws_t, "engine samplers"), st, fail);
    for (int t = 0; t < e->n_sws; t++) CAI_CALL_GOTO(cai_sample_ws_create(&e->sws_t[t], e->Vp), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->draw, (size_t)o.max_batch, sizeof *e->draw, "engine draws"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->draw_row, (size_t)o.max_batch, sizeof *e->draw_row, "engine draws"), st,
                  fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->draw_res, (size_t)o.max_batch, sizeof *e->draw_res, "engine draws"), st,
                  fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->sel, (size_t)o.max_batch, sizeof *e->sel, "engine batch"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&e->sel_q, (size_t)o.max_batch, sizeof *e->sel_q, "engine batch"), st, fail);
    e->st.blocks_total = o.n_blocks;
    *out = e;
    return CAI_OK;
fail:
    cai_engine_free(e);
    return st;
}

void cai_engine_free(cai_engine_t *e) {
    if (!e) return;
    seq_list *lists[] = {&e->waiting, &e->running, &e->done};
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < lists[k]->n; i++) seq_free(lists[k]->a[i]);
        free(lists[k]->a);
    }
    free_device_state(e);
    cai_device_dealloc_staging(e->dev, e->h_idx);
    cai_device_dealloc_staging(e->dev, e->h_logits_raw);
    cai_device_dealloc_staging(e->dev, e->h_amax);
    cai_free(e->host_row);
    cai_free(e->h_logits);
    cai_free(e->h_gather);
    cai_free(e->kc);
    cai_free(e->vc);
    cai_free(e->blk);
    cai_free(e->tp_voff);
    cai_free(e->tp_vcount);
    cai_free(e->sel);
    cai_free(e->sel_q);
    for (int t = 0; e->sws_t && t < e->n_sws; t++) cai_sample_ws_free(e->sws_t[t]);
    cai_free(e->sws_t);
    cai_free(e->draw);
    cai_free(e->draw_row);
    cai_free(e->draw_res);
    cai_byte_buf_free(&e->text);
    cai_kv_pool_free(&e->pool);
    cai_free(e);
}

void cai_engine_weights_changed(cai_engine_t *e) {
    if (e) cai_kv_pool_forget(&e->pool);
}

cai_status cai_engine_suspend(cai_engine_t *e) {
    CAI_CHECK_ARG(e, "cai_engine_suspend: NULL engine");
    if (!e->kv_base) return CAI_OK;
    if (e->running.n > 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "engine: cannot give back its device memory while %lld sequences hold KV blocks; step "
                         "until cai_engine_pending is 0 first",
                         (long long)e->running.n);
    /* a cached prefix's keys and values go with the pool */
    cai_kv_pool_forget(&e->pool);
    CAI_CALL(cai_device_sync(e->dev)); /* nothing in flight reads what is freed */
    free_device_state(e);
    e->st.suspends++;
    return CAI_OK;
}

cai_status cai_engine_resume(cai_engine_t *e) {
    CAI_CHECK_ARG(e, "cai_engine_resume: NULL engine");
    if (e->kv_base) return CAI_OK;
    cai_status st = alloc_device_state(e);
    if (st != CAI_OK) free_device_state(e);
    return st;
}

int cai_engine_suspended(const cai_engine_t *e) { return e && !e->kv_base; }

size_t cai_engine_device_bytes(const cai_engine_t *e) {
    return e && e->kv_base ? pool_bytes(e) + e->arena.capacity : 0;
}

void cai_engine_set_decoder(cai_engine_t *e, cai_decode_fn decode, void *ctx) {
    e->decode = decode;
    e->decode_ctx = ctx;
}

int64_t cai_engine_pending(const cai_engine_t *e) { return e->waiting.n + e->running.n; }

void cai_engine_get_stats(const cai_engine_t *e, cai_engine_stats *st) {
    *st = e->st;
    st->blocks_free = e->pool.n_free;
}

/* ------------------------------------------------------------ requests */

cai_status cai_engine_add(cai_engine_t *e, int64_t tag, const int32_t *prompt, int64_t n_prompt,
                          const cai_sampling_params *sp, int score) {
    CAI_CHECK_ARG(e && prompt && sp, "cai_engine_add: NULL argument");
    CAI_CALL(cai_sampling_check(sp));
    const int64_t need = score ? n_prompt : n_prompt + 1;
    if (n_prompt < 1 || need > e->max_ctx)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "prompt of %lld tokens: the model's context holds %lld (%s); shorten it or use a model "
                         "with a longer max_seq_len",
                         (long long)n_prompt, (long long)e->max_ctx,
                         score ? "the scored text must fit" : "with at least one new token");
    /* At its longest (prompt and every new token, within the context) a
     * sequence alone must fit the pool, or preempting the others would not
     * let it finish. */
    int64_t longest = score ? n_prompt : n_prompt + sp->max_new_tokens;
    if (longest > e->max_ctx) longest = e->max_ctx;
    const int64_t blocks = (longest + e->opt.block_size - 1) / e->opt.block_size;
    if (blocks > e->pool.n)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "a request of %lld prompt tokens and up to %lld new ones needs %lld KV blocks of %d; the pool "
                         "has %lld (raise infer.kv_memory or infer.kv_blocks, or lower max_tokens)",
                         (long long)n_prompt, (long long)(longest - n_prompt), (long long)blocks, e->opt.block_size,
                         (long long)e->pool.n);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->cfg->vocab_size)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "prompt token %lld is id %d; the vocabulary has %d", (long long)i,
                             prompt[i], e->cfg->vocab_size);
    seq_t *s = calloc(1, sizeof *s);
    if (!s) return CAI_ERROR(CAI_ERR_NOMEM, "engine request");
    cai_status st = CAI_OK;
    s->tag = tag;
    s->arrival = e->arrivals++;
    s->n_prompt = s->n_tok = n_prompt;
    s->score = score;
    s->stop_string = -1;
    s->cap = score ? n_prompt : n_prompt + sp->max_new_tokens;
    if (s->cap > e->max_ctx) s->cap = e->max_ctx;
    s->tok = malloc((size_t)s->cap * sizeof *s->tok);
    s->blocks = malloc((size_t)e->max_blocks * sizeof *s->blocks);
    if (!s->tok || !s->blocks) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "engine request of %lld tokens", (long long)s->cap);
        goto fail;
    }
    memcpy(s->tok, prompt, (size_t)n_prompt * sizeof *prompt);
    CAI_CALL_GOTO(cai_sampling_copy(&s->sp, sp), st, fail);
    s->seed = sp->has_seed ? sp->seed : e->opt.seed ^ ((uint64_t)tag * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    if (!score && sp->logprobs >= 0) {
        s->lp = calloc((size_t)sp->max_new_tokens, sizeof *s->lp);
        if (!s->lp) {
            st = CAI_ERROR(CAI_ERR_NOMEM, "engine logprobs");
            goto fail;
        }
    }
    if (score && n_prompt > 1) {
        s->plp = calloc((size_t)(n_prompt - 1), sizeof *s->plp);
        if (!s->plp) {
            st = CAI_ERROR(CAI_ERR_NOMEM, "engine prompt logprobs");
            goto fail;
        }
    }
    CAI_CALL_GOTO(list_push(&e->waiting, s), st, fail);
    return CAI_OK;
fail:
    seq_free(s);
    return st;
}

/* ------------------------------------------------------------ blocks */

static void release_blocks(cai_engine_t *e, seq_t *s) {
    for (int64_t i = 0; i < s->n_blocks; i++) cai_kv_pool_release(&e->pool, s->blocks[i]);
    s->n_blocks = 0;
    s->n_registered = 0;
    s->last_hash = 0;
    s->n_computed = 0;
}

/* Copy block src's K and V (every layer) into dst. */
static cai_status copy_block(cai_engine_t *e, int32_t dst, int32_t src) {
    const size_t blk = (size_t)e->opt.block_size * (size_t)e->Hkv * (size_t)e->D * cai_dtype_size(e->kvd);
    const cai_copy_kind kind = e->dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2D;
    for (int64_t l = 0; l < e->L; l++) {
        CAI_CALL(cai_device_copy(e->dev, (char *)e->kc[l].data + (size_t)dst * blk,
                                 (char *)e->kc[l].data + (size_t)src * blk, blk, kind));
        CAI_CALL(cai_device_copy(e->dev, (char *)e->vc[l].data + (size_t)dst * blk,
                                 (char *)e->vc[l].data + (size_t)src * blk, blk, kind));
    }
    return CAI_OK;
}

/* Blocks for positions [0, upto) of s, the block the next write lands in
 * made private (copy on write: it may be a shared prefix block). 0 when
 * the pool ran out (what was allocated stays with s). */
static cai_status reserve(cai_engine_t *e, seq_t *s, int64_t upto, int *ok) {
    const int64_t bs = e->opt.block_size;
    *ok = 0;
    const int64_t first = s->n_computed / bs;
    if (first < s->n_blocks) {
        int32_t b = s->blocks[first];
        if (e->pool.ref[b] > 1 || e->pool.hash[b]) {
            int32_t nb = cai_kv_pool_alloc(&e->pool);
            if (nb < 0) return CAI_OK;
            CAI_CALL(copy_block(e, nb, b));
            cai_kv_pool_release(&e->pool, b);
            s->blocks[first] = nb;
            if (s->n_registered > first) s->n_registered = first; /* the copy is private */
            e->st.cow_copies++;
        }
    }
    while (s->n_blocks * bs < upto) {
        int32_t b = cai_kv_pool_alloc(&e->pool);
        if (b < 0) return CAI_OK;
        s->blocks[s->n_blocks++] = b;
    }
    *ok = 1;
    return CAI_OK;
}

/* Share the cached blocks of s's longest indexed prefix. At least the last
 * token is left to compute: its logits give the next token. */
static void match_prefix(cai_engine_t *e, seq_t *s) {
    const int64_t bs = e->opt.block_size;
    if (!e->opt.prefix_sharing || s->score || s->n_blocks) return;
    uint64_t h = 0;
    int32_t parent = -1;
    int64_t m = 0;
    while ((m + 1) * bs <= s->n_tok) {
        uint64_t hh = cai_kv_block_hash(h, s->tok + m * bs, bs);
        int32_t b = cai_kv_pool_lookup(&e->pool, hh, parent, s->tok + m * bs);
        if (b < 0) break;
        cai_kv_pool_retain(&e->pool, b);
        s->blocks[s->n_blocks++] = b;
        h = hh;
        parent = b;
        m++;
    }
    s->n_registered = m;
    s->last_hash = h;
    s->n_computed = m * bs < s->n_tok ? m * bs : s->n_tok - 1;
    e->st.prefix_hit_tokens += s->n_computed;
}

/* Enter s's newly completed full blocks in the prefix index. */
static void register_blocks(cai_engine_t *e, seq_t *s) {
    const int64_t bs = e->opt.block_size;
    if (!e->opt.prefix_sharing) return;
    while ((s->n_registered + 1) * bs <= s->n_computed) {
        const int64_t i = s->n_registered;
        const uint64_t h = cai_kv_block_hash(s->last_hash, s->tok + i * bs, bs);
        cai_kv_pool_register(&e->pool, s->blocks[i], h, i ? s->blocks[i - 1] : -1, s->tok + i * bs);
        s->last_hash = h;
        s->n_registered++;
    }
}

/* ------------------------------------------------------------ schedule */

static cai_status preempt(cai_engine_t *e, int64_t i) {
    seq_t *v = e->running.a[i];
    list_remove(&e->running, i);
    release_blocks(e, v);
    v->preemptions++;
    e->st.preemptions++;
    return list_push_front(&e->waiting, v);
}

/* The step's sequences and query counts; returns how many. */
static cai_status schedule(cai_engine_t *e, int64_t *n_sel) {
    int64_t n = 0, budget = e->Nmax, score_rows = e->opt.max_score_rows;
    for (int64_t i = 0; i < e->running.n && n < e->opt.max_batch && budget > 0;) {
        seq_t *s = e->running.a[i];
        int64_t q = s->n_tok - s->n_computed;
        if (q > budget) q = budget;
        if (s->score && q > score_rows) q = score_rows;
        if (q < 1) {
            i++;
            continue;
        }
        int ok = 0;
        CAI_CALL(reserve(e, s, s->n_computed + q, &ok));
        if (!ok) {
            /* Out of blocks: the newest running sequence gives its blocks back. */
            const int64_t victim = e->running.n - 1;
            CAI_CALL(preempt(e, victim));
            if (victim == i) break;
            continue;
        }
        e->sel[n] = s;
        e->sel_q[n++] = q;
        budget -= q;
        if (s->score) score_rows -= q;
        i++;
    }
    while (e->waiting.n > 0 && n < e->opt.max_batch && budget > 0) {
        seq_t *s = e->waiting.a[0];
        if (s->score && score_rows < 1) break;
        match_prefix(e, s);
        int64_t q = s->n_tok - s->n_computed;
        if (q > budget) q = budget;
        if (s->score && q > score_rows) q = score_rows;
        int ok = 0;
        CAI_CALL(reserve(e, s, s->n_computed + q, &ok));
        if (!ok) {
            release_blocks(e, s);
            break;
        }
        list_remove(&e->waiting, 0);
        CAI_CALL(list_push(&e->running, s));
        e->sel[n] = s;
        e->sel_q[n++] = q;
        budget -= q;
        if (s->score) score_rows -= q;
    }
    *n_sel = n;
    return CAI_OK;
}

/* ------------------------------------------------------------ forward */

static cai_tensor rows_of(const cai_tensor *t, int64_t n) {
    cai_tensor v = *t;
    v.shape[0] = n;
    return v;
}

/* [N, H*D] -> [1, N, H, D] view of columns [c0, c0 + H*D). */
static cai_status heads_view(const cai_tensor *t2, int64_t n, int64_t c0, int64_t h, int64_t d, cai_tensor *out) {
    cai_tensor t = rows_of(t2, n), col, three;
    CAI_CALL(cai_tensor_narrow(&t, 1, c0, h * d, &col));
    CAI_CALL(cai_tensor_unflatten(&col, 1, d, &three)); /* [N, H, D] */
    *out = three;
    out->ndim = 4;
    for (int k = 3; k > 0; k--) {
        out->shape[k] = three.shape[k - 1];
        out->stride[k] = three.stride[k - 1];
    }
    out->shape[0] = 1;
    out->stride[0] = three.shape[0] * three.stride[0];
    return CAI_OK;
}

static cai_status tp_sum(cai_engine_t *e, cai_tensor *t) {
    if (e->tp <= 1) return CAI_OK;
    return cai_allreduce(e->cx.mesh, CAI_AXIS_TP, t->data, t->data, (size_t)cai_tensor_numel(t), t->dtype, CAI_RED_SUM);
}

static cai_status norm(cai_engine_t *e, cai_tensor *out, const cai_tensor *inp, const cai_tensor *w,
                       const cai_tensor *b, int64_t n) {
    cai_device_t *dev = e->dev;
    if (e->kinds.norm == CAI_NORM_LAYERNORM)
        return dev->ops->layernorm_fwd(dev, out, NULL, NULL, inp, w, b && b->data ? b : NULL, e->cfg->norm_eps);
    cai_tensor r = rows_of(&e->rstd, n);
    r.ndim = 1;
    return dev->ops->rmsnorm_fwd(dev, out, &r, inp, w, e->cfg->norm_eps);
}

/* x += a W^T (+ b), W row-parallel: the partial products summed over tp. */
static cai_status row_parallel(cai_engine_t *e, cai_tensor *x, const cai_tensor *a, const cai_tensor *w,
                               const cai_tensor *b, int64_t n) {
    cai_device_t *dev = e->dev;
    const cai_tensor *bias = b && b->data ? b : NULL;
    if (e->tp <= 1) return dev->ops->linear_residual_fwd(dev, x, a, w, bias, x);
    cai_tensor t = rows_of(&e->tp_out, n);
    CAI_CALL(dev->ops->linear_fwd(dev, &t, a, w, NULL));
    CAI_CALL(tp_sum(e, &t));
    if (bias) CAI_CALL(dev->ops->bias_add(dev, &t, bias));
    return dev->ops->add(dev, x, x, &t);
}

typedef struct {
    int64_t n_seq, N, R;
    int64_t n_host;       /* rows whose full logits the host reads (e->host_row) */
    int64_t graph_bucket; /* > 0: a padded decode step replayed from its graph */
    int32_t *tokens, *pos, *slots, *q_start, *ctx_len, *rows, *tables; /* host views into h_idx */
} step_io;

/* The step's device work for N query tokens of S sequences and R logits
 * rows, from the index buffer already on the device to the logits: only
 * ops over fixed buffers, so a decode step can be captured as a graph and
 * replayed. `all_rows`: row i is token i for every i < R == N (a decode
 * step), so the last layer's output is read in place, not gathered. */
static cai_status compute(cai_engine_t *e, int64_t N, int64_t S, int64_t R, int all_rows) {
    cai_device_t *dev = e->dev;
    const cai_ops *ops = dev->ops;
    int32_t *di = (int32_t *)e->idx.data;
    const int64_t NB = e->opt.max_batch;
    cai_tensor d_pos = cai_tensor_1d(dev, di + e->Nmax, CAI_DTYPE_I32, N);
    cai_tensor d_slots = cai_tensor_1d(dev, di + 2 * e->Nmax, CAI_DTYPE_I32, N);
    cai_tensor d_qs = cai_tensor_1d(dev, di + 3 * e->Nmax, CAI_DTYPE_I32, S + 1);
    cai_tensor d_cl = cai_tensor_1d(dev, di + 3 * e->Nmax + NB + 1, CAI_DTYPE_I32, S);
    cai_tensor d_rows = cai_tensor_2d(dev, di + 3 * e->Nmax + 2 * NB + 1, CAI_DTYPE_I32, 1, R);
    cai_tensor d_bt = cai_tensor_2d(dev, di + 3 * e->Nmax + 2 * NB + 1 + e->Rmax, CAI_DTYPE_I32, S, e->max_blocks);

    /* Embedding: every token at once; learned positions gathered by each
     * token's own position (added on one tp rank: the sum has them once). */
    cai_tensor x = rows_of(&e->x, N), ln = rows_of(&e->ln, N);
    {
        cai_tensor x3 = cai_tensor_3d(dev, e->x.data, e->act, 1, N, e->C);
        cai_tensor tok2 = cai_tensor_2d(dev, di, CAI_DTYPE_I32, 1, N);
        CAI_CALL(ops->embedding_fwd(dev, &x3, &tok2, &e->wte, NULL, e->Voff, e->cfg->vocab_size, 0));
        if (e->tp_rank == 0 && e->wpe.data) {
            cai_tensor pos2 = cai_tensor_2d(dev, di + e->Nmax, CAI_DTYPE_I32, 1, N);
            cai_tensor p3 = cai_tensor_3d(dev, e->ln.data, e->act, 1, N, e->C);
            CAI_CALL(ops->embedding_fwd(dev, &p3, &pos2, &e->wpe, NULL, 0, e->cfg->max_seq_len, 0));
            CAI_CALL(ops->add(dev, &x, &x, &ln));
        }
    }
    CAI_CALL(tp_sum(e, &x));

    cai_tensor qkv = rows_of(&e->qkv, N), att = rows_of(&e->att, N);
    cai_tensor fc = rows_of(&e->fc, N), up = rows_of(&e->up, N), act = rows_of(&e->act_buf, N);
    cai_tensor q4, k4, v4, att4, qk4;
    CAI_CALL(heads_view(&e->qkv, N, 0, e->Hq, e->D, &q4));
    /* q's heads then k's are adjacent in a row: one rotation covers both */
    CAI_CALL(heads_view(&e->qkv, N, 0, e->Hq + e->Hkv, e->D, &qk4));
    CAI_CALL(heads_view(&e->qkv, N, e->Hq * e->D, e->Hkv, e->D, &k4));
    CAI_CALL(heads_view(&e->qkv, N, (e->Hq + e->Hkv) * e->D, e->Hkv, e->D, &v4));
    CAI_CALL(heads_view(&e->att, N, 0, e->Hq, e->D, &att4));
    for (int64_t l = 0; l < e->L; l++) {
        const cai_block_params *p = &e->blk[l];
        CAI_CALL(norm(e, &ln, &x, &p->ln1_w, &p->ln1_b, N));
        CAI_CALL(ops->linear_fwd(dev, &qkv, &ln, &p->qkv_w, p->qkv_b.data ? &p->qkv_b : NULL));
        if (e->kinds.pos == CAI_POS_ROPE) {
            CAI_CALL(ops->rope_kv_cache_write(dev, &qk4, &e->kc[l], &e->vc[l], &v4, &d_slots, &e->rope_cos,
                                              &e->rope_sin, &d_pos));
        } else {
            CAI_CALL(ops->kv_cache_write(dev, &e->kc[l], &e->vc[l], &k4, &v4, &d_slots));
        }
        CAI_CALL(ops->paged_attention(dev, &att4, &q4, &e->kc[l], &e->vc[l], &d_bt, &d_qs, &d_cl, e->max_ctx, 0.0f,
                                      e->attn_ws, e->attn_ws_bytes));
        CAI_CALL(row_parallel(e, &x, &att, &p->proj_w, &p->proj_b, N));
        CAI_CALL(norm(e, &ln, &x, &p->ln2_w, &p->ln2_b, N));
        if (e->kinds.mlp == CAI_MLP_GELU) {
            CAI_CALL(ops->linear_gelu_fwd(dev, &act, &fc, &ln, &p->fc_w, p->fc_b.data ? &p->fc_b : NULL));
        } else {
            CAI_CALL(ops->linear_swiglu_fwd(dev, &act, &fc, &up, &ln, &p->fc_w, &p->up_w));
        }
        CAI_CALL(row_parallel(e, &x, &act, &p->mlp_proj_w, &p->mlp_proj_b, N));
    }
    if (R == 0) return CAI_OK;
    cai_tensor rows2 = rows_of(all_rows ? &e->x : &e->rows, R);
    if (!all_rows) { /* the rows that need logits, gathered by an embedding lookup into e->rows */
        cai_tensor table = cai_tensor_2d(dev, e->x.data, e->act, N, e->C);
        cai_tensor rows = cai_tensor_3d(dev, e->rows.data, e->act, 1, R, e->C);
        CAI_CALL(ops->embedding_fwd(dev, &rows, &d_rows, &table, NULL, 0, N, 0));
    }
    cai_tensor rln = rows_of(&e->rows_ln, R), lg = rows_of(&e->logits, R);
    CAI_CALL(norm(e, &rln, &rows2, &e->lnf_w, &e->lnf_b, R));
    CAI_CALL(ops->linear_fwd(dev, &lg, &rln, &e->head_w, NULL));
    cai_tensor am_i = cai_tensor_1d(dev, e->amax.data, CAI_DTYPE_I32, R);
    cai_tensor am_v = cai_tensor_1d(dev, (int32_t *)e->amax.data + R, CAI_DTYPE_F32, R);
    return ops->argmax_rows(dev, &am_i, &am_v, &lg, e->Voff, e->cfg->vocab_size);
}

/* Decode steps of up to `bucket` sequences replay one graph per bucket:
 * the batch is padded with sequences that write no KV (slot -1) and whose
 * rows nobody reads. Buckets are powers of two up to max_batch. */
static int64_t decode_bucket(const cai_engine_t *e, int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b > e->opt.max_batch ? e->opt.max_batch : b;
}

static cai_status run_graph(cai_engine_t *e, int64_t bucket) {
    cai_device_t *dev = e->dev;
    int k = 0;
    while ((1ll << k) < bucket) k++;
    if (k >= CAI_ENGINE_MAX_GRAPHS) return compute(e, bucket, bucket, bucket, 1);
    if (e->graph[k]) return dev->ops->graph_launch(dev, e->graph[k]);
    /* First step of this bucket: run it (which also settles the backend's
     * per-shape choices, e.g. cuBLASLt's algorithms), then record it. */
    CAI_CALL(compute(e, bucket, bucket, bucket, 1));
    CAI_CALL(dev->ops->graph_begin(dev));
    cai_status st = compute(e, bucket, bucket, bucket, 1);
    void *g = NULL;
    cai_status st2 = dev->ops->graph_end(dev, st == CAI_OK ? &g : NULL);
    CAI_CALL(st);
    CAI_CALL(st2);
    e->graph[k] = g;
    e->st.graphs++;
    return CAI_OK;
}

/* (v, id) beats (bv, bid) by argmax_rows' rule: a NaN first, then the
 * larger value, then the lower id; id < 0 is "none". Global ids rise with
 * the tp rank, so the shards' winners combine by the same rule. */
static int am_better(float v, int32_t id, float bv, int32_t bid) {
    if (id < 0) return 0;
    if (bid < 0) return 1;
    const int n = isnan(v), bn = isnan(bv);
    if (n != bn) return n;
    if (!n && v != bv) return v > bv;
    return id < bid;
}

/* The step's argmax ids and values in h_amax [R ids | R values], combined
 * over tp. */
static cai_status gather_argmax(cai_engine_t *e, int64_t R) {
    if (e->tp <= 1) return CAI_OK;
    int32_t *g = e->h_amax;
    CAI_CALL(cai_all_gather(e->cx.mesh, CAI_AXIS_TP, g + 2 * R * e->tp_rank, g, (size_t)(2 * R), CAI_DTYPE_I32));
    for (int64_t i = 0; i < R; i++) {
        int32_t bid = g[i];
        float bv;
        memcpy(&bv, g + R + i, sizeof bv);
        for (int r = 1; r < e->tp; r++) {
            const int32_t *q = g + 2 * R * r;
            float v;
            memcpy(&v, q + R + i, sizeof v);
            if (am_better(v, q[i], bv, bid)) {
                bid = q[i];
                bv = v;
            }
        }
        g[i] = bid;
        memcpy(g + R + i, &bv, sizeof bv);
    }
    return CAI_OK;
}

/* Full logits rows for the host: every row under tp (the gather moves
 * them all) or when most rows are wanted, else the wanted rows' runs. */
static cai_status fetch_logits(cai_engine_t *e, const step_io *io, cai_copy_kind d2h, int *all) {
    cai_device_t *dev = e->dev;
    const int64_t R = io->R;
    const size_t rb = (size_t)e->Vl * cai_dtype_size(e->act);
    *all = e->tp > 1 || 2 * io->n_host > R;
    const char *lg = (const char *)e->logits.data;
    char *h = (char *)e->h_logits_raw;
    if (*all) return cai_device_copy(dev, h, lg, (size_t)R * rb, d2h);
    for (int64_t i = 0; i < R;) {
        if (!e->host_row[i]) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < R && e->host_row[j]) j++;
        CAI_CALL(cai_device_copy(dev, h + (size_t)i * rb, lg + (size_t)i * rb, (size_t)(j - i) * rb, d2h));
        i = j;
    }
    return CAI_OK;
}

static cai_status forward(cai_engine_t *e, const step_io *io) {
    cai_device_t *dev = e->dev;
    const int64_t R = io->R;
    CAI_CALL(cai_device_copy(dev, e->idx.data, e->h_idx, e->idx_count * sizeof(int32_t),
                             dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D));
    if (io->graph_bucket) CAI_CALL(run_graph(e, io->graph_bucket));
    else {
        int all_rows = R == io->N;
        for (int64_t i = 0; all_rows && i < R; i++) all_rows = io->rows[i] == i;
        CAI_CALL(compute(e, io->N, io->n_seq, R, all_rows));
    }
    if (R == 0) return CAI_OK;
    /* From here the host waits: the copies back are blocking where the device has them. */
    const double t_wait = cai_time_now();
    const cai_copy_kind d2h = dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H;
    /* A graph's step has `bucket` rows: its ids and values sit bucket apart. */
    const int64_t RB = io->graph_bucket ? io->graph_bucket : R;
    int32_t *am = e->h_amax + (e->tp > 1 ? 2 * R * e->tp_rank : 0);
    CAI_CALL(cai_device_copy(dev, am, e->amax.data, (size_t)R * sizeof(int32_t), d2h));
    CAI_CALL(cai_device_copy(dev, am + R, (int32_t *)e->amax.data + RB, (size_t)R * sizeof(int32_t), d2h));
    int all = 0;
    if (io->n_host > 0) CAI_CALL(fetch_logits(e, io, d2h, &all));
    CAI_CALL(cai_device_sync(dev));
    e->st.device_wait_s += cai_time_now() - t_wait;
    CAI_CALL(gather_argmax(e, R));
    if (io->n_host == 0) return CAI_OK;
    /* Full rows [R, Vp] on every tp rank. */
    float *own = e->tp > 1 ? e->h_gather : e->h_logits;
    /* Widened a row at a time on the sampling threads: at a large batch this is megabytes a step. */
    cai_status cst = CAI_OK;
    const size_t es = cai_dtype_size(e->act);
    const int ct = (int)(R < e->n_sws ? R : e->n_sws);
#pragma omp parallel for num_threads(ct > 0 ? ct : 1) schedule(static)
    for (int64_t i = 0; i < R; i++) {
        if (!all && !e->host_row[i]) continue;
        cai_status one =
            cai_convert_host(own + (size_t)(i * e->Vl), CAI_DTYPE_F32,
                             (const char *)e->h_logits_raw + (size_t)(i * e->Vl) * es, e->act, (size_t)e->Vl);
        if (one != CAI_OK) {
#pragma omp critical(cai_engine_widen_error)
            cst = cst == CAI_OK ? one : cst;
        }
    }
    CAI_CALL(cst);
    if (e->tp > 1) {
        int64_t mx = 0;
        for (int r = 0; r < e->tp; r++) mx = e->tp_vcount[r] > mx ? e->tp_vcount[r] : mx;
        /* Equal blocks of R * mx: shards may differ by a row. */
        float *g = e->h_gather;
        if (e->tp_rank != 0) memmove(g + (size_t)(e->tp_rank * R * mx), g, (size_t)(R * e->Vl) * sizeof(float));
        CAI_CALL(cai_all_gather(e->cx.mesh, CAI_AXIS_TP, g + (size_t)(e->tp_rank * R * mx), g, (size_t)(R * mx),
                                CAI_DTYPE_F32));
        for (int r = 0; r < e->tp; r++)
            for (int64_t i = 0; i < R; i++)
                memcpy(e->h_logits + (size_t)(i * e->Vp + e->tp_voff[r]),
                       g + (size_t)(r * R * mx + i * e->tp_vcount[r]), (size_t)e->tp_vcount[r] * sizeof(float));
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ sampling */

static double log_softmax_at(const float *row, int64_t V, int32_t id) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
    return (double)row[id] - mx - log(sum);
}

/* Greedy without penalties or logprobs is the argmax of the raw logits,
 * which the device reduces: the host then reads one id per row. */
static int device_greedy(const cai_sampling_params *p) {
    return p->temperature == 0.0f && p->repetition_penalty == 1.0f && p->frequency_penalty == 0.0f &&
           p->presence_penalty == 0.0f && p->logprobs < 0;
}

/* Row r's token from the device's argmax, refused as cai_sample refuses
 * its logits. */
static cai_status take_argmax(const cai_engine_t *e, int64_t R, int64_t r, cai_sample_result *out) {
    float v;
    memcpy(&v, e->h_amax + R + r, sizeof v);
    memset(out, 0, sizeof *out);
    out->token = e->h_amax[r];
    if (isnan(v) || v == INFINITY)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_sample: logits[%d] is %s: a logit must be finite or -inf (masked)",
                         (int)out->token, isnan(v) ? "NaN" : "+inf");
    if (out->token < 0 || v == -INFINITY)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_sample: all %lld logits are -inf: no token can be drawn",
                         (long long)e->cfg->vocab_size);
    return CAI_OK;
}

static int has_stop_id(const seq_t *s, int32_t t) {
    for (int i = 0; i < s->sp.n_stop_ids; i++)
        if (s->sp.stop_ids[i] == t) return 1;
    return 0;
}

static cai_status check_stop_strings(cai_engine_t *e, seq_t *s) {
    if (!s->sp.n_stop || !e->decode) return CAI_OK;
    e->text.len = 0;
    CAI_CALL(e->decode(e->decode_ctx, s->tok + s->n_prompt, (size_t)(s->n_tok - s->n_prompt), &e->text));
    size_t best = SIZE_MAX;
    for (int i = 0; i < s->sp.n_stop; i++) {
        const char *needle = s->sp.stop[i];
        const size_t nl = strlen(needle);
        if (!nl || nl > e->text.len) continue;
        for (size_t off = 0; off + nl <= e->text.len && off < best; off++)
            if (memcmp(e->text.data + off, needle, nl) == 0) {
                best = off;
                s->stop_string = i;
                break;
            }
    }
    if (best != SIZE_MAX) s->finish = "stop";
    return CAI_OK;
}

static cai_status finish(cai_engine_t *e, seq_t *s) {
    for (int64_t i = 0; i < e->running.n; i++)
        if (e->running.a[i] == s) {
            list_remove(&e->running, i);
            break;
        }
    release_blocks(e, s);
    return list_push(&e->done, s);
}

cai_status cai_engine_step(cai_engine_t *e) {
    CAI_CHECK_ARG(e, "cai_engine_step: NULL engine");
    if (!e->kv_base)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "engine: suspended (its KV pool was given back); cai_engine_resume "
                         "before stepping");
    int64_t n = 0;
    CAI_CALL(schedule(e, &n));
    if (n == 0) {
        if (e->waiting.n > 0)
            return CAI_ERROR(CAI_ERR_INTERNAL, "engine: %lld requests wait but none could be scheduled",
                             (long long)e->waiting.n);
        return CAI_OK;
    }
    const int64_t bs = e->opt.block_size, NB = e->opt.max_batch;
    memset(e->h_idx, 0, e->idx_count * sizeof(int32_t));
    step_io io = {.n_seq = n};
    io.tokens = e->h_idx;
    io.pos = e->h_idx + e->Nmax;
    io.slots = e->h_idx + 2 * e->Nmax;
    io.q_start = e->h_idx + 3 * e->Nmax;
    io.ctx_len = io.q_start + NB + 1;
    io.rows = io.ctx_len + NB;
    io.tables = io.rows + e->Rmax;
    int64_t N = 0, R = 0;
    for (int64_t i = 0; i < n; i++) {
        seq_t *s = e->sel[i];
        const int64_t q = e->sel_q[i];
        io.q_start[i] = (int32_t)N;
        for (int64_t j = 0; j < q; j++) {
            const int64_t p = s->n_computed + j;
            io.tokens[N + j] = s->tok[p];
            io.pos[N + j] = (int32_t)p;
            io.slots[N + j] = (int32_t)((int64_t)s->blocks[p / bs] * bs + p % bs);
        }
        io.ctx_len[i] = (int32_t)(s->n_computed + q);
        memcpy(io.tables + i * e->max_blocks, s->blocks, (size_t)s->n_blocks * sizeof *s->blocks);
        if (s->score) {
            for (int64_t j = 0; j < q; j++, R++) {
                io.rows[R] = (int32_t)(N + j);
                e->host_row[R] = 1;
            }
        } else if (s->n_computed + q == s->n_tok) {
            e->host_row[R] = !device_greedy(&s->sp);
            io.rows[R++] = (int32_t)(N + q - 1);
        }
        N += q;
    }
    io.q_start[n] = (int32_t)N;
    io.N = N;
    io.R = R;
    for (int64_t i = 0; i < R; i++) io.n_host += e->host_row[i];
    /* A decode-only step (one query and one logits row per sequence) on a
     * device with graphs replays its bucket's graph. */
    if (e->use_graphs && N == n && R == n) {
        int64_t b = decode_bucket(e, n);
        if (b <= e->Nmax) {
            for (int64_t i = n; i < b; i++) {
                io.slots[i] = -1;
                io.q_start[i + 1] = (int32_t)(i + 1);
                io.ctx_len[i] = 1;
                io.rows[i] = (int32_t)i;
            }
            io.graph_bucket = b;
        }
    }
    CAI_CALL(forward(e, &io));
    e->st.steps++;

    /* Score, and find the rows to sample, in batch order: row r belongs to
     * the r-th reader. */
    int64_t r = 0, n_draw = 0;
    const int64_t V = e->cfg->vocab_size;
    for (int64_t i = 0; i < n; i++) {
        seq_t *s = e->sel[i];
        const int64_t q = e->sel_q[i], p0 = s->n_computed;
        if (p0 + q == s->n_tok && !s->score && s->n_tok > s->n_prompt) e->st.decode_tokens += q;
        else e->st.prefill_tokens += q;
        s->n_computed += q;
        register_blocks(e, s);
        if (s->score) {
            for (int64_t j = 0; j < q; j++, r++) {
                const int64_t p = p0 + j;
                if (p + 1 < s->n_prompt)
                    s->plp[p] = (float)log_softmax_at(e->h_logits + (size_t)(r * e->Vp), V, s->tok[p + 1]);
            }
            if (s->n_computed == s->n_tok) {
                s->finish = "stop";
                CAI_CALL(finish(e, s));
            }
            continue;
        }
        if (s->n_computed != s->n_tok) continue;
        if (!e->host_row[r]) {
            CAI_CALL(take_argmax(e, R, r++, &e->draw_res[n_draw]));
            e->draw_row[n_draw] = -1;
        } else {
            e->draw_row[n_draw] = r++;
        }
        e->draw[n_draw++] = s;
    }
    /* The rows are independent: one workspace per thread. */
    cai_status sst = CAI_OK;
    const int nt = (int)(n_draw < e->n_sws ? n_draw : e->n_sws);
#pragma omp parallel for num_threads(nt > 0 ? nt : 1) schedule(dynamic, 1)
    for (int64_t d = 0; d < n_draw; d++) {
        if (e->draw_row[d] < 0) continue;
        seq_t *s = e->draw[d];
        cai_sampling_params sp = s->sp;
        sp.seed = s->seed;
        cai_status one = cai_sample(e->sws_t[CAI_OMP_THREAD()], &sp, e->h_logits + (size_t)(e->draw_row[d] * e->Vp), V,
                                    s->tok, s->n_prompt, s->n_tok, s->n_tok - s->n_prompt, &e->draw_res[d]);
        if (one != CAI_OK) {
#pragma omp critical(cai_engine_sample_error)
            sst = sst == CAI_OK ? one : sst;
        }
    }
    CAI_CALL(sst);
    for (int64_t d = 0; d < n_draw; d++) {
        seq_t *s = e->draw[d];
        const int64_t k = s->n_tok - s->n_prompt;
        const cai_sample_result res = e->draw_res[d];
        s->tok[s->n_tok++] = res.token;
        if (s->lp) s->lp[k] = res;
        e->st.generated++;
        if ((!s->sp.ignore_eos && res.token == e->opt.eos_id) || has_stop_id(s, res.token)) s->finish = "stop";
        if (!s->finish) CAI_CALL(check_stop_strings(e, s));
        if (!s->finish && (k + 1 >= s->sp.max_new_tokens || s->n_tok >= e->max_ctx)) s->finish = "length";
        if (s->finish) CAI_CALL(finish(e, s));
    }
    return CAI_OK;
}

int cai_engine_take(cai_engine_t *e, cai_engine_output *out) {
    memset(out, 0, sizeof *out);
    if (!e || e->done.n == 0) return 0;
    seq_t *s = e->done.a[0];
    list_remove(&e->done, 0);
    out->tag = s->tag;
    out->n_prompt = s->n_prompt;
    out->n_tokens = s->n_tok - s->n_prompt;
    out->tokens = malloc((size_t)(out->n_tokens > 0 ? out->n_tokens : 1) * sizeof *out->tokens);
    if (out->tokens) memcpy(out->tokens, s->tok + s->n_prompt, (size_t)out->n_tokens * sizeof *out->tokens);
    out->logprobs = s->lp;
    s->lp = NULL;
    out->prompt_logprobs = s->plp;
    s->plp = NULL;
    out->finish_reason = s->finish;
    out->stop_string = s->stop_string;
    out->preemptions = s->preemptions;
    seq_free(s);
    return 1;
}

void cai_engine_output_free(cai_engine_output *o) {
    if (!o) return;
    free(o->tokens);
    free(o->logprobs);
    free(o->prompt_logprobs);
    memset(o, 0, sizeof *o);
}

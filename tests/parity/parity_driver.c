/* PyTorch parity driver: builds a tiny GPT-2 or Llama with colossal, runs
 * one forward/backward and three AdamW training steps, and writes everything
 * a reference implementation needs to check it into one safetensors file:
 *
 *   <name>            every parameter (canonical registry name) before training
 *   tokens, targets   I32 [B,T] (some targets CAI_IGNORE_INDEX)
 *   logits            F32 [B,T,padded vocab] of the forward
 *   loss              F32 scalar: mean cross-entropy over non-ignored targets
 *   grad.<name>       d(loss)/d(parameter) from one backward
 *   sft.tokens, sft.targets, sft.loss, sft.dlogits [B,T,padded vocab],
 *   sft.grad.<name>   the same for a batch shaped like unpacked SFT rows
 *                     (loss on assistant tokens only, padding; run_sft)
 *   pack.*            a packed batch: several conversations per row with
 *                     restarting positions and document masking (run_pack;
 *                     host device only)
 *   train.tokens, train.targets   I32 [steps, n_micro, B, T]
 *   train.loss, train.grad_norm, train.lr   F32 [steps] from cai_train_step
 *   step3.<name>      every parameter after the training steps
 *   infer.*           the inference engine's greedy continuations and
 *                     prompt log-probabilities (run_inference)
 *
 * and the hyperparameters as __metadata__ strings. Floats are printed with
 * %.9g so the reader recovers the exact float32 values.
 *
 * Usage: parity_driver gpt2|llama OUT.safetensors [SEED] [--device host|cuda[:N]]
 *                     [--precision fp32|bf16] [--size tiny|gpu]
 *
 * --device runs everything on that device (default host). --precision bf16
 * is colossal-pretrain's `precision: bf16`: bf16 working weights, and on a
 * GPU bf16 activations (the host backend computes in f32), with f32 master
 * weights, gradients and AdamW state; the file then holds the f32 masters and
 * gradients and the bf16 logits widened to f32. --size gpu is a larger model
 * for the GPU tests (head_dim 64, T 128, vocabulary 1000: the tensor-core
 * attention path and several tiles per sequence); the default "tiny" is the
 * one the CPU parity tests check (docs/parity.md). The file's metadata names
 * the device, precision and size.
 *
 * The parameters are perturbed away from their initialisation (norm weights
 * off one, biases off zero, larger matrices) so that every parameter
 * influences the logits: with the default init a wrongly applied bias or norm
 * weight would go unnoticed. Single process, not collective. */
#include "cai_config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/base.h"
#include "colossal/ckpt.h"
#include "colossal/infer.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/tensor.h"

enum { STEPS = 3, N_MICRO = 2, MAX_META = 48 };

/* The batch shape: a run-time choice (--size). */
static int BATCH = 2, SEQ = 16;

typedef struct {
    cai_model_family family;
    const char *path;
    uint64_t seed;
    cai_device_kind kind;
    int ordinal;
    int bf16; /* --precision bf16 */
    int big;  /* --size gpu */
} drv_opts;

/* Stream ids for this driver's own random numbers (not the model's). */
#define STREAM_TOKENS 0x7061726974790001ull
#define STREAM_PERTURB 0x7061726974790002ull

typedef struct {
    cai_st_tensor *t;
    int n, cap;
    void **owned; /* buffers to free */
    int n_owned;
    cai_st_meta meta[MAX_META];
    char meta_buf[MAX_META][2][64];
    int n_meta;
} out_file;

static cai_status out_add(out_file *f, const char *name, cai_dtype dt, int ndim, const uint64_t *shape, const void *src,
                          size_t bytes) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 64;
        void *p = realloc(f->t, (size_t)cap * sizeof *f->t);
        void *q = realloc(f->owned, (size_t)cap * 2 * sizeof *f->owned);
        if (!p || !q) {
            free(p == f->t ? NULL : p);
            return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: growing the tensor list to %d", cap);
        }
        f->t = p;
        f->owned = q;
        f->cap = cap;
    }
    char *nm = strdup(name);
    void *data = malloc(bytes ? bytes : 1);
    if (!nm || !data) {
        free(nm);
        free(data);
        return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: copy of '%s' (%zu bytes)", name, bytes);
    }
    memcpy(data, src, bytes);
    f->owned[f->n_owned++] = nm;
    f->owned[f->n_owned++] = data;
    cai_st_tensor *t = &f->t[f->n++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    return CAI_OK;
}

static void out_meta(out_file *f, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void out_meta(out_file *f, const char *key, const char *fmt, ...) {
    if (f->n_meta >= MAX_META) return; /* caught by the reader: a missing key is an error there */
    va_list ap;
    va_start(ap, fmt);
    snprintf(f->meta_buf[f->n_meta][0], sizeof f->meta_buf[0][0], "%s", key);
    vsnprintf(f->meta_buf[f->n_meta][1], sizeof f->meta_buf[0][1], fmt, ap);
    va_end(ap);
    f->meta[f->n_meta].key = f->meta_buf[f->n_meta][0];
    f->meta[f->n_meta].value = f->meta_buf[f->n_meta][1];
    f->n_meta++;
}

static void out_free(out_file *f) {
    for (int i = 0; i < f->n_owned; i++) free(f->owned[i]);
    free(f->owned);
    free(f->t);
}

/* A contiguous tensor's elements copied to the host as F32 (BF16/F16, e.g.
 * bf16 logits, widened exactly). */
static cai_status fetch_f32(cai_device_t *dev, const cai_tensor *t, float *dst) {
    size_t n = (size_t)cai_tensor_numel(t);
    if (t->dtype == CAI_DTYPE_F32) {
        CAI_CALL(cai_device_copy(dev, dst, t->data, n * sizeof(float), CAI_COPY_D2H));
        return CAI_OK;
    }
    if (t->dtype != CAI_DTYPE_BF16 && t->dtype != CAI_DTYPE_F16)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parity driver: expected an F32, BF16 or F16 tensor, got %s",
                         cai_dtype_name(t->dtype));
    uint16_t *half = malloc(n * sizeof *half + 1);
    if (!half) return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: %zu half-precision values", n);
    cai_status st = cai_device_copy(dev, half, t->data, n * sizeof *half, CAI_COPY_D2H);
    if (st == CAI_OK) st = cai_convert_host(dst, CAI_DTYPE_F32, half, t->dtype, n);
    free(half);
    CAI_CALL(st);
    return CAI_OK;
}

/* Every parameter (or its gradient) under `prefix`, in registration order. */
static cai_status dump_params(out_file *f, cai_model_t *m, const char *prefix, int grads) {
    const cai_registry_t *reg = cai_model_registry(m);
    cai_device_t *dev = cai_model_device(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        cai_tensor master, grad;
        CAI_CALL(cai_model_param(m, pi->name, &master, &grad));
        const cai_tensor *t = grads ? &grad : &master;
        size_t n = (size_t)pi->numel;
        float *buf = malloc(n * sizeof *buf);
        if (!buf) return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: %zu floats for '%s'", n, pi->name);
        cai_status st = fetch_f32(dev, t, buf);
        char name[CAI_PARAM_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%s", prefix, pi->name);
        if (st == CAI_OK) st = out_add(f, name, CAI_DTYPE_F32, pi->ndim, pi->shape, buf, n * sizeof *buf);
        free(buf);
        CAI_CALL(st);
    }
    return CAI_OK;
}

/* Moves every parameter off its initialisation: norm weights 1 + 0.2 z,
 * biases 0.1 z, matrices 0.08 z (z standard normal), with this driver's own
 * stream so the values do not depend on the model's init. Tie copies are
 * left alone: cai_model_params_updated copies the primary into them. */
static cai_status perturb_params(cai_model_t *m, uint64_t seed) {
    const cai_registry_t *reg = cai_model_registry(m);
    cai_device_t *dev = cai_model_device(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        if (pi->tie_primary != i) continue;
        cai_tensor master;
        CAI_CALL(cai_model_param(m, pi->name, &master, NULL));
        size_t n = (size_t)pi->numel;
        float *buf = malloc(n * sizeof *buf);
        if (!buf) return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: %zu floats for '%s'", n, pi->name);
        const int is_bias = strstr(pi->name, ".bias") != NULL;
        const int is_norm_w = !is_bias && pi->ndim == 1;
        uint64_t stream = STREAM_PERTURB ^ cai_hash64(pi->name);
        for (size_t k = 0; k < n; k++) {
            float z = cai_rng_normal(seed, stream, k);
            buf[k] = is_norm_w ? 1.0f + 0.2f * z : is_bias ? 0.1f * z : 0.08f * z;
        }
        cai_status st = cai_device_copy(dev, master.data, buf, n * sizeof *buf, CAI_COPY_H2D);
        free(buf);
        CAI_CALL(st);
    }
    CAI_CALL(cai_model_params_updated(m));
    return CAI_OK;
}

/* Tokens uniform in [0, vocab); targets the next token (a random one at the
 * end), with about one in six positions set to CAI_IGNORE_INDEX. */
static void make_batch(uint64_t seed, uint64_t batch_id, int vocab, int32_t *tokens, int32_t *targets) {
    const int n = BATCH * SEQ;
    for (int i = 0; i < n; i++) {
        cai_philox_block r = cai_philox4x32(seed, STREAM_TOKENS + batch_id, (uint64_t)i);
        tokens[i] = (int32_t)(r.v[0] % (uint32_t)vocab);
    }
    for (int i = 0; i < n; i++) {
        int t = i % SEQ;
        if (t + 1 < SEQ) {
            targets[i] = tokens[i + 1];
        } else {
            cai_philox_block r = cai_philox4x32(seed, STREAM_TOKENS + batch_id, (uint64_t)(n + i));
            targets[i] = (int32_t)(r.v[0] % (uint32_t)vocab);
        }
        cai_philox_block r = cai_philox4x32(seed, STREAM_TOKENS + batch_id, (uint64_t)(2 * n + i));
        if (r.v[1] % 6u == 0u) targets[i] = CAI_IGNORE_INDEX;
    }
}

/* A batch shaped like the data layer's unpacked SFT rows (cai_sft_loader
 * with packing off): a system/user prefix, an assistant answer, a second
 * user turn and answer, then padding to SEQ, each row's conversation a
 * little shorter than the last. Targets are the next token where that token
 * is the assistant's (the data layer's rule) and CAI_IGNORE_INDEX
 * elsewhere: on the prompts, at each conversation's last token and over the
 * padding, whose tokens are SFT_PAD. */
#define SFT_PAD 0
static int sft_len(int b) { return SEQ - 2 - b * (SEQ / 8); }
static void make_sft_batch(uint64_t seed, int vocab, int32_t *tokens, int32_t *targets) {
    for (int b = 0; b < BATCH; b++) {
        const int len = sft_len(b), a1 = SEQ / 4, u2 = SEQ / 2, a2 = 5 * SEQ / 8;
        int32_t *tk = tokens + (size_t)b * SEQ, *tg = targets + (size_t)b * SEQ;
        for (int t = 0; t < SEQ; t++) {
            cai_philox_block r = cai_philox4x32(seed, STREAM_TOKENS ^ 0x5f7ull, (uint64_t)(b * SEQ + t));
            tk[t] = t < len ? (int32_t)(r.v[0] % (uint32_t)vocab) : SFT_PAD;
        }
        for (int t = 0; t < SEQ; t++) {
            const int next = t + 1, trained = next < len && ((next >= a1 && next < u2) || next >= a2);
            tg[t] = trained ? tk[next] : CAI_IGNORE_INDEX;
        }
    }
}

/* Every parameter's gradient, in registration order, into one host array
 * (*out, *n floats; the caller frees it). */
static cai_status gather_grads(cai_model_t *m, float **out, size_t *n) {
    const cai_registry_t *reg = cai_model_registry(m);
    size_t total = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) total += (size_t)cai_registry_param(reg, i)->numel;
    float *buf = malloc(total * sizeof *buf + 1);
    if (!buf) return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: %zu gradient floats", total);
    size_t at = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        cai_tensor grad;
        cai_status st = cai_model_param(m, pi->name, NULL, &grad);
        if (st == CAI_OK) st = fetch_f32(cai_model_device(m), &grad, buf + at);
        if (st != CAI_OK) {
            free(buf);
            CAI_CALL(st);
        }
        at += (size_t)pi->numel;
    }
    *out = buf;
    *n = total;
    return CAI_OK;
}

/* Forward and backward of one SFT batch from zeroed gradients: the loss,
 * the gradients (*grads, the caller frees them) and, when dlogits is given,
 * the logits' gradient [B,T,Vp], which the backward leaves in the logits'
 * buffer (model.h). */
static cai_status sft_pass(cai_model_t *m, const int32_t *tokens, const int32_t *targets, float *loss, float *dlogits,
                           float **grads, size_t *n) {
    CAI_CALL(cai_model_zero_grad(m));
    CAI_CALL(cai_model_forward(m, tokens, targets, loss));
    cai_tensor lt;
    CAI_CALL(cai_model_logits(m, &lt));
    CAI_CALL(cai_model_backward(m, 1.0f));
    if (dlogits) CAI_CALL(fetch_f32(cai_model_device(m), &lt, dlogits));
    CAI_CALL(gather_grads(m, grads, n));
    return CAI_OK;
}

/* The masked SFT loss: sft.tokens, sft.targets, sft.loss, sft.dlogits and
 * sft.grad.<name> for the reference to recompute, and two exact checks
 * here. The logits' gradient is exactly zero on every row whose target is
 * ignored (the loss reaches a prompt or padding position only through later
 * trained positions attending to it, never through its own logits); and
 * the padding is inert: other tokens there give bitwise the same loss and
 * gradients. */
static cai_status run_sft(out_file *f, cai_model_t *m, uint64_t seed) {
    const cai_model_config *c = cai_model_config_of(m);
    const int64_t Vp = cai_model_padded_vocab(m);
    const size_t bt = (size_t)BATCH * SEQ, nl = bt * (size_t)Vp;
    int32_t *tok = malloc(2 * bt * sizeof *tok), *tgt = malloc(bt * sizeof *tgt);
    float *dl = malloc(nl * sizeof *dl), *g1 = NULL, *g2 = NULL;
    cai_status st = CAI_OK;
    if (!tok || !tgt || !dl) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "parity driver: SFT batch buffers");
        goto done;
    }
    make_sft_batch(seed, c->vocab_size, tok, tgt);
    float loss = 0, loss2 = 0;
    size_t n1 = 0, n2 = 0;
    CAI_CALL_GOTO(sft_pass(m, tok, tgt, &loss, dl, &g1, &n1), st, done);
    for (size_t i = 0; i < bt; i++) {
        if (tgt[i] != CAI_IGNORE_INDEX) continue;
        for (int64_t v = 0; v < Vp; v++)
            if (dl[i * (size_t)Vp + (size_t)v] != 0.0f) {
                st = CAI_ERROR(CAI_ERR_INTERNAL,
                               "parity driver: SFT row %zu, position %zu has an ignored target but its logit %" PRId64
                               " has gradient %g (must be exactly 0)",
                               i / (size_t)SEQ, i % (size_t)SEQ, v, (double)dl[i * (size_t)Vp + (size_t)v]);
                goto done;
            }
    }
    const uint64_t s2[2] = {(uint64_t)BATCH, (uint64_t)SEQ}, s3[3] = {(uint64_t)BATCH, (uint64_t)SEQ, (uint64_t)Vp};
    CAI_CALL_GOTO(out_add(f, "sft.tokens", CAI_DTYPE_I32, 2, s2, tok, bt * sizeof *tok), st, done);
    CAI_CALL_GOTO(out_add(f, "sft.targets", CAI_DTYPE_I32, 2, s2, tgt, bt * sizeof *tgt), st, done);
    CAI_CALL_GOTO(out_add(f, "sft.loss", CAI_DTYPE_F32, 0, NULL, &loss, sizeof loss), st, done);
    CAI_CALL_GOTO(out_add(f, "sft.dlogits", CAI_DTYPE_F32, 3, s3, dl, nl * sizeof *dl), st, done);
    CAI_CALL_GOTO(dump_params(f, m, "sft.grad.", 1), st, done);

    int32_t *tok2 = tok + bt;
    int changed = 0;
    for (size_t i = 0; i < bt; i++) {
        tok2[i] = tok[i];
        if ((int)(i % (size_t)SEQ) >= sft_len((int)(i / (size_t)SEQ))) {
            tok2[i] = (int32_t)((7 + 13 * i) % (size_t)c->vocab_size);
            changed += tok2[i] != tok[i];
        }
    }
    CAI_CALL_GOTO(sft_pass(m, tok2, tgt, &loss2, NULL, &g2, &n2), st, done);
    if (!changed || memcmp(&loss, &loss2, sizeof loss) != 0 || n1 != n2 || memcmp(g1, g2, n1 * sizeof *g1) != 0) {
        size_t at = 0;
        while (at < n1 && at < n2 && memcmp(g1 + at, g2 + at, sizeof *g1) == 0) at++;
        st = CAI_ERROR(CAI_ERR_INTERNAL,
                       "parity driver: %d padding tokens changed: loss %.9g -> %.9g, gradient element %zu of %zu "
                       "%.9g -> %.9g (the padding must be inert, bitwise)",
                       changed, (double)loss, (double)loss2, at, n1, at < n1 ? (double)g1[at] : 0.0,
                       at < n2 ? (double)g2[at] : 0.0);
        goto done;
    }
    printf(
        "parity_driver: SFT batch: loss %.7f; ignored rows' logit gradients exactly zero; %d padding tokens "
        "changed, loss and gradients bitwise equal\n",
        (double)loss, changed);
done:
    free(tok);
    free(tgt);
    free(dl);
    free(g1);
    free(g2);
    return st;
}

/* Packed SFT rows (cai_model_set_packing): conversations of varied length
 * back to back in each row, positions restarting at 0 in each, attention
 * kept inside each (document masking), the row's tail padding. Targets are
 * the next token of the same conversation (ignored at its last token and
 * over the padding).
 *   pack.tokens, pack.targets, pack.positions, pack.doc_ids I32 [B,T],
 *   pack.loss, pack.grad.<name>
 * Host device only: the CUDA attention does not take document ids. */
static const int pack_lens[2][4] = {{5, 7, 4, 0}, {9, 3, 0, 0}}; /* per row; the rest is padding */
static cai_status run_pack(out_file *f, cai_model_t *m, uint64_t seed) {
    const cai_model_config *c = cai_model_config_of(m);
    const size_t bt = (size_t)BATCH * SEQ;
    int32_t *buf = malloc(4 * bt * sizeof *buf);
    if (!buf) return CAI_ERROR(CAI_ERR_NOMEM, "parity driver: packed batch buffers");
    int32_t *tok = buf, *tgt = buf + bt, *pos = buf + 2 * bt, *doc = buf + 3 * bt;
    for (int b = 0; b < BATCH; b++) {
        int t = 0;
        for (int d = 0; d < 4 && b < 2 && pack_lens[b][d] > 0 && t + pack_lens[b][d] <= SEQ; d++)
            for (int i = 0; i < pack_lens[b][d]; i++, t++) {
                size_t n = (size_t)b * SEQ + (size_t)t;
                cai_philox_block r = cai_philox4x32(seed, STREAM_TOKENS ^ 0x9acull, (uint64_t)n);
                tok[n] = (int32_t)(r.v[0] % (uint32_t)c->vocab_size);
                pos[n] = i;
                doc[n] = b * 4 + d;
            }
        for (int i = 0; t < SEQ; i++, t++) { /* padding: a document of its own */
            size_t n = (size_t)b * SEQ + (size_t)t;
            tok[n] = SFT_PAD;
            pos[n] = i;
            doc[n] = b * 4 + 3;
        }
    }
    for (size_t n = 0; n < bt; n++) {
        int last = n % (size_t)SEQ == (size_t)SEQ - 1 || doc[n + 1] != doc[n] || doc[n] % 4 == 3;
        tgt[n] = last ? CAI_IGNORE_INDEX : tok[n + 1];
    }
    float loss = 0, *g = NULL;
    size_t ng = 0;
    cai_status st = cai_model_set_packing(m, pos, doc);
    if (st == CAI_OK) st = sft_pass(m, tok, tgt, &loss, NULL, &g, &ng);
    /* the rest of the driver runs plain rows */
    cai_status st2 = cai_model_set_packing(m, NULL, NULL);
    if (st == CAI_OK) st = st2;
    free(g);
    const uint64_t s2[2] = {(uint64_t)BATCH, (uint64_t)SEQ};
    static const char *names[4] = {"pack.tokens", "pack.targets", "pack.positions", "pack.doc_ids"};
    for (int k = 0; k < 4 && st == CAI_OK; k++)
        st = out_add(f, names[k], CAI_DTYPE_I32, 2, s2, buf + k * bt, bt * sizeof *buf);
    if (st == CAI_OK) st = out_add(f, "pack.loss", CAI_DTYPE_F32, 0, NULL, &loss, sizeof loss);
    if (st == CAI_OK) st = dump_params(f, m, "pack.grad.", 1);
    if (st == CAI_OK) printf("parity_driver: packed batch: loss %.7f\n", (double)loss);
    free(buf);
    return st;
}

/* The inference engine over the model's (perturbed, untrained) weights:
 * greedy continuations of prompts of 1, 7 and max_seq_len - INFER_NEW
 * tokens (several prefill chunks and decode steps, blocks of 4), and the
 * log-probabilities of a max_seq_len-token prompt read as a score request.
 *   infer.prompts [3, max_seq_len] I32 (zero padded), infer.prompt_len [3],
 *   infer.tokens [3, INFER_NEW], infer.score_tokens [max_seq_len],
 *   infer.prompt_logprobs [max_seq_len - 1] F32 */
enum { INFER_NEW = 6, INFER_P = 3 };
static cai_status run_inference(out_file *f, cai_model_t *m, uint64_t seed) {
    const cai_model_config *c = cai_model_config_of(m);
    const int T = c->max_seq_len;
    const int lens[INFER_P] = {1, 7, T - INFER_NEW};
    int32_t *prompts = calloc((size_t)(INFER_P * T), sizeof *prompts), *score = malloc((size_t)T * sizeof *score);
    int32_t gen[INFER_P][INFER_NEW], plen[INFER_P];
    float *lp = malloc((size_t)T * sizeof *lp);
    cai_engine_t *e = NULL;
    cai_status st = prompts && score && lp ? CAI_OK : CAI_ERROR(CAI_ERR_NOMEM, "parity driver: prompts");
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < INFER_P * T && st == CAI_OK; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompts[i] = (int32_t)((x >> 33) % (uint64_t)c->vocab_size);
    }
    for (int i = 0; i < T && st == CAI_OK; i++) score[i] = prompts[(i * 7) % (INFER_P * T)];
    cai_engine_options o = cai_engine_options_default();
    o.block_size = 4;
    o.max_tokens_per_step = 9;
    if (st == CAI_OK) st = cai_engine_create(&e, cai_model_weights(m), NULL, &o);
    cai_sampling_params sp = cai_sampling_default();
    sp.max_new_tokens = INFER_NEW;
    sp.ignore_eos = 1;
    for (int i = 0; i < INFER_P && st == CAI_OK; i++) {
        plen[i] = lens[i];
        st = cai_engine_add(e, i, prompts + (size_t)i * (size_t)T, lens[i], &sp, 0);
    }
    if (st == CAI_OK) st = cai_engine_add(e, INFER_P, score, T, &sp, 1);
    while (st == CAI_OK && cai_engine_pending(e) > 0) {
        st = cai_engine_step(e);
        cai_engine_output r;
        while (st == CAI_OK && cai_engine_take(e, &r)) {
            if (r.tag < INFER_P) memcpy(gen[r.tag], r.tokens, sizeof gen[0]);
            else memcpy(lp, r.prompt_logprobs, (size_t)(T - 1) * sizeof *lp);
            cai_engine_output_free(&r);
        }
    }
    const uint64_t ps[2] = {INFER_P, (uint64_t)T}, pn[1] = {INFER_P}, gs[2] = {INFER_P, INFER_NEW},
                   sn[1] = {(uint64_t)T}, ln[1] = {(uint64_t)T - 1};
    if (st == CAI_OK)
        st = out_add(f, "infer.prompts", CAI_DTYPE_I32, 2, ps, prompts, (size_t)(INFER_P * T) * sizeof *prompts);
    if (st == CAI_OK) st = out_add(f, "infer.prompt_len", CAI_DTYPE_I32, 1, pn, plen, sizeof plen);
    if (st == CAI_OK) st = out_add(f, "infer.tokens", CAI_DTYPE_I32, 2, gs, gen, sizeof gen);
    if (st == CAI_OK) st = out_add(f, "infer.score_tokens", CAI_DTYPE_I32, 1, sn, score, (size_t)T * sizeof *score);
    if (st == CAI_OK) st = out_add(f, "infer.prompt_logprobs", CAI_DTYPE_F32, 1, ln, lp, (size_t)(T - 1) * sizeof *lp);
    cai_engine_free(e);
    free(prompts);
    free(score);
    free(lp);
    return st;
}

static cai_status run(const drv_opts *op) {
    const cai_model_family family = op->family;
    const char *path = op->path;
    const uint64_t seed = op->seed;
    cai_model_config cfg = cai_model_config_default(family);
    cfg.vocab_size = op->big ? 1000 : 97;
    cfg.vocab_multiple = 128;
    cfg.n_layers = 2;
    cfg.d_model = op->big ? 256 : 64; /* 4 heads: head_dim 64 (the tensor-core tile) or 16 */
    cfg.n_heads = 4;
    cfg.max_seq_len = op->big ? 160 : 24; /* > SEQ: unused learned positions must get zero gradient but still decay */
    cfg.norm_eps = 1e-5f;
    cfg.init_std = 0.02f;
    cfg.seed = seed;
    if (family == CAI_MODEL_LLAMA) {
        cfg.n_kv_heads = 2;
        cfg.ffn_hidden = op->big ? 688 : 176;
        cfg.rope_theta = 10000.0f;
        cfg.tie_embeddings = 0;
    } else {
        cfg.n_kv_heads = 4;
        cfg.ffn_hidden = op->big ? 1024 : 256;
        cfg.tie_embeddings = 1;
    }
    if (op->bf16) {
        /* As colossal-pretrain's apply_precision: the host backend computes
         * in f32 over bf16-rounded weights. */
        cfg.param_dtype = CAI_DTYPE_BF16;
        cfg.act_dtype = op->kind == CAI_DEVICE_HOST ? CAI_DTYPE_F32 : CAI_DTYPE_BF16;
    }
    cai_adamw_config oc = cai_adamw_config_default();
    oc.schedule.kind = CAI_LR_CONSTANT;
    oc.schedule.lr = 2e-3f;
    oc.schedule.min_lr = 0.0f;
    oc.schedule.warmup_steps = 2; /* step lrs 1e-3, 2e-3, 2e-3: the schedule feeds the update */
    oc.schedule.decay_steps = 2;
    oc.beta1 = 0.9f;
    oc.beta2 = 0.95f;
    oc.eps = 1e-8f;
    oc.weight_decay = 0.1f;
    /* Below the gradient norms these models have (~1-3): every step clips,
     * so the clip coefficient is part of what is compared. */
    oc.grad_clip = 0.5f;

    cai_status st = CAI_OK;
    cai_device_t *dev = NULL;
    cai_model_t *m = NULL;
    cai_optim_t *o = NULL;
    out_file f;
    memset(&f, 0, sizeof f);
    float *logits = NULL;
    int32_t *tokens = NULL, *targets = NULL, *ttok = NULL, *ttgt = NULL;
    const size_t bt_n = (size_t)BATCH * SEQ;

    CAI_CALL(cai_device_init(&dev, op->kind, op->ordinal, 1));
    cai_model_options mo = cai_model_options_default(&cfg);
    mo.batch = BATCH;
    mo.seq_len = SEQ;
    CAI_CALL_GOTO(cai_model_create(&m, dev, &cfg, &mo), st, done);
    const cai_model_config *rc = cai_model_config_of(m);
    const int64_t Vp = cai_model_padded_vocab(m);
    CAI_CALL_GOTO(perturb_params(m, seed), st, done);
    CAI_CALL_GOTO(dump_params(&f, m, "", 0), st, done);
    CAI_CALL_GOTO(run_inference(&f, m, seed), st, done);

    tokens = malloc(bt_n * sizeof *tokens);
    targets = malloc(bt_n * sizeof *targets);
    ttok = malloc((size_t)STEPS * N_MICRO * bt_n * sizeof *ttok);
    ttgt = malloc((size_t)STEPS * N_MICRO * bt_n * sizeof *ttgt);
    if (!tokens || !targets || !ttok || !ttgt) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "parity driver: token buffers for B=%d, T=%d", BATCH, SEQ);
        goto done;
    }
    make_batch(seed, 0, rc->vocab_size, tokens, targets);
    const uint64_t bt[2] = {(uint64_t)BATCH, (uint64_t)SEQ};
    CAI_CALL_GOTO(out_add(&f, "tokens", CAI_DTYPE_I32, 2, bt, tokens, bt_n * sizeof *tokens), st, done);
    CAI_CALL_GOTO(out_add(&f, "targets", CAI_DTYPE_I32, 2, bt, targets, bt_n * sizeof *targets), st, done);

    /* One forward and backward: logits, loss, gradients. */
    float loss = 0;
    CAI_CALL_GOTO(cai_model_zero_grad(m), st, done);
    CAI_CALL_GOTO(cai_model_forward(m, tokens, targets, &loss), st, done);
    cai_tensor lt;
    CAI_CALL_GOTO(cai_model_logits(m, &lt), st, done);
    const size_t n_logits = (size_t)BATCH * SEQ * (size_t)Vp;
    if ((size_t)cai_tensor_numel(&lt) != n_logits) {
        st = CAI_ERROR(CAI_ERR_INTERNAL, "parity driver: logits have %" PRId64 " elements, expected B*T*Vpad = %zu",
                       cai_tensor_numel(&lt), n_logits);
        goto done;
    }
    logits = malloc(n_logits * sizeof *logits);
    if (!logits) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "parity driver: logits buffer");
        goto done;
    }
    CAI_CALL_GOTO(fetch_f32(dev, &lt, logits), st, done);
    const uint64_t ls[3] = {(uint64_t)BATCH, (uint64_t)SEQ, (uint64_t)Vp};
    CAI_CALL_GOTO(out_add(&f, "logits", CAI_DTYPE_F32, 3, ls, logits, n_logits * sizeof *logits), st, done);
    CAI_CALL_GOTO(out_add(&f, "loss", CAI_DTYPE_F32, 0, NULL, &loss, sizeof loss), st, done);
    CAI_CALL_GOTO(cai_model_backward(m, 1.0f), st, done);
    CAI_CALL_GOTO(dump_params(&f, m, "grad.", 1), st, done);
    CAI_CALL_GOTO(run_sft(&f, m, seed), st, done);
    if (cai_model_device(m)->kind == CAI_DEVICE_HOST) CAI_CALL_GOTO(run_pack(&f, m, seed), st, done);

    /* Training steps, each over N_MICRO microbatches. The first microbatch of
     * step 1 is the batch above, so step 1 starts from the same gradients. */
    float s_loss[STEPS], s_norm[STEPS], s_lr[STEPS];
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < N_MICRO; k++) {
            size_t at = ((size_t)s * N_MICRO + (size_t)k) * bt_n;
            make_batch(seed, (uint64_t)(s * N_MICRO + k), rc->vocab_size, ttok + at, ttgt + at);
        }
    CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_local_driver(m, o, &drv), st, done);
    for (int s = 0; s < STEPS; s++) {
        cai_step_stats ss;
        CAI_CALL_GOTO(cai_train_step(&drv, NULL, NULL, ttok + (size_t)s * N_MICRO * bt_n,
                                     ttgt + (size_t)s * N_MICRO * bt_n, N_MICRO, &ss),
                      st, done);
        s_loss[s] = ss.loss;
        s_norm[s] = ss.grad_norm;
        s_lr[s] = ss.lr;
    }
    const uint64_t ts[4] = {STEPS, N_MICRO, (uint64_t)BATCH, (uint64_t)SEQ}, sn[1] = {STEPS};
    const size_t tsz = (size_t)STEPS * N_MICRO * bt_n * sizeof *ttok;
    CAI_CALL_GOTO(out_add(&f, "train.tokens", CAI_DTYPE_I32, 4, ts, ttok, tsz), st, done);
    CAI_CALL_GOTO(out_add(&f, "train.targets", CAI_DTYPE_I32, 4, ts, ttgt, tsz), st, done);
    CAI_CALL_GOTO(out_add(&f, "train.loss", CAI_DTYPE_F32, 1, sn, s_loss, sizeof s_loss), st, done);
    CAI_CALL_GOTO(out_add(&f, "train.grad_norm", CAI_DTYPE_F32, 1, sn, s_norm, sizeof s_norm), st, done);
    CAI_CALL_GOTO(out_add(&f, "train.lr", CAI_DTYPE_F32, 1, sn, s_lr, sizeof s_lr), st, done);
    CAI_CALL_GOTO(dump_params(&f, m, "step3.", 0), st, done);

    out_meta(&f, "family", "%s", cai_model_family_name(rc->family));
    out_meta(&f, "vocab_size", "%d", rc->vocab_size);
    out_meta(&f, "padded_vocab", "%" PRId64, Vp);
    out_meta(&f, "n_layers", "%d", rc->n_layers);
    out_meta(&f, "d_model", "%d", rc->d_model);
    out_meta(&f, "n_heads", "%d", rc->n_heads);
    out_meta(&f, "n_kv_heads", "%d", rc->n_kv_heads);
    out_meta(&f, "ffn_hidden", "%d", rc->ffn_hidden);
    out_meta(&f, "max_seq_len", "%d", rc->max_seq_len);
    out_meta(&f, "rope_theta", "%.9g", (double)rc->rope_theta);
    out_meta(&f, "norm_eps", "%.9g", (double)rc->norm_eps);
    out_meta(&f, "tie_embeddings", "%d", rc->tie_embeddings);
    out_meta(&f, "batch", "%d", BATCH);
    out_meta(&f, "seq_len", "%d", SEQ);
    out_meta(&f, "steps", "%d", STEPS);
    out_meta(&f, "n_micro", "%d", N_MICRO);
    out_meta(&f, "lr", "%.9g", (double)oc.schedule.lr);
    out_meta(&f, "warmup_steps", "%" PRId64, oc.schedule.warmup_steps);
    out_meta(&f, "lr_schedule", "%s", cai_lr_kind_name(oc.schedule.kind));
    out_meta(&f, "beta1", "%.9g", (double)oc.beta1);
    out_meta(&f, "beta2", "%.9g", (double)oc.beta2);
    out_meta(&f, "eps", "%.9g", (double)oc.eps);
    out_meta(&f, "weight_decay", "%.9g", (double)oc.weight_decay);
    out_meta(&f, "grad_clip", "%.9g", (double)oc.grad_clip);
    out_meta(&f, "device", "%s", dev->name);
    out_meta(&f, "precision", "%s", op->bf16 ? "bf16" : "fp32");
    out_meta(&f, "param_dtype", "%s", cai_dtype_name(rc->param_dtype));
    out_meta(&f, "act_dtype", "%s", cai_dtype_name(rc->act_dtype));
    out_meta(&f, "size", "%s", op->big ? "gpu" : "tiny");
    CAI_CALL_GOTO(cai_safetensors_write(path, f.t, f.n, f.meta, f.n_meta), st, done);
    printf("parity_driver: %s %s on %s: %d tensors written to %s (loss %.7f, step losses %.7f %.7f %.7f)\n",
           cai_model_family_name(rc->family), op->bf16 ? "bf16" : "fp32", dev->name, f.n, path, (double)loss,
           (double)s_loss[0], (double)s_loss[1], (double)s_loss[2]);

done:
    free(logits);
    free(tokens);
    free(targets);
    free(ttok);
    free(ttgt);
    out_free(&f);
    cai_optim_free(o);
    cai_model_free(m);
    cai_device_free(dev);
    return st;
}

static int usage(const char *prog) {
    fprintf(stderr,
            "usage: %s gpt2|llama OUT.safetensors [SEED] [--device host|cuda[:N]] [--precision fp32|bf16] "
            "[--size tiny|gpu]\n",
            prog);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage(argv[0]);
    /* The tests use the default seed; others probe how the errors spread. */
    drv_opts op = {.path = argv[2], .seed = 20240611, .kind = CAI_DEVICE_HOST};
    int i = 3;
    if (i < argc && strncmp(argv[i], "--", 2) != 0) op.seed = strtoull(argv[i++], NULL, 10);
    for (; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage(argv[0]);
        if (strcmp(k, "--device") == 0 && strcmp(v, "host") == 0) {
            op.kind = CAI_DEVICE_HOST;
        } else if (strcmp(k, "--device") == 0 && strncmp(v, "cuda", 4) == 0 && (v[4] == 0 || v[4] == ':')) {
            op.kind = CAI_DEVICE_CUDA;
            op.ordinal = v[4] ? atoi(v + 5) : 0;
        } else if (strcmp(k, "--precision") == 0 && (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0)) {
            op.bf16 = strcmp(v, "bf16") == 0;
        } else if (strcmp(k, "--size") == 0 && (strcmp(v, "tiny") == 0 || strcmp(v, "gpu") == 0)) {
            op.big = strcmp(v, "gpu") == 0;
        } else {
            fprintf(stderr, "%s: unknown option or value: %s %s\n", argv[0], k, v);
            return usage(argv[0]);
        }
    }
    if (op.big) {
        BATCH = 2;
        SEQ = 128;
    }
    cai_status st = cai_model_family_parse(argv[1], &op.family);
    if (st == CAI_OK) st = run(&op);
    if (st != CAI_OK) {
        cai_error_print(stderr);
        /* No GPU here: the automake convention for a skipped test. */
        return st == CAI_ERR_UNSUPPORTED && op.kind == CAI_DEVICE_CUDA ? 77 : 1;
    }
    return 0;
}

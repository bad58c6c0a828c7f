/* The scalar (reward / value) head: score = h . w on the host, with its own
 * gradient and AdamW state. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/rl.h"

#include <math.h>
#include <string.h>

struct cai_rl_head {
    int64_t C;
    float *w, *grad, *m, *v;
};

cai_status cai_rl_head_create(cai_rl_head_t **out, int64_t C, float std, uint64_t seed) {
    CAI_CHECK_ARG(out, "cai_rl_head_create: NULL out");
    *out = NULL;
    CAI_CHECK_ARG(C > 0, "cai_rl_head_create: C=%lld must be > 0", (long long)C);
    CAI_CHECK_ARG(std >= 0 && isfinite(std), "cai_rl_head_create: std=%g must be finite and >= 0", (double)std);
    cai_rl_head_t *h = NULL;
    CAI_CALL(cai_calloc((void **)&h, 1, sizeof *h, "rl head"));
    h->C = C;
    cai_status st = cai_calloc((void **)&h->w, (size_t)(4 * C), sizeof(float), "rl head weight, grad and moments");
    if (st != CAI_OK) {
        cai_free(h);
        return st;
    }
    h->grad = h->w + C;
    h->m = h->w + 2 * C;
    h->v = h->w + 3 * C;
    if (std > 0)
        for (int64_t i = 0; i < C; i++) h->w[i] = std * cai_rng_normal(seed, 0, (uint64_t)i);
    *out = h;
    return CAI_OK;
}

void cai_rl_head_free(cai_rl_head_t *h) {
    if (!h) return;
    cai_free(h->w);
    cai_free(h);
}

int64_t cai_rl_head_width(const cai_rl_head_t *h) { return h ? h->C : 0; }

cai_status cai_rl_head_forward(const cai_rl_head_t *h, int64_t N, const float *hidden, float *out) {
    CAI_CHECK_ARG(h && hidden && out, "cai_rl_head_forward: head, hidden and out must not be NULL");
    CAI_CHECK_ARG(N > 0, "cai_rl_head_forward: N=%lld must be > 0", (long long)N);
    const int64_t C = h->C;
    for (int64_t n = 0; n < N; n++) {
        const float *x = hidden + n * C;
        double s = 0;
        for (int64_t c = 0; c < C; c++) s += (double)x[c] * (double)h->w[c];
        out[n] = (float)s;
    }
    return CAI_OK;
}

cai_status cai_rl_head_backward(cai_rl_head_t *h, int64_t N, const float *hidden, const float *dout, float *dhidden) {
    CAI_CHECK_ARG(h && hidden && dout && dhidden,
                  "cai_rl_head_backward: head, hidden, dout and dhidden must not be NULL");
    CAI_CHECK_ARG(N > 0, "cai_rl_head_backward: N=%lld must be > 0", (long long)N);
    const int64_t C = h->C;
    for (int64_t c = 0; c < C; c++) {
        double g = 0;
        for (int64_t n = 0; n < N; n++) g += (double)dout[n] * (double)hidden[n * C + c];
        h->grad[c] = (float)((double)h->grad[c] + g);
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) dhidden[n * C + c] = dout[n] * h->w[c];
    return CAI_OK;
}

void cai_rl_head_tensors(cai_rl_head_t *h, float **w, float **grad, float **m, float **v) {
    if (w) *w = h ? h->w : NULL;
    if (grad) *grad = h ? h->grad : NULL;
    if (m) *m = h ? h->m : NULL;
    if (v) *v = h ? h->v : NULL;
}

void cai_rl_head_zero_grad(cai_rl_head_t *h) {
    if (h) memset(h->grad, 0, (size_t)h->C * sizeof *h->grad);
}

/* The statements of the CPU AdamW (src/ops/cpu_optim.c), so a head trained
 * here steps exactly as a model parameter would. */
cai_status cai_rl_head_adamw(cai_rl_head_t *h, int64_t step, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale) {
    CAI_CHECK_ARG(h, "cai_rl_head_adamw: NULL head");
    CAI_CHECK_ARG(step >= 1, "cai_rl_head_adamw: step=%lld must be >= 1 (bias correction divides by 1 - beta^step)",
                  (long long)step);
    CAI_CHECK_ARG(lr >= 0 && isfinite(lr), "cai_rl_head_adamw: lr=%g must be finite and >= 0", (double)lr);
    CAI_CHECK_ARG(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
                  "cai_rl_head_adamw: beta1=%g, beta2=%g must lie in [0, 1)", (double)beta1, (double)beta2);
    CAI_CHECK_ARG(eps > 0 && isfinite(eps), "cai_rl_head_adamw: eps=%g must be finite and > 0", (double)eps);
    CAI_CHECK_ARG(weight_decay >= 0 && isfinite(weight_decay),
                  "cai_rl_head_adamw: weight_decay=%g must be finite and >= 0", (double)weight_decay);
    CAI_CHECK_ARG(isfinite(grad_scale), "cai_rl_head_adamw: grad_scale=%g must be finite", (double)grad_scale);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = 1.0f - lr * weight_decay;
    for (int64_t i = 0; i < h->C; i++) {
        float gi = h->grad[i] * grad_scale;
        float mi = beta1 * h->m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * h->v[i] + (1.0f - beta2) * gi * gi;
        h->m[i] = mi;
        h->v[i] = vi;
        h->w[i] = h->w[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
    return CAI_OK;
}

typedef struct {
    const cai_rl_head_t *h;
    const int32_t *last;
    float *scores;
} score_ctx;

static cai_status score_objective(void *ctx, cai_model_objective_io *io) {
    const score_ctx *s = ctx;
    const int64_t C = io->hidden_size;
    if (C != s->h->C)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_rl_head_score_rows: the model's hidden size %lld, the head's %lld",
                         (long long)C, (long long)s->h->C);
    for (int b = 0; b < io->batch; b++) {
        s->scores[b] = 0;
        if (s->last[b] >= 0)
            CAI_CALL(
                cai_rl_head_forward(s->h, 1, io->hidden + ((int64_t)b * io->seq_len + s->last[b]) * C, &s->scores[b]));
    }
    io->loss = 0;
    return CAI_OK;
}

cai_status cai_rl_head_score_rows(const cai_rl_head_t *h, cai_model_t *m, int B, int T, const int32_t *tokens,
                                  const int32_t *last, float *scores) {
    CAI_CHECK_ARG(h && m && tokens && last && scores, "cai_rl_head_score_rows: NULL argument");
    CAI_CHECK_ARG(B > 0 && T > 0, "cai_rl_head_score_rows: B=%d, T=%d must be > 0", B, T);
    for (int b = 0; b < B; b++)
        CAI_CHECK_ARG(last[b] < T, "cai_rl_head_score_rows: row %d's last position %d is past T=%d", b, (int)last[b],
                      T);
    int32_t *tgt = NULL;
    /* every target ignored: the objective reads the hidden states only */
    CAI_CALL(cai_calloc((void **)&tgt, (size_t)B * (size_t)T, sizeof *tgt, "reward model targets"));
    for (int64_t n = 0; n < (int64_t)B * T; n++) tgt[n] = CAI_IGNORE_INDEX;
    score_ctx ctx = {h, last, scores};
    const cai_model_objective obj = {score_objective, &ctx, 1, 1.0f};
    cai_status st = cai_model_set_objective(m, &obj);
    if (st == CAI_OK) st = cai_model_forward(m, tokens, tgt, NULL);
    cai_free(tgt);
    return st;
}

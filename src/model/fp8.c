/* FP8 linear layers and their scaling state (colossal/fp8.h). */
#include "cai_config.h"
#include "colossal/fp8.h"
#include "colossal/ops.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const cai_fp8_format_names[] = {"e4m3", "hybrid", NULL};
const char *const cai_fp8_recipe_names[] = {"delayed", "current", NULL};
const char *const cai_fp8_amax_algo_names[] = {"max", "most_recent", NULL};

struct cai_fp8_layer {
    cai_fp8_t *f;
    int layer;
};

struct cai_fp8 {
    cai_fp8_config cfg;
    cai_device_t *dev;
    cai_mesh_t *mesh;
    int n_layers;
    unsigned char *on;
    cai_fp8_layer *layers;
    int64_t rows, widths[CAI_FP8_SITE_COUNT][2];
    size_t meta_len, n_state;
    float *state_dev, *state_host;
    /* cast buffers: forward x / backward dy codes, dy^T, x^T */
    uint8_t *buf[3];
    /* Each FP8 linear's weight codes W then W^T ([layer][site]), cast once
     * per optimizer step: the weights and their scale are fixed between
     * cai_fp8_step calls, so a second cast would give the same codes and
     * the same amax. A cast is current while its generation is `gen` and
     * it was made from the same weight tensor. */
    uint8_t **wcodes;
    const void **wsrc;
    uint64_t *wgen, gen;
    void *ws;
    size_t ws_bytes, codes_bytes, wcode_bytes; /* wcode_bytes: the weight codes allocated so far */
};

cai_fp8_config cai_fp8_config_default(void) {
    cai_fp8_config c = {.enabled = 0,
                        .hybrid = 1,
                        .recipe = CAI_FP8_DELAYED,
                        .amax_algo = CAI_FP8_AMAX_MAX,
                        .amax_history = 1024,
                        .margin = 0};
    snprintf(c.layers, sizeof c.layers, "auto");
    return c;
}

static cai_status parse_layers(const char *spec, int n, unsigned char *on) {
    memset(on, 0, (size_t)n);
    if (!strcmp(spec, "none")) return CAI_OK;
    if (!strcmp(spec, "all") || !strcmp(spec, "auto")) {
        int lo = !strcmp(spec, "auto") ? 1 : 0, hi = !strcmp(spec, "auto") ? n - 2 : n - 1;
        for (int i = lo; i <= hi; i++) on[i] = 1;
        return CAI_OK;
    }
    const char *p = spec;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) goto bad;
        if (*end == '-') {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q) goto bad;
        }
        if (a < 0 || b < a || b >= n)
            return CAI_ERROR(CAI_ERR_CONFIG, "fp8.layers '%s': %ld-%ld is outside the model's blocks 0-%d", spec, a, b,
                             n - 1);
        for (long i = a; i <= b; i++) on[i] = 1;
        if (*end == ',' && end[1]) end++;
        else if (*end) goto bad;
        p = end;
    }
    return CAI_OK;
bad:
    return CAI_ERROR(CAI_ERR_CONFIG,
                     "fp8.layers '%s' does not parse: expected auto, all, none or a comma list of block indices and "
                     "ranges a-b",
                     spec);
}

cai_status cai_fp8_config_check(const cai_fp8_config *c, int n_layers, unsigned char *on) {
    CAI_CHECK_ARG(c, "cai_fp8_config_check: NULL config");
    if ((int)c->recipe < 0 || c->recipe >= CAI_FP8_RECIPE_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "fp8.recipe %d: expected delayed or current", (int)c->recipe);
    if ((int)c->amax_algo < 0 || c->amax_algo >= CAI_FP8_AMAX_ALGO_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "fp8.amax_algo %d: expected max or most_recent", (int)c->amax_algo);
    if (c->amax_history < 1 || c->amax_history > 65536)
        return CAI_ERROR(CAI_ERR_CONFIG, "fp8.amax_history %d: expected 1 to 65536 steps", c->amax_history);
    if (c->margin < 0 || c->margin > 64) return CAI_ERROR(CAI_ERR_CONFIG, "fp8.margin %d: expected 0 to 64", c->margin);
    if (!memchr(c->layers, '\0', sizeof c->layers))
        return CAI_ERROR(CAI_ERR_CONFIG, "fp8.layers: longer than %d characters", CAI_FP8_LAYERS_MAX - 1);
    unsigned char *tmp = on;
    if (!tmp && !(tmp = malloc(n_layers > 0 ? (size_t)n_layers : 1)))
        return CAI_ERROR(CAI_ERR_NOMEM, "fp8.layers: %d bytes", n_layers);
    cai_status st = parse_layers(c->layers, n_layers, tmp);
    if (tmp != on) free(tmp);
    return st;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The bytes of one cast buffer and of the product workspace for these widths. */
static void buffer_bytes(const cai_device_t *dev, int64_t rows, const int64_t widths[CAI_FP8_SITE_COUNT][2],
                         size_t *codes, size_t *ws) {
    *codes = *ws = 0;
    for (int s = 0; s < CAI_FP8_SITE_COUNT; s++) {
        int64_t ic = widths[s][0], oc = widths[s][1];
        if (!ic || !oc) continue;
        *codes = max_sz(*codes, max_sz((size_t)(rows * ic), max_sz((size_t)(rows * oc), (size_t)(oc * ic))));
        *ws = max_sz(*ws, dev->ops->fp8_gemm_workspace_bytes(dev, rows, oc, ic));
        *ws = max_sz(*ws, dev->ops->fp8_gemm_workspace_bytes(dev, rows, ic, oc));
        *ws = max_sz(*ws, dev->ops->fp8_gemm_workspace_bytes(dev, oc, ic, rows));
    }
}

cai_status cai_fp8_plan_bytes(const cai_device_t *dev, const cai_fp8_config *cfg, int n_layers, int64_t rows,
                              const int64_t widths[CAI_FP8_SITE_COUNT][2], const unsigned char *runs, size_t *bytes) {
    CAI_CHECK_ARG(dev && cfg && widths && runs && bytes && n_layers >= 1 && rows >= 1,
                  "cai_fp8_plan_bytes: bad argument");
    *bytes = 0;
    if (!cfg->enabled) return CAI_OK;
    unsigned char *on = malloc((size_t)n_layers);
    if (!on) return CAI_ERROR(CAI_ERR_NOMEM, "cai_fp8_plan_bytes: %d bytes", n_layers);
    cai_status st = cai_fp8_config_check(cfg, n_layers, on);
    size_t codes, ws, w = 0;
    buffer_bytes(dev, rows, widths, &codes, &ws);
    for (int l = 0; l < n_layers && st == CAI_OK; l++)
        for (int s = 0; s < CAI_FP8_SITE_COUNT && on[l]; s++)
            if (runs[l * CAI_FP8_SITE_COUNT + s]) w += 2 * (size_t)(widths[s][0] * widths[s][1]);
    free(on);
    const size_t n_state =
        (size_t)n_layers * CAI_FP8_SITE_COUNT * CAI_FP8_OPERANDS * CAI_FP8_META_STRIDE((size_t)cfg->amax_history);
    *bytes = 3 * codes + ws + n_state * sizeof(float) + w;
    return st;
}

cai_status cai_fp8_create(cai_fp8_t **out, cai_device_t *dev, const cai_fp8_config *cfg, int n_layers, int64_t rows,
                          const int64_t widths[CAI_FP8_SITE_COUNT][2], cai_mesh_t *mesh) {
    CAI_CHECK_ARG(out && dev && cfg && widths && n_layers >= 1 && rows >= 1, "cai_fp8_create: bad argument");
    *out = NULL;
    cai_fp8_t *f = calloc(1, sizeof *f);
    if (!f) return CAI_ERROR(CAI_ERR_NOMEM, "cai_fp8_create: %zu bytes", sizeof *f);
    f->cfg = *cfg;
    f->dev = dev;
    f->mesh = mesh;
    f->n_layers = n_layers;
    f->rows = rows;
    memcpy(f->widths, widths, sizeof f->widths);
    cai_status st = CAI_OK;
    f->on = malloc((size_t)n_layers);
    f->layers = calloc((size_t)n_layers, sizeof *f->layers);
    f->meta_len = CAI_FP8_META_STRIDE((size_t)cfg->amax_history);
    f->n_state = (size_t)n_layers * CAI_FP8_SITE_COUNT * CAI_FP8_OPERANDS * f->meta_len;
    f->state_host = calloc(f->n_state, sizeof(float));
    if (!f->on || !f->layers || !f->state_host) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "cai_fp8_create: state of %zu floats", f->n_state);
        goto fail;
    }
    if ((st = cai_fp8_config_check(cfg, n_layers, f->on)) != CAI_OK) goto fail;
    size_t codes, ws;
    buffer_bytes(dev, rows, widths, &codes, &ws);
    if (!dev->ops->fp8_cast || !dev->ops->fp8_gemm) {
        st = CAI_ERROR(CAI_ERR_UNSUPPORTED, "fp8: the %s backend has no FP8 ops", dev->ops->backend);
        goto fail;
    }
    for (int i = 0; i < 3 && st == CAI_OK; i++)
        st = cai_device_alloc(dev, codes, "fp8 cast buffer", (void **)&f->buf[i]);
    const size_t n_lin = (size_t)n_layers * CAI_FP8_SITE_COUNT;
    f->wcodes = calloc(n_lin, sizeof *f->wcodes);
    f->wsrc = calloc(n_lin, sizeof *f->wsrc);
    f->wgen = calloc(n_lin, sizeof *f->wgen);
    f->gen = 1;
    if (st == CAI_OK && (!f->wcodes || !f->wsrc || !f->wgen))
        st = CAI_ERROR(CAI_ERR_NOMEM, "cai_fp8_create: weight-code table of %zu linears", n_lin);
    if (st == CAI_OK && ws) st = cai_device_alloc(dev, ws, "fp8 gemm workspace", &f->ws);
    if (st == CAI_OK)
        st = cai_device_alloc(dev, f->n_state * sizeof(float), "fp8 scaling state", (void **)&f->state_dev);
    if (st != CAI_OK) goto fail;
    f->ws_bytes = ws;
    f->codes_bytes = codes;
    st = cai_fp8_set_state(f, f->state_host, f->n_state);
    if (st != CAI_OK) goto fail;
    for (int l = 0; l < n_layers; l++) f->layers[l] = (cai_fp8_layer){f, l};
    *out = f;
    return CAI_OK;
fail:
    cai_fp8_free(f);
    return st;
}

void cai_fp8_free(cai_fp8_t *f) {
    if (!f) return;
    for (int i = 0; i < 3; i++) cai_device_dealloc(f->dev, f->buf[i]);
    for (size_t i = 0; f->wcodes && i < (size_t)f->n_layers * CAI_FP8_SITE_COUNT; i++)
        cai_device_dealloc(f->dev, f->wcodes[i]);
    free(f->wcodes);
    free(f->wsrc);
    free(f->wgen);
    cai_device_dealloc(f->dev, f->ws);
    cai_device_dealloc(f->dev, f->state_dev);
    free(f->state_host);
    free(f->layers);
    free(f->on);
    free(f);
}

const cai_fp8_layer *cai_fp8_layer_of(const cai_fp8_t *f, int layer) {
    if (!f || !f->cfg.enabled || layer < 0 || layer >= f->n_layers || !f->on[layer]) return NULL;
    return &f->layers[layer];
}

const cai_fp8_config *cai_fp8_config_of(const cai_fp8_t *f) { return f ? &f->cfg : NULL; }

int cai_fp8_at(const cai_fp8_layer *l, cai_fp8_site site) {
    return l && site >= 0 && site < CAI_FP8_SITE_COUNT && l->f->widths[site][0] > 0;
}

static cai_tensor meta_of(const cai_fp8_layer *l, cai_fp8_site site, int operand) {
    const cai_fp8_t *f = l->f;
    size_t off =
        (((size_t)l->layer * CAI_FP8_SITE_COUNT + (size_t)site) * CAI_FP8_OPERANDS + (size_t)operand) * f->meta_len;
    return cai_tensor_1d(f->dev, f->state_dev + off, CAI_DTYPE_F32, (int64_t)f->meta_len);
}

static cai_fp8_format fmt_of(const cai_fp8_t *f, int operand) {
    return operand == CAI_FP8_OP_G && f->cfg.hybrid ? CAI_FP8_E5M2 : CAI_FP8_E4M3;
}

/* A tensor's rows as a 2-D view (leading dims collapsed; contiguous rows). */
static cai_status as_2d(const char *what, const cai_tensor *t, cai_tensor *out) {
    int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols ? cai_tensor_numel(t) / cols : 0;
    if (!cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "fp8 linear: %s (%s) must be contiguous", what,
                         cai_tensor_describe(t, (char[160]){0}, 160));
    *out = cai_tensor_2d(t->device, t->data, t->dtype, rows, cols);
    return CAI_OK;
}

static cai_status cast(const cai_fp8_layer *l, cai_fp8_site site, int operand, uint8_t *q, uint8_t *qt,
                       const cai_tensor *x2) {
    cai_fp8_t *f = l->f;
    cai_tensor meta = meta_of(l, site, operand), Q, QT;
    int64_t R = x2->shape[0], C = x2->shape[1];
    if (q) Q = cai_tensor_2d(f->dev, q, CAI_DTYPE_U8, R, C);
    if (qt) QT = cai_tensor_2d(f->dev, qt, CAI_DTYPE_U8, C, R);
    return f->dev->ops->fp8_cast(f->dev, q ? &Q : NULL, qt ? &QT : NULL, x2, &meta, fmt_of(f, operand),
                                 f->cfg.recipe == CAI_FP8_CURRENT, f->cfg.margin);
}

/* The weight's codes (*q [OC,IC]) and their transpose (*qt [IC,OC]),
 * cast now unless this step has cast this tensor already. */
static cai_status weight_codes(const cai_fp8_layer *l, cai_fp8_site site, const cai_tensor *w2, const uint8_t **q,
                               const uint8_t **qt) {
    cai_fp8_t *f = l->f;
    const size_t i = (size_t)l->layer * CAI_FP8_SITE_COUNT + (size_t)site;
    /* made at the first use: a pipeline rank holds only its own layers',
     * an MoE block only its attention's */
    if (!f->wcodes[i]) {
        const size_t b = 2 * (size_t)(f->widths[site][0] * f->widths[site][1]);
        CAI_CALL(cai_device_alloc(f->dev, b, "fp8 weight codes", (void **)&f->wcodes[i]));
        f->wcode_bytes += b;
    }
    uint8_t *c = f->wcodes[i], *ct = c + cai_tensor_numel(w2);
    if (f->wgen[i] != f->gen || f->wsrc[i] != w2->data) {
        CAI_CALL(cast(l, site, CAI_FP8_OP_W, c, ct, w2));
        f->wgen[i] = f->gen;
        f->wsrc[i] = w2->data;
    }
    *q = c;
    *qt = ct;
    return CAI_OK;
}

static cai_status gemm(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *c, const uint8_t *a, int a_op,
                       const uint8_t *b, int b_op, int64_t M, int64_t N, int64_t K, float beta,
                       const cai_fp8_epilogue *ep) {
    cai_fp8_t *f = l->f;
    cai_tensor A = cai_tensor_2d(f->dev, (void *)a, CAI_DTYPE_U8, M, K),
               B = cai_tensor_2d(f->dev, (void *)b, CAI_DTYPE_U8, N, K), am = meta_of(l, site, a_op),
               bm = meta_of(l, site, b_op);
    return f->dev->ops->fp8_gemm(f->dev, c, &A, fmt_of(f, a_op), &am, &B, fmt_of(f, b_op), &bm, beta, ep, f->ws,
                                 f->ws_bytes);
}

static cai_status check_site(const cai_fp8_layer *l, cai_fp8_site site, int64_t rows, int64_t ic, int64_t oc) {
    CAI_CHECK_ARG(cai_fp8_at(l, site), "fp8 linear: site %d does not run in FP8", (int)site);
    const cai_fp8_t *f = l->f;
    if (rows > f->rows || ic * oc > f->widths[site][0] * f->widths[site][1] || ic > f->widths[site][0] ||
        oc > f->widths[site][1])
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "fp8 linear: [%" PRId64 " rows, %" PRId64 " -> %" PRId64
                         "] exceeds what the FP8 state of "
                         "site %d was sized for (%" PRId64 " rows, %" PRId64 " -> %" PRId64 ")",
                         rows, ic, oc, (int)site, f->rows, f->widths[site][0], f->widths[site][1]);
    return CAI_OK;
}

/* out = the FP8 product of inp and weight, then the epilogue: with
 * `extra` (2-D as out) the residual (act NONE) or the kept GELU input. */
static cai_status linear_fwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *out, const cai_tensor *inp,
                             const cai_tensor *weight, const cai_tensor *extra, cai_fp8_epilogue ep) {
    cai_fp8_t *f = l->f;
    cai_tensor x, w, y, e2;
    CAI_CALL(as_2d("inp", inp, &x));
    CAI_CALL(as_2d("weight", weight, &w));
    CAI_CALL(as_2d("out", out, &y));
    const int64_t N = x.shape[0], IC = x.shape[1], OC = w.shape[0];
    CAI_CALL(check_site(l, site, N, IC, OC));
    const uint8_t *wq, *wqt;
    CAI_CALL(cast(l, site, CAI_FP8_OP_X, f->buf[0], NULL, &x));
    CAI_CALL(weight_codes(l, site, &w, &wq, &wqt));
    if (extra) {
        CAI_CALL(as_2d(ep.act == CAI_FP8_ACT_GELU ? "pre" : "residual", extra, &e2));
        if (ep.act == CAI_FP8_ACT_GELU) ep.aux = &e2;
        else ep.c_in = &e2;
    }
    return gemm(l, site, &y, f->buf[0], CAI_FP8_OP_X, wq, CAI_FP8_OP_W, N, OC, IC, ep.c_in ? 1.0f : 0.0f, &ep);
}

cai_status cai_fp8_linear_fwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *out, const cai_tensor *inp,
                              const cai_tensor *weight, const cai_tensor *bias, const cai_tensor *residual) {
    CAI_CHECK_ARG(l && out && inp && weight, "cai_fp8_linear_fwd: NULL argument");
    return linear_fwd(l, site, out, inp, weight, residual, (cai_fp8_epilogue){.bias = bias});
}

cai_status cai_fp8_linear_gelu_fwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *act, cai_tensor *pre,
                                   const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias) {
    CAI_CHECK_ARG(l && act && pre && inp && weight, "cai_fp8_linear_gelu_fwd: NULL argument");
    return linear_fwd(l, site, act, inp, weight, pre, (cai_fp8_epilogue){.bias = bias, .act = CAI_FP8_ACT_GELU});
}

/* Both backward passes; with pre, dinp = gelu'(pre) * (dout W) (the
 * GELU's backward in the input product's epilogue). */
static cai_status linear_bwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *dinp, cai_tensor *dweight,
                             cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                             int accum_dinp, const cai_tensor *pre) {
    cai_fp8_t *f = l->f;
    cai_device_t *dev = f->dev;
    cai_tensor dy, w, x, dx, dw;
    CAI_CALL(as_2d("dout", dout, &dy));
    CAI_CALL(as_2d("weight", weight, &w));
    const int64_t N = dy.shape[0], OC = w.shape[0], IC = w.shape[1];
    CAI_CALL(check_site(l, site, N, IC, OC));
    if (dinp || dweight) CAI_CALL(cast(l, site, CAI_FP8_OP_G, f->buf[0], dweight ? f->buf[1] : NULL, &dy));
    if (dinp) {
        CAI_CALL(as_2d("dinp", dinp, &dx));
        const uint8_t *wq, *wqt;
        CAI_CALL(weight_codes(l, site, &w, &wq, &wqt));
        cai_tensor p2;
        if (pre) CAI_CALL(as_2d("pre", pre, &p2));
        const cai_fp8_epilogue ep = {.act = CAI_FP8_ACT_DGELU, .aux = &p2};
        CAI_CALL(gemm(l, site, &dx, f->buf[0], CAI_FP8_OP_G, wqt, CAI_FP8_OP_W, N, IC, OC, accum_dinp ? 1.0f : 0.0f,
                      pre ? &ep : NULL));
    }
    if (dweight) {
        CAI_CALL(as_2d("inp", inp, &x));
        CAI_CALL(as_2d("dweight", dweight, &dw));
        CAI_CALL(cast(l, site, CAI_FP8_OP_X, NULL, f->buf[2], &x));
        CAI_CALL(gemm(l, site, &dw, f->buf[1], CAI_FP8_OP_G, f->buf[2], CAI_FP8_OP_X, OC, IC, N, 1.0f, NULL));
    }
    if (dbias) CAI_CALL(dev->ops->bias_grad(dev, dbias, dout));
    return CAI_OK;
}

cai_status cai_fp8_linear_bwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *dinp, cai_tensor *dweight,
                              cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp,
                              const cai_tensor *weight, int accum_dinp) {
    CAI_CHECK_ARG(l && dout && weight && (!dweight || inp), "cai_fp8_linear_bwd: NULL argument");
    return linear_bwd(l, site, dinp, dweight, dbias, dout, inp, weight, accum_dinp, NULL);
}

cai_status cai_fp8_linear_bwd_dgelu(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *dpre, cai_tensor *dweight,
                                    cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp,
                                    const cai_tensor *weight, const cai_tensor *pre) {
    CAI_CHECK_ARG(l && dpre && dout && weight && pre && (!dweight || inp), "cai_fp8_linear_bwd_dgelu: NULL argument");
    return linear_bwd(l, site, dpre, dweight, dbias, dout, inp, weight, 0, pre);
}

cai_status cai_fp8_gather_state(cai_fp8_t *f) {
    CAI_CHECK_ARG(f, "cai_fp8_gather_state: NULL state");
    cai_device_t *dev = f->dev;
    CAI_CALL(cai_device_copy(dev, f->state_host, f->state_dev, f->n_state * sizeof(float),
                             dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H));
    if (f->mesh && cai_mesh_size(f->mesh, CAI_AXIS_WORLD) > 1)
        CAI_CALL(cai_allreduce(f->mesh, CAI_AXIS_WORLD, f->state_host, f->state_host, f->n_state, CAI_DTYPE_F32,
                               CAI_RED_MAX));
    return CAI_OK;
}

size_t cai_fp8_device_bytes(const cai_fp8_t *f) {
    return f ? 3 * f->codes_bytes + f->ws_bytes + f->n_state * sizeof(float) + f->wcode_bytes : 0;
}

void cai_fp8_weights_changed(cai_fp8_t *f) {
    if (f) f->gen++;
}

cai_status cai_fp8_step(cai_fp8_t *f) {
    CAI_CHECK_ARG(f, "cai_fp8_step: NULL state");
    cai_device_t *dev = f->dev;
    const size_t bytes = f->n_state * sizeof(float);
    f->gen++; /* the optimizer has changed the weights */
    CAI_CALL(cai_fp8_gather_state(f));
    for (size_t i = 0; i < f->n_state / f->meta_len; i++) {
        int operand = (int)(i % CAI_FP8_OPERANDS);
        cai_fp8_meta_update(f->state_host + i * f->meta_len, f->cfg.amax_history, fmt_of(f, operand), f->cfg.amax_algo,
                            f->cfg.margin);
    }
    return cai_device_copy(dev, f->state_dev, f->state_host, bytes,
                           dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D);
}

const float *cai_fp8_state(const cai_fp8_t *f, size_t *n) {
    if (n) *n = f ? f->n_state : 0;
    return f ? f->state_host : NULL;
}

cai_status cai_fp8_set_state(cai_fp8_t *f, const float *state, size_t n) {
    CAI_CHECK_ARG(f && state, "cai_fp8_set_state: NULL argument");
    if (n != f->n_state)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "fp8 state: %zu values, this model's is %zu (%d blocks x %d linears x 3 tensors x (2 + "
                         "amax_history %d)); was it saved with another fp8.amax_history or model?",
                         n, f->n_state, f->n_layers, CAI_FP8_SITE_COUNT, f->cfg.amax_history);
    if (state != f->state_host) memcpy(f->state_host, state, n * sizeof(float));
    f->gen++; /* new scales: the weights' codes are cast again */
    cai_device_t *dev = f->dev;
    CAI_CALL(cai_device_copy(dev, f->state_dev, f->state_host, n * sizeof(float),
                             dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D));
    return cai_device_sync(dev);
}

/* PyTorch parity driver for the MoE sublayer (src/model/moe.c): runs the
 * layer forward and backward for several routings and writes, for each
 * case i, into one safetensors file:
 *
 *   c<i>.x, c<i>.dy          F32 [N,C] input and output gradient
 *   c<i>.<name>              every parameter by canonical registry name
 *   c<i>.y, c<i>.dx          F32 [N,C] output and input gradient
 *   c<i>.grad.<name>         gradient of <y, dy> + aux_coef aux + z_coef z
 *   c<i>.aux, c<i>.z         F64 [1] raw losses (before their coefficients)
 *   c<i>.sel                 I32 [N,k] experts chosen, largest first
 *   c<i>.load                I64 [E] assignments per expert; c<i>.dropped I64 [1]
 *
 * and each case's configuration as __metadata__ ("c<i>.router", ...;
 * floats with %.9g). tests/parity/moe_reference.py recomputes it all in
 * PyTorch. Usage: moe_driver OUT.safetensors. Single process. */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/moe_fixture.h"
#include "colossal/ckpt.h"
#include "colossal/moe.h"

enum { N_CASES = 6, N_TOK = 24, D_MODEL = 16, MAX_T = 64, MAX_META = 16 };

typedef struct {
    const char *label;
    cai_moe_router router;
    int norm, k, shared;
    cai_moe_routing routing;
    float cf;
} moe_case;

static const moe_case k_cases[N_CASES] = {
    {"softmax top-2, shared expert", CAI_MOE_ROUTER_SOFTMAX, 1, 2, 1, CAI_MOE_DROPLESS, 0.0f},
    {"sigmoid top-2, renormalised", CAI_MOE_ROUTER_SIGMOID, 1, 2, 0, CAI_MOE_DROPLESS, 0.0f},
    {"sigmoid top-2, raw scores", CAI_MOE_ROUTER_SIGMOID, 0, 2, 0, CAI_MOE_DROPLESS, 0.0f},
    {"top-3 then softmax", CAI_MOE_ROUTER_TOPK_SOFTMAX, 1, 3, 0, CAI_MOE_DROPLESS, 0.0f},
    {"softmax top-2, capacity 0.6, 2 shared", CAI_MOE_ROUTER_SOFTMAX, 1, 2, 2, CAI_MOE_CAPACITY, 0.6f},
    {"softmax top-1 (Switch), capacity 1.0", CAI_MOE_ROUTER_SOFTMAX, 0, 1, 0, CAI_MOE_CAPACITY, 1.0f},
};

typedef struct {
    cai_st_tensor t[N_CASES * MAX_T];
    int n;
    char names[N_CASES * MAX_T][CAI_PARAM_NAME_MAX + 16];
    cai_st_meta meta[N_CASES * MAX_META + 1];
    char meta_kv[N_CASES * MAX_META][2][64];
    int n_meta;
} out_file;

static void put(out_file *o, int c, const char *name, cai_dtype dt, int64_t d0, int64_t d1, const void *data) {
    snprintf(o->names[o->n], sizeof o->names[o->n], "c%d.%s", c, name);
    cai_st_tensor *t = &o->t[o->n];
    memset(t, 0, sizeof *t);
    t->name = o->names[o->n];
    t->dtype = dt;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = (uint64_t)d0;
    t->shape[1] = (uint64_t)d1;
    t->data = data;
    o->n++;
}

static void meta(out_file *o, int c, const char *key, const char *fmt, double v) {
    snprintf(o->meta_kv[o->n_meta][0], 64, "c%d.%s", c, key);
    snprintf(o->meta_kv[o->n_meta][1], 64, fmt, v);
    o->meta[o->n_meta] = (cai_st_meta){o->meta_kv[o->n_meta][0], o->meta_kv[o->n_meta][1]};
    o->n_meta++;
}

static cai_status run_case(out_file *o, int c, cai_device_t *dev, moe_fix *f, double *raw) {
    const moe_case *mc = &k_cases[c];
    cai_moe_config cfg = cai_moe_config_default();
    cfg.n_experts = 4;
    cfg.top_k = mc->k;
    cfg.ffn = 12;
    cfg.n_shared = mc->shared;
    cfg.router = mc->router;
    cfg.norm_topk = mc->norm;
    cfg.routing = mc->routing;
    cfg.capacity_factor = mc->cf;
    /* Large coefficients, so that a wrong aux or z gradient shows. */
    cfg.aux_coef = 0.3f;
    cfg.z_coef = 0.05f;
    CAI_CALL(moe_fix_init(f, dev, &cfg, N_TOK, D_MODEL, NULL, 1000 + (uint64_t)c, 0.3f, 1));
    moe_fix_cotangent(f, 1000 + (uint64_t)c, 2);
    double obj;
    CAI_CALL(moe_fix_grads(f, &obj));
    raw[0] = f->acts.aux_raw;
    raw[1] = f->acts.z_raw;
    put(o, c, "x", CAI_DTYPE_F32, N_TOK, D_MODEL, f->x.data);
    put(o, c, "dy", CAI_DTYPE_F32, N_TOK, D_MODEL, f->dy.data);
    put(o, c, "y", CAI_DTYPE_F32, N_TOK, D_MODEL, f->y.data);
    put(o, c, "dx", CAI_DTYPE_F32, N_TOK, D_MODEL, f->dx.data);
    put(o, c, "aux", CAI_DTYPE_F64, 1, 0, &raw[0]);
    put(o, c, "z", CAI_DTYPE_F64, 1, 0, &raw[1]);
    put(o, c, "sel", CAI_DTYPE_I32, N_TOK, cfg.top_k, f->acts.sel.data);
    put(o, c, "load", CAI_DTYPE_I64, cfg.n_experts, 0, f->acts.load.data);
    put(o, c, "dropped", CAI_DTYPE_I64, 1, 0, &f->acts.dropped);
    size_t *offsets = calloc((size_t)cai_registry_count(f->reg), sizeof *offsets);
    size_t total;
    if (!offsets) return CAI_ERROR(CAI_ERR_NOMEM, "moe driver: offsets");
    CAI_CALL(cai_registry_local_layout(f->reg, &f->view, MOE_FIX_ALIGN, offsets, &total));
    for (int i = 0; i < cai_registry_count(f->reg); i++) {
        const cai_param_info *pi = cai_registry_param(f->reg, i);
        char gname[CAI_PARAM_NAME_MAX + 8];
        snprintf(gname, sizeof gname, "grad.%s", pi->name);
        put(o, c, pi->name, CAI_DTYPE_F32, (int64_t)pi->shape[0], (int64_t)pi->shape[1], f->params + offsets[i]);
        put(o, c, gname, CAI_DTYPE_F32, (int64_t)pi->shape[0], (int64_t)pi->shape[1], f->grads + offsets[i]);
    }
    free(offsets);
    meta(o, c, "router", "%.0f", (double)mc->router);
    meta(o, c, "norm_topk", "%.0f", mc->norm);
    meta(o, c, "top_k", "%.0f", mc->k);
    meta(o, c, "n_experts", "%.0f", cfg.n_experts);
    meta(o, c, "ffn", "%.0f", cfg.ffn);
    meta(o, c, "n_shared", "%.0f", mc->shared);
    meta(o, c, "capacity", "%.0f", (double)(mc->routing == CAI_MOE_CAPACITY ? f->cx.capacity : 0));
    meta(o, c, "aux_coef", "%.9g", cfg.aux_coef);
    meta(o, c, "z_coef", "%.9g", cfg.z_coef);
    fprintf(stderr, "moe parity case %d: %s (dropped %lld)\n", c, mc->label, (long long)f->acts.dropped);
    return CAI_OK;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
        return 2;
    }
    cai_device_t *dev = NULL;
    static out_file o;
    static moe_fix f[N_CASES];
    static double raw[N_CASES][2];
    cai_status st = cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1);
    for (int c = 0; c < N_CASES && st == CAI_OK; c++) st = run_case(&o, c, dev, &f[c], raw[c]);
    char cases[16];
    snprintf(cases, sizeof cases, "%d", N_CASES);
    o.meta[o.n_meta++] = (cai_st_meta){"cases", cases};
    if (st == CAI_OK) st = cai_safetensors_write(argv[1], o.t, o.n, o.meta, o.n_meta);
    if (st != CAI_OK) cai_error_print(stderr);
    for (int c = 0; c < N_CASES; c++) moe_fix_free(&f[c]);
    cai_device_free(dev);
    return st == CAI_OK ? 0 : 1;
}

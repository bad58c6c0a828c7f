/* Attention through cuDNN's fused flash-attention engines (cudnn-frontend's
 * SDPA forward and backward graphs), for builds configured with cuDNN and
 * cudnn-frontend (CAI_HAVE_CUDNN; docs/cuda.md "cuDNN attention"). Same
 * contract as the kernels in attention_flash.cu for the cases it accepts
 * (cuk_attn_cudnn_ok): q/k/v/out and their gradients of one 16-bit dtype,
 * [B,T,H,D] views with any B/T/H strides (a fused QKV buffer included), GQA,
 * no mask, a causal mask aligned top-left (offset 0) or bottom-right (offset
 * Tk - Tq), no sliding window; lse f32 [B,Hq,Tq], the natural-log
 * log-sum-exp of the scaled scores, which is what cuDNN calls its softmax
 * statistics, so either implementation's forward feeds the other's backward.
 *
 * A graph is built (cuDNN's heuristics pick and compile an engine: tens of
 * milliseconds) on the first call with a new shape, stride set, dtype,
 * mask and scale, and cached per device; each device keeps one workspace
 * that grows to the largest graph's need. The backward asks cuDNN for its
 * deterministic algorithm where a.deterministic is set (the knob
 * CAI_CUDNN_DETERMINISTIC, default 1): a training run stays bitwise
 * repeatable, as with the project's own kernels. */
#include "cuda_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CAI_HAVE_CUDNN

/* the frontend uses std::strlen without including it when built without its JSON library */
#include <cstring>
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_LSE, UID_DO, UID_DQ, UID_DK, UID_DV };

/* Everything a graph depends on; the pointers are bound at execution. */
struct GraphKey {
    int bwd, dt, mask, det, stats;
    float scale;
    std::vector<int64_t> dims; /* B Hq Hkv Tq Tk D, then every tensor's three strides */
    bool operator<(const GraphKey &o) const {
        return std::tie(bwd, dt, mask, det, stats, scale, dims) <
               std::tie(o.bwd, o.dt, o.mask, o.det, o.stats, o.scale, o.dims);
    }
};

struct DeviceState {
    cudnnHandle_t handle = nullptr;
    /* a null graph: cuDNN found no engine for that key (asked once) */
    std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> graphs;
    void *workspace = nullptr;
    int64_t workspace_bytes = 0;
};

std::mutex g_lock;
std::map<int, DeviceState> g_devices;

enum { MASK_NONE = 0, MASK_TOP_LEFT = 1, MASK_BOTTOM_RIGHT = 2 };

int mask_of(const cuk_attn &a, int64_t Tq, int64_t Tk) {
    if (!a.causal) return MASK_NONE;
    if (a.off == 0) return MASK_TOP_LEFT;
    return a.off == Tk - Tq ? MASK_BOTTOM_RIGHT : -1;
}

void say(char *err, size_t errlen, const char *what, const std::string &msg) {
    if (err && errlen) snprintf(err, errlen, "cuDNN attention: %s: %s", what, msg.c_str());
}

/* A graph tensor bound to uid with the view's [B,H,T,D] dims and strides,
 * as cuDNN orders them. */
void place(fe::graph::Tensor_attributes &a, int64_t uid, const cuk_bthd &t) {
    a.set_uid(uid).set_dim({t.B, t.H, t.T, t.D}).set_stride({t.sb, t.sh, t.st, 1});
}

fe::graph::Tensor_attributes bhtd(const char *name, int64_t uid, const cuk_bthd &t) {
    fe::graph::Tensor_attributes a;
    a.set_name(name);
    place(a, uid, t);
    return a;
}

/* lse: cuDNN's softmax statistics, f32 [B,Hq,Tq,1] contiguous. */
void place_lse(fe::graph::Tensor_attributes &a, const cuk_bthd &q) {
    a.set_uid(UID_LSE)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({q.B, q.H, q.T, 1})
        .set_stride({q.H * q.T, q.T, 1, 1});
}

void put_strides(std::vector<int64_t> &v, const cuk_bthd &t) {
    v.push_back(t.sb);
    v.push_back(t.st);
    v.push_back(t.sh);
}

/* The device's state with its handle bound to stream s (under g_lock). */
DeviceState *device_state(cudaStream_t s, char *err, size_t errlen) {
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        say(err, errlen, "cudaGetDevice", cudaGetErrorString(ce));
        return nullptr;
    }
    DeviceState &d = g_devices[dev];
    if (!d.handle) {
        cudnnStatus_t st = cudnnCreate(&d.handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            d.handle = nullptr;
            say(err, errlen, "cudnnCreate", cudnnGetErrorString(st));
            return nullptr;
        }
    }
    cudnnStatus_t st = cudnnSetStream(d.handle, s);
    if (st != CUDNN_STATUS_SUCCESS) {
        say(err, errlen, "cudnnSetStream", cudnnGetErrorString(st));
        return nullptr;
    }
    return &d;
}

/* Builds (or finds) the graph for key; make() adds its nodes. *declined:
 * cuDNN has no engine for it (then and on every later call with the key). */
template <class Make>
std::shared_ptr<fe::graph::Graph> graph_for(DeviceState &d, const GraphKey &key, Make make, int *declined, char *err,
                                            size_t errlen) {
    const char *what = key.bwd ? "building the backward graph" : "building the forward graph";
    *declined = 0;
    auto it = d.graphs.find(key);
    if (it != d.graphs.end()) {
        if (!it->second) {
            *declined = 1;
            say(err, errlen, what, "no cuDNN engine supports this case (found earlier)");
        }
        return it->second;
    }
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(key.dt == CUK_F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    make(*g);
    fe::error_t e = g->build(d.handle, {fe::HeurMode_t::A});
    if (!e.is_good()) {
        say(err, errlen, what, e.get_message());
        /* the installed cuDNN lacks the feature (an older version, another
         * GPU): remembered, so the caller may use other kernels for it */
        const fe::error_code_t c = e.get_code();
        if (c == fe::error_code_t::GRAPH_NOT_SUPPORTED || c == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED ||
            c == fe::error_code_t::HEURISTIC_QUERY_FAILED) {
            *declined = 1;
            d.graphs.emplace(key, nullptr);
        }
        return nullptr;
    }
    int64_t ws = 0;
    fe::error_t wse = g->get_workspace_size(ws);
    if (!wse.is_good()) {
        say(err, errlen, "workspace size", wse.get_message());
        return nullptr;
    }
    if (ws > d.workspace_bytes) {
        /* cudaFree waits for the device, so no queued graph still uses the old buffer */
        if (d.workspace) cudaFree(d.workspace);
        d.workspace = nullptr;
        d.workspace_bytes = 0;
        cudaError_t ce = cudaMalloc(&d.workspace, (size_t)ws);
        if (ce != cudaSuccess) {
            say(err, errlen, "workspace",
                std::string("cudaMalloc of ") + std::to_string(ws) + " bytes: " + cudaGetErrorString(ce));
            return nullptr;
        }
        d.workspace_bytes = ws;
    }
    d.graphs.emplace(key, g);
    return g;
}

template <class Opts> void set_mask(Opts &o, int mask) {
    if (mask == MASK_TOP_LEFT)
        o.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    if (mask == MASK_BOTTOM_RIGHT)
        o.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
}

int execute(DeviceState &d, fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, char *err, size_t errlen) {
    fe::error_t e = g.execute(d.handle, pack, d.workspace);
    if (!e.is_good()) {
        say(err, errlen, "execute", e.get_message());
        return 1;
    }
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        say(err, errlen, "execute", cudaGetErrorString(ce));
        return 1;
    }
    return 0;
}

bool view_ok(const cuk_bthd *t, int dt) {
    return t && t->p && t->dt == dt && ((uintptr_t)t->p & 15) == 0 && t->sb % 8 == 0 && t->st % 8 == 0 &&
           t->sh % 8 == 0;
}

} // namespace

extern "C" int cuk_attn_cudnn_built(void) { return 1; }

extern "C" int cuk_attn_cudnn_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *o,
                                 const cuk_bthd *dout, const cuk_bthd *dq, const cuk_bthd *dk, const cuk_bthd *dv,
                                 const cuk_attn *a) {
    const int dt = q->dt;
    if (dt != CUK_BF16 && dt != CUK_F16) return 0;
    /* cuDNN's Hopper engines take head dims that are multiples of 8 up to 256;
     * the graphs here are tested at 64 and 128 */
    if (q->D % 8 != 0 || q->D > 128) return 0;
    if (a->window > 0 || mask_of(*a, q->T, k->T) < 0) return 0;
    if (!view_ok(q, dt) || !view_ok(k, dt) || !view_ok(v, dt) || !view_ok(o, dt)) return 0;
    if (dout) {
        /* the backward writes all three gradients */
        if (!view_ok(dout, dt) || !view_ok(dq, dt) || !view_ok(dk, dt) || !view_ok(dv, dt)) return 0;
    }
    return 1;
}

extern "C" int cuk_attn_cudnn_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                  cuk_attn a, char *err, size_t errlen) {
    std::lock_guard<std::mutex> hold(g_lock);
    DeviceState *d = device_state(s, err, errlen);
    if (!d) return 1;
    GraphKey key{0, q.dt, mask_of(a, q.T, k.T), 0, lse != nullptr, a.scale, {q.B, q.H, k.H, q.T, k.T, q.D}};
    int declined = 0;
    for (const cuk_bthd *t : {&q, &k, &v, &o}) put_strides(key.dims, *t);
    auto g = graph_for(
        *d, key,
        [&](fe::graph::Graph &gr) {
            auto Q = gr.tensor(bhtd("Q", UID_Q, q)), K = gr.tensor(bhtd("K", UID_K, k)),
                 V = gr.tensor(bhtd("V", UID_V, v));
            auto opts = fe::graph::SDPA_attributes()
                            .set_name("attention_fwd")
                            .set_generate_stats(lse != nullptr)
                            .set_attn_scale(a.scale);
            set_mask(opts, key.mask);
            auto [O, L] = gr.sdpa(Q, K, V, opts);
            place(O->set_output(true), UID_O, o);
            if (lse) place_lse(L->set_output(true), q);
        },
        &declined, err, errlen);
    if (!g) return declined ? 2 : 1;
    std::unordered_map<int64_t, void *> pack = {{UID_Q, q.p}, {UID_K, k.p}, {UID_V, v.p}, {UID_O, o.p}};
    if (lse) pack[UID_LSE] = lse;
    return execute(*d, *g, pack, err, errlen);
}

extern "C" int cuk_attn_cudnn_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q,
                                  cuk_bthd k, cuk_bthd v, cuk_bthd o, const float *lse, cuk_attn a, char *err,
                                  size_t errlen) {
    std::lock_guard<std::mutex> hold(g_lock);
    DeviceState *d = device_state(s, err, errlen);
    if (!d) return 1;
    const bool det = a.deterministic != 0;
    GraphKey key{1, q.dt, mask_of(a, q.T, k.T), det, 1, a.scale, {q.B, q.H, k.H, q.T, k.T, q.D}};
    int declined = 0;
    for (const cuk_bthd *t : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) put_strides(key.dims, *t);
    auto g = graph_for(
        *d, key,
        [&](fe::graph::Graph &gr) {
            auto Q = gr.tensor(bhtd("Q", UID_Q, q)), K = gr.tensor(bhtd("K", UID_K, k)),
                 V = gr.tensor(bhtd("V", UID_V, v)), O = gr.tensor(bhtd("O", UID_O, o)),
                 dO = gr.tensor(bhtd("dO", UID_DO, dout));
            fe::graph::Tensor_attributes lse_in;
            lse_in.set_name("lse");
            place_lse(lse_in, q);
            auto L = gr.tensor(lse_in);
            auto opts = fe::graph::SDPA_backward_attributes()
                            .set_name("attention_bwd")
                            .set_attn_scale(a.scale)
                            .set_deterministic_algorithm(det);
            set_mask(opts, key.mask);
            auto [dQ, dK, dV] = gr.sdpa_backward(Q, K, V, O, dO, L, opts);
            place(dQ->set_output(true), UID_DQ, dq);
            place(dK->set_output(true), UID_DK, dk);
            place(dV->set_output(true), UID_DV, dv);
        },
        &declined, err, errlen);
    if (!g) return declined ? 2 : 1;
    std::unordered_map<int64_t, void *> pack = {{UID_Q, q.p},   {UID_K, k.p},     {UID_V, v.p},
                                                {UID_O, o.p},   {UID_DO, dout.p}, {UID_LSE, (void *)lse},
                                                {UID_DQ, dq.p}, {UID_DK, dk.p},   {UID_DV, dv.p}};
    return execute(*d, *g, pack, err, errlen);
}

#else /* !CAI_HAVE_CUDNN */

extern "C" int cuk_attn_cudnn_built(void) { return 0; }

extern "C" int cuk_attn_cudnn_ok(const cuk_bthd *, const cuk_bthd *, const cuk_bthd *, const cuk_bthd *,
                                 const cuk_bthd *, const cuk_bthd *, const cuk_bthd *, const cuk_bthd *,
                                 const cuk_attn *) {
    return 0;
}

static int not_built(char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "cuDNN attention: this build has no cuDNN (configure --with-cudnn)");
    return 1;
}

extern "C" int cuk_attn_cudnn_fwd(cudaStream_t, cuk_bthd, float *, cuk_bthd, cuk_bthd, cuk_bthd, cuk_attn, char *err,
                                  size_t errlen) {
    return not_built(err, errlen);
}

extern "C" int cuk_attn_cudnn_bwd(cudaStream_t, cuk_bthd, cuk_bthd, cuk_bthd, cuk_bthd, cuk_bthd, cuk_bthd, cuk_bthd,
                                  cuk_bthd, const float *, cuk_attn, char *err, size_t errlen) {
    return not_built(err, errlen);
}

#endif

/* The memory planner: per-rank bytes of a model under a ZeRO layout and
 * precision, computed before anything is allocated from the same registry
 * layout, buckets and window schedule the engine uses and the layer buffer
 * sizes the model carves, so the plan equals what the engine and model
 * then hold (tests/mpi/test_zero.c compares them). */
#include "cai_config.h"

#include <stdio.h>
#include <string.h>

#include "colossal/schedule.h"
#include "zero_internal.h"

/* The model's activation arena for one rank (model.c carves it) with
 * `slots` activation sets. */
static cai_status act_bytes(const cai_mem_plan_request *req, const cai_model_config *c, int n_local, int last,
                            int slots, size_t *full, size_t *recompute) {
    return cai_model_activation_bytes(req->dev, c, &req->view, req->batch, req->seq_len, req->seq_parallel, n_local,
                                      last, slots, full, recompute);
}

cai_status cai_mem_plan_compute(const cai_mem_plan_request *req, cai_mem_plan *out) {
    CAI_CHECK_ARG(req && out && req->dev, "cai_mem_plan_compute: NULL argument");
    CAI_CALL(cai_zero_config_check(&req->zero));
    CAI_CHECK_ARG(req->dp >= 1 && req->batch >= 1 && req->seq_len >= 1,
                  "memory plan: dp=%d, batch=%d, seq_len=%d must be >= 1", req->dp, req->batch, req->seq_len);
    CAI_CHECK_ARG(req->frozen_models >= 0, "memory plan: frozen_models=%d must be >= 0", req->frozen_models);
    memset(out, 0, sizeof *out);
    cai_model_config c;
    CAI_CALL(cai_model_config_resolve(&req->model, &c));
    cai_registry_t *reg = NULL;
    cai_registry_options ro = {.n_layers = c.n_layers};
    int n_units = 0, **units = NULL, *np = NULL;
    zl_layout L;
    memset(&L, 0, sizeof L);
    cai_status st = CAI_OK;
    CAI_CALL(cai_registry_init(&reg, &ro));
    CAI_CALL_GOTO(cai_model_register_params(reg, &c), st, done);
    CAI_CALL_GOTO(cai_registry_check_view(reg, &req->view), st, done);
    CAI_CALL_GOTO(zl_units_from_registry(reg, &req->view, &n_units, &units, &np), st, done);
    const cai_zero_config *z = &req->zero;
    size_t align = req->align_elems ? req->align_elems : 16;
    /* ep > 1: the experts' buckets shard over edp = dp / ep, as the engine's */
    const int edp = req->view.ep_size > 1 ? req->dp / req->view.ep_size : 0;
    CAI_CALL_GOTO(zl_build(&L, reg, &req->view, align, n_units, units, np, z->stage, req->dp, 0, edp, 0,
                           z->bucket_bytes ? z->bucket_bytes : (size_t)25 << 20, req->seq_parallel),
                  st, done);

    const size_t act = cai_dtype_size(c.act_dtype), pds = cai_dtype_size(c.param_dtype), f4 = sizeof(float);
    const int lowp = c.param_dtype != CAI_DTYPE_F32, work = c.act_dtype != c.param_dtype;
    const size_t n = L.n_flat, S = L.shard;
    out->stage = z->stage;
    out->offload = z->offload;
    out->dp = req->dp;
    out->n_flat = L.n_pad;
    if (z->stage == 0) {
        /* The model's own F32 masters and gradients plus its working copies. */
        out->params = (lowp ? n * pds : 0) + (work ? n * act : 0) + (z->offload ? n * f4 : 0);
        out->grads = n * f4;
        out->master = n * f4;
        out->staging = z->offload ? n * f4 : 0;
    } else {
        /* f32 without offload: the masters are the working weights' own chunks. */
        const int alias = !z->offload && c.param_dtype == CAI_DTYPE_F32 && c.act_dtype == CAI_DTYPE_F32;
        out->params = (z->stage == 3 ? S : L.n_pad) * act;
        out->grads = z->stage == 1 ? L.n_pad * f4 : S * f4; /* stage 1 reduces in place */
        out->master = alias ? 0 : S * f4;
        out->staging = (z->offload ? S * f4 + S * act : 0) +
                       (c.param_dtype != CAI_DTYPE_F32 && c.param_dtype != c.act_dtype ? S * pds : 0);
    }
    out->optim = 2 * S * f4;
    out->grads += L.axis_max * f4; /* the axis buckets' packing buffer */
    /* the bf16 reduction copy; stages 2/3 take bf16 windows, in the window peak */
    if (z->reduce_dtype == CAI_DTYPE_BF16 && L.stage < 2) out->grads += L.n_pad * sizeof(uint16_t);
    /* stages 0/1 keep the fp8 exchange blocks; stages 2/3 take them from the pool */
    if (z->reduce_fp8) out->grads += zl_fp8_fixed_bytes(&L);
    CAI_CALL_GOTO(zero_window_peak(&L, act, z, &out->windows), st, done);
    if (req->lora_flat) {
        if (z->stage != 0 || z->offload) {
            st = CAI_ERROR(CAI_ERR_UNSUPPORTED, "memory plan: LoRA runs ZeRO stage 0 without offload");
            goto done;
        }
        /* the frozen base keeps only the copy its layers read
         * (cai_model_keep_compute); the adapters are reduced in place */
        const size_t a = req->lora_flat;
        out->params = n * act + (c.act_dtype != CAI_DTYPE_F32 ? a * act : 0); /* + the adapters' compute copy */
        out->grads = a * f4;
        out->master = a * f4;
        out->optim = 2 * a * f4;
        out->staging = 0;
    }
    int first = 0, last = 0;
    int nl = n_units;
    for (int i = 0; i < L.n_params; i++) {
        if (L.offsets[i] == SIZE_MAX) continue;
        const cai_param_info *info = cai_registry_param(reg, i);
        first |= info->spec.pp_place == CAI_PP_FIRST;
        last |= info->spec.pp_place == CAI_PP_LAST;
    }
    nl -= first + last;
    /* A rank of v chunks keeps per activation set the layers of its largest chunk. */
    const int v = req->view.pp_chunks > 1 ? req->view.pp_chunks : 1;
    CAI_CALL_GOTO(act_bytes(req, &c, (nl + v - 1) / v, last, req->pp_inflight, &out->acts_full, &out->acts_recompute),
                  st, done);
    if (req->pp_split) {
        size_t kept = 0;
        CAI_CALL_GOTO(cai_model_split_backward_bytes(req->dev, &c, &req->view, req->batch, req->seq_len,
                                                     req->seq_parallel, (nl + v - 1) / v, req->pp_inflight, &kept),
                      st, done);
        out->acts_full += kept;
    }
    out->acts_full += req->seq_attn_bytes;
    out->acts_recompute += req->seq_attn_bytes;
    out->acts = c.activation_checkpointing ? out->acts_recompute : out->acts_full;
    if (req->view.pp_size > 1 && req->pp_microbatches > 0) {
        /* The executor's boundary buffers. Over MPI, per (microbatch, chunk),
         * an input and its gradient unless the chunk is the first stage, an
         * output and its gradient unless it is the last. Over node-shared
         * memory only the received ones exist: the window lays out an input
         * and an output gradient for every (microbatch, chunk) alike, each
         * 64-byte aligned (the peers copy straight into them). */
        const int S = req->view.pp_size * v;
        const size_t tokens = (size_t)req->batch * (size_t)req->seq_len /
                              (size_t)(req->seq_parallel && req->view.tp_size > 1 ? req->view.tp_size : 1);
        const size_t one = tokens * (size_t)c.d_model * act;
        /* the style only places the chunks here: zb-v's in a V, else round the ranks */
        const cai_pp_spec place = {.pp = req->view.pp_size,
                                   .virtual_stages = v,
                                   .style = req->view.pp_vshape ? CAI_PP_ZB_V : CAI_PP_INTERLEAVED};
        size_t per_mb = 0;
        for (int k = 0; k < v; k++) {
            const int stage = cai_pp_stage_of(&place, req->view.pp_rank, k);
            per_mb +=
                req->pp_shared ? 2 * ((one + 63) / 64 * 64) : (stage > 0 ? 2 : 0) * one + (stage < S - 1 ? 2 : 0) * one;
        }
        out->pipe = per_mb * (size_t)req->pp_microbatches;
        /* A tied embedding and head split over two ranks: the executor keeps
         * the peer's gradient and copies its own for the exchange (a rank
         * holding both, zb-v's first, exchanges nothing). */
        if (c.tie_embeddings && first != last) {
            const int tp = req->view.tp_size > 1 ? req->view.tp_size : 1;
            out->pipe += 2 * (size_t)((cai_model_config_padded_vocab(&c) + tp - 1) / tp) * (size_t)c.d_model * f4;
        }
    }
    CAI_CALL_GOTO(cai_model_fp8_bytes(req->dev, reg, &c, &req->view, req->batch, req->seq_len, req->seq_parallel,
                                      req->fp8, &out->fp8),
                  st, done);
    /* A frozen model is a stage-0 model without gradients that keeps only
     * the copy its layers read (cai_model_keep_compute), with the same
     * activation set. */
    out->frozen_weights = (size_t)req->frozen_models * n * act;
    out->frozen = out->frozen_weights + (size_t)req->frozen_models * out->acts;
    out->rollout = req->rollout_bytes;
    out->frozen_on_host = req->frozen_on_host && req->frozen_models > 0;
    if (req->frozen_models > 0) {
        /* Loaded before the trained model exists (colossal-rlhf), the last
         * frozen model holds its whole storage, F32 masters included, and
         * its activations, beside the kept copies and activations of those
         * before it unless they went to host memory. */
        const size_t whole = n * (f4 + (lowp ? pds : 0) + (work ? act : 0));
        const size_t kept = n * act + out->acts;
        out->frozen_load = whole + out->acts + (out->frozen_on_host ? 0 : (size_t)(req->frozen_models - 1) * kept);
    }
    out->host = z->offload ? out->master + out->optim + out->staging : 0;
    out->device = out->params + out->grads + out->master + out->optim + out->staging + out->windows + out->acts +
                  out->pipe + out->fp8 + out->frozen + out->rollout - out->host;
    if (out->frozen_on_host) {
        /* rollouts: the pool, not the frozen models (weights and activation
         * arenas); scoring: the frozen models, not the pool */
        const size_t turn = out->frozen > out->rollout ? out->frozen : out->rollout;
        out->device -= out->frozen + out->rollout - turn;
        out->host += out->frozen_weights;
    }
    if (out->frozen_load > out->device) out->device = out->frozen_load;
done:
    zl_free(&L);
    zl_units_free(n_units, units, np);
    cai_registry_free(reg);
    return st;
}

static double mib(size_t b) { return (double)b / 1048576.0; }

void cai_mem_plan_print(const cai_mem_plan *p, FILE *out) {
    const char *state = p->offload ? "host" : "device";
    fprintf(out, "memory plan per rank: ZeRO stage %d%s over dp %d, %zu flat elements\n", p->stage,
            p->offload ? " + CPU offload" : "", p->dp, p->n_flat);
    fprintf(out, "  parameters (working weights) %10.2f MiB  device%s\n", mib(p->params),
            p->stage == 3 ? " (shard)" : "");
    fprintf(out, "  gradients                    %10.2f MiB  device%s\n", mib(p->grads),
            p->stage >= 2 ? " (shard)" : "");
    if (p->windows) fprintf(out, "  gather/gradient windows      %10.2f MiB  device (peak)\n", mib(p->windows));
    if (p->stage >= 1 && !p->master)
        fprintf(out, "  master weights (f32)         %10.2f MiB  (the f32 working weights' own shard, no copy)\n", 0.0);
    else
        fprintf(out, "  master weights (f32)         %10.2f MiB  %s%s\n", mib(p->master), state,
                p->stage == 0 && p->offload ? " (the device copy is counted with the parameters)" : "");
    fprintf(out, "  optimizer state (AdamW m, v) %10.2f MiB  %s\n", mib(p->optim), state);
    if (p->staging) fprintf(out, "  staging / rounding buffers   %10.2f MiB  %s\n", mib(p->staging), state);
    fprintf(out, "  activations                  %10.2f MiB  device (%.2f MiB without recompute, %.2f MiB with)\n",
            mib(p->acts), mib(p->acts_full), mib(p->acts_recompute));
    if (p->pipe) fprintf(out, "  pipeline boundary buffers    %10.2f MiB  device\n", mib(p->pipe));
    if (p->fp8) fprintf(out, "  fp8 casts, weight codes      %10.2f MiB  device\n", mib(p->fp8));
    if (p->frozen && p->frozen_on_host) {
        fprintf(out, "  frozen models' weights       %10.2f MiB  host; device while they score\n",
                mib(p->frozen_weights));
        fprintf(out, "  frozen models' activations   %10.2f MiB  device while they score\n",
                mib(p->frozen - p->frozen_weights));
    } else if (p->frozen) fprintf(out, "  frozen models                %10.2f MiB  device\n", mib(p->frozen));
    if (p->frozen_load)
        fprintf(out, "  frozen models while loading  %10.2f MiB  device, before the trained model exists%s\n",
                mib(p->frozen_load), p->frozen_load == p->device ? " (the peak: the total)" : "");
    if (p->rollout)
        fprintf(out, "  rollout KV pool              %10.2f MiB  device%s\n", mib(p->rollout),
                p->frozen_on_host ? " during rollouts, in turn with the frozen weights" : "");
    fprintf(out, "  total                        %10.2f MiB  device + %.2f MiB host\n", mib(p->device), mib(p->host));
}

static int fits(const cai_device_t *dev, const cai_mem_plan *p, size_t dl, size_t hl) {
    if (dev->kind == CAI_DEVICE_HOST) return !dl || p->device + p->host <= dl;
    return (!dl || p->device <= dl) && (!hl || p->host <= hl);
}

/* "name (total)" of one variant into buf when it fits; returns chars added. */
static size_t try_variant(const cai_mem_plan_request *r, size_t dl, size_t hl, const char *name, char *buf, size_t cap,
                          int first) {
    cai_mem_plan p;
    if (cai_mem_plan_compute(r, &p) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    if (!fits(r->dev, &p, dl, hl)) return 0;
    int k = snprintf(buf, cap, "%s%s (%.1f MiB device + %.1f MiB host)", first ? "" : "; ", name, mib(p.device),
                     mib(p.host));
    return k < 0 ? 0 : (size_t)k < cap ? (size_t)k : cap - 1;
}

cai_status cai_mem_plan_check(const cai_mem_plan_request *req, const cai_mem_plan *p, size_t device_limit,
                              size_t host_limit) {
    CAI_CHECK_ARG(req && p && req->dev, "cai_mem_plan_check: NULL argument");
    if (fits(req->dev, p, device_limit, host_limit)) return CAI_OK;
    char sug[1024] = " ";
    size_t used = 1;
    char name[128];
    cai_mem_plan_request r;
    const int max_stage = req->zero_max_stage > 0 ? req->zero_max_stage : 3;
    for (int s = req->zero.stage + 1; s <= max_stage; s++) {
        r = *req;
        r.zero.stage = s;
        snprintf(name, sizeof name, "zero.stage=%d", s);
        used += try_variant(&r, device_limit, host_limit, name, sug + used, sizeof sug - used, used == 1);
    }
    if (!req->zero.offload) {
        r = *req;
        r.zero.offload = 1;
        used +=
            try_variant(&r, device_limit, host_limit, "zero.offload=true", sug + used, sizeof sug - used, used == 1);
        if (req->zero.stage < 3 && max_stage == 3) {
            r.zero.stage = 3;
            used += try_variant(&r, device_limit, host_limit, "zero.stage=3 with zero.offload=true", sug + used,
                                sizeof sug - used, used == 1);
        }
    }
    if (!req->model.activation_checkpointing) {
        r = *req;
        r.model.activation_checkpointing = 1;
        used += try_variant(&r, device_limit, host_limit, "model.activation_checkpointing=true", sug + used,
                            sizeof sug - used, used == 1);
    }
    for (int b = req->batch / 2; b >= 1; b /= 2) {
        r = *req;
        r.batch = b;
        snprintf(name, sizeof name, "train.micro_batch=%d (raise train.grad_accum to keep the batch)", b);
        size_t k = try_variant(&r, device_limit, host_limit, name, sug + used, sizeof sug - used, used == 1);
        used += k;
        if (k) break;
    }
    if (req->frozen_models > 0 && !req->frozen_on_host) {
        r = *req;
        r.frozen_on_host = 1;
        used += try_variant(&r, device_limit, host_limit, "placement.frozen=host", sug + used, sizeof sug - used,
                            used == 1);
    }
    for (size_t kv = req->rollout_bytes / 2; kv >= (size_t)1 << 20; kv /= 2) {
        r = *req;
        r.rollout_bytes = kv;
        snprintf(name, sizeof name, "rollout.kv_memory=%zuMiB", kv >> 20);
        size_t k = try_variant(&r, device_limit, host_limit, name, sug + used, sizeof sug - used, used == 1);
        used += k;
        if (k) break;
    }
    const int host = req->dev->kind == CAI_DEVICE_HOST;
    size_t need = host ? p->device + p->host : p->device;
    size_t lim = device_limit;
    if (!host && (!device_limit || p->device <= device_limit)) {
        need = p->host;
        lim = host_limit;
    }
    char load[96] = "";
    if (p->frozen_load && p->frozen_load == p->device)
        snprintf(load, sizeof load, "; the device peak is the frozen models' load, %.1f", mib(p->frozen_load));
    return CAI_ERROR(CAI_ERR_NOMEM,
                     "memory plan: %.1f MiB per rank (%.1f device + %.1f host: parameters %.1f, gradients %.1f, "
                     "windows %.1f, masters %.1f, optimizer %.1f, staging %.1f, activations %.1f, frozen models "
                     "%.1f, rollout KV pool %.1f%s) exceeds the %s limit of %.1f MiB; %s%s",
                     mib(need), mib(p->device), mib(p->host), mib(p->params), mib(p->grads), mib(p->windows),
                     mib(p->master), mib(p->optim), mib(p->staging), mib(p->acts), mib(p->frozen), mib(p->rollout),
                     load,
                     host                  ? "memory"
                     : lim == device_limit ? "device memory"
                                           : "host memory",
                     mib(lim),
                     used > 1 ? "it would fit with:"
                              : "no single change fits (more dp ranks, a smaller model or a "
                                "shorter sequence would)",
                     used > 1 ? sug : "");
}

/* Decode and prefill throughput of the inference engine on random
 * weights: B requests of P random prompt tokens each generate N tokens
 * (greedy, end of text ignored). Each batch size runs twice, with N and with 1 new token, and
 * the decode rate is B * (N - 1) / (t_N - t_1): the prefill cancels, as in
 * bench/hf_generate_bench.py, which times transformers the same way. One
 * JSON line per batch size on stdout, with a hash of the generated ids in
 * request order ("tokens_hash"), so that runs of one build under different
 * launch settings (--graphs, CAI_CUDA_PDL) can be compared token for token.
 * "prefill_tokens_per_s": prompt tokens over the time of the steps that
 * prefilled them (the faster of the two timed runs; each such step also
 * samples its finished prompts' first tokens).
 *
 *   infer_bench FAMILY LAYERS D HEADS KV_HEADS FFN VOCAB [--batches 1,16,64,256] [--prompt 128]
 *               [--new 256] [--device cuda|host] [--dtype bf16|f32] [--block 16] [--graphs 0|1]
 *               [--hbm 4.8]
 *
 * --hbm: the memory bandwidth in TB/s the roofline divides by (default the
 * H200's 4.8, as issue #20 defines it; an H100 SXM's is 3.35).
 */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/infer.h"
#include "colossal/model.h"

static double run_once(cai_weights_t *w, int batch, int prompt, int n_new, int block, int graphs, double *step_ms,
                       double *wait_ms, double *prefill_tps, uint64_t *hash, cai_status *st) {
    cai_engine_options o = cai_engine_options_default();
    o.block_size = block;
    o.max_batch = batch;
    o.max_tokens_per_step = batch * prompt > 8192 ? 8192 : batch * prompt;
    if (o.max_tokens_per_step < batch) o.max_tokens_per_step = batch;
    const int64_t per_seq = (prompt + n_new + block - 1) / block + 1;
    o.n_blocks = per_seq * batch + 8;
    o.graphs = graphs;
    cai_engine_t *e = NULL;
    *st = cai_engine_create(&e, w, NULL, &o);
    if (*st != CAI_OK) return 0;
    cai_sampling_params sp = cai_sampling_default();
    sp.max_new_tokens = n_new;
    sp.ignore_eos = 1;
    const int vocab = cai_weights_config(w)->vocab_size;
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    uint64_t x = 88172645463325252ull;
    for (int r = 0; r < batch && *st == CAI_OK; r++) {
        for (int i = 0; i < prompt; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids[i] = (int32_t)(x % (uint64_t)vocab);
        }
        *st = cai_engine_add(e, r, ids, prompt, &sp, 0);
    }
    free(ids);
    cai_device_t *dev = cai_weights_device(w);
    if (*st == CAI_OK) *st = cai_device_sync(dev);
    const double t0 = cai_time_now();
    double t_decode = 0, t_wait = 0, t_prefill = 0;
    int64_t decode_steps = 0, prefilled = 0;
    uint64_t *h = calloc((size_t)batch, sizeof *h);
    if (!h) *st = CAI_ERROR(CAI_ERR_NOMEM, "infer_bench: %d hashes", batch);
    while (*st == CAI_OK && cai_engine_pending(e) > 0) {
        cai_engine_stats s0;
        cai_engine_get_stats(e, &s0);
        const double a = cai_time_now();
        *st = cai_engine_step(e);
        cai_engine_stats s1;
        cai_engine_get_stats(e, &s1);
        if (s1.prefill_tokens != s0.prefill_tokens) {
            t_prefill += cai_time_now() - a;
            prefilled += s1.prefill_tokens - s0.prefill_tokens;
        } else {
            t_decode += cai_time_now() - a;
            t_wait += s1.device_wait_s - s0.device_wait_s;
            decode_steps++;
        }
        cai_engine_output out;
        while (cai_engine_take(e, &out)) {
            uint64_t v = 1469598103934665603ull; /* FNV-1a over the ids */
            for (int64_t i = 0; i < out.n_tokens; i++) v = (v ^ (uint32_t)out.tokens[i]) * 1099511628211ull;
            if (out.tag >= 0 && out.tag < batch) h[out.tag] = v;
            cai_engine_output_free(&out);
        }
    }
    *hash = 0;
    for (int r = 0; h && r < batch; r++) *hash = (*hash ^ h[r]) * 1099511628211ull;
    free(h);
    const double t = cai_time_now() - t0;
    *step_ms = decode_steps ? 1e3 * t_decode / (double)decode_steps : 0;
    *wait_ms = decode_steps ? 1e3 * t_wait / (double)decode_steps : 0;
    *prefill_tps = t_prefill > 0 ? (double)prefilled / t_prefill : 0;
    cai_engine_free(e);
    return t;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr,
                "usage: %s FAMILY LAYERS D HEADS KV_HEADS FFN VOCAB [--batches 1,16] [--prompt P] [--new N] "
                "[--device cuda|host] [--dtype bf16|f32] [--block B] [--graphs 0|1] [--hbm TB/s]\n",
                argv[0]);
        return 2;
    }
    cai_model_config c = cai_model_config_default(strcmp(argv[1], "llama") == 0 ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
    c.n_layers = atoi(argv[2]);
    c.d_model = atoi(argv[3]);
    c.n_heads = atoi(argv[4]);
    c.n_kv_heads = atoi(argv[5]);
    c.ffn_hidden = atoi(argv[6]);
    c.vocab_size = atoi(argv[7]);
    const char *batches = "1,16,64,256", *device = "cuda";
    int prompt = 128, n_new = 256, block = 16, graphs = 1;
    double hbm = 4.8e12;
    cai_dtype dt = CAI_DTYPE_BF16;
    for (int i = 8; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batches")) batches = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--new")) n_new = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--block")) block = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--graphs")) graphs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hbm")) hbm = 1e12 * atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype")) dt = strcmp(argv[i + 1], "f32") == 0 ? CAI_DTYPE_F32 : CAI_DTYPE_BF16;
    }
    if (!(hbm > 0)) {
        fprintf(stderr, "infer_bench: --hbm must be a bandwidth in TB/s above 0\n");
        return 2;
    }
    c.max_seq_len = prompt + n_new;
    c.tie_embeddings = c.family == CAI_MODEL_GPT2;
    cai_device_t *dev = NULL;
    cai_status st = cai_device_init(&dev, strcmp(device, "host") == 0 ? CAI_DEVICE_HOST : CAI_DEVICE_CUDA, 0, 0);
    if (st == CAI_OK && dev->kind == CAI_DEVICE_HOST) dt = CAI_DTYPE_F32;
    c.param_dtype = c.act_dtype = dt;
    cai_weights_t *w = NULL;
    const cai_rank_view v = cai_rank_view_single();
    if (st == CAI_OK) st = cai_weights_create(&w, dev, &c, &v, 0, 1);
    uint64_t n_params = 0;
    int64_t n_read = 0;
    if (st == CAI_OK) {
        const cai_registry_t *reg = cai_weights_registry(w);
        for (int i = 0; i < cai_registry_count(reg); i++) {
            const cai_param_info *p = cai_registry_param(reg, i);
            if (p->tie_primary == i) n_params += p->numel;
            if (p->tie_primary == i && !c.tie_embeddings && !strcmp(p->name, "wte.weight")) n_read -= p->numel;
        }
    }
    /* Bytes a decode step reads at least: every weight once (the tied head
     * once), except an untied input embedding, of which it reads a row per
     * sequence. */
    const double weight_bytes = ((double)n_params + (double)n_read) * (double)cai_dtype_size(dt);
    char list[256];
    snprintf(list, sizeof list, "%s", batches);
    for (char *save = NULL, *b = strtok_r(list, ",", &save); b && st == CAI_OK; b = strtok_r(NULL, ",", &save)) {
        const int B = atoi(b);
        double ms1 = 0, msN = 0, wait1 = 0, waitN = 0, pre1 = 0, preN = 0;
        uint64_t hash = 0;
        /* untimed: the first engine of a size pays one-time costs (library
         * initialisation, cuBLASLt's plans) that would land in t1 */
        run_once(w, B, prompt, 2, block, graphs, &ms1, &wait1, &pre1, &hash, &st);
        if (st != CAI_OK) break;
        const double t1 = run_once(w, B, prompt, 1, block, graphs, &ms1, &wait1, &pre1, &hash, &st);
        if (st != CAI_OK) break;
        const double tN = run_once(w, B, prompt, n_new, block, graphs, &msN, &waitN, &preN, &hash, &st);
        if (st != CAI_OK) break;
        const double tps = (double)B * (double)(n_new - 1) / (tN - t1);
        const double roof_ms = 1e3 * weight_bytes / hbm;
        printf(
            "{\"impl\":\"colossal\",\"family\":\"%s\",\"params\":%llu,\"batch\":%d,\"prompt\":%d,\"new\":%d,"
            "\"decode_tokens_per_s\":%.1f,\"decode_step_ms\":%.4f,\"roofline_step_ms\":%.4f,\"roofline_frac\":%.4f,"
            "\"decode_host_ms\":%.4f,\"prefill_tokens_per_s\":%.1f,\"graphs\":%d,\"hbm_tbps\":%.2f,"
            "\"tokens_hash\":\"%016llx\"}\n",
            argv[1], (unsigned long long)n_params, B, prompt, n_new, tps, msN, roof_ms, msN > 0 ? roof_ms / msN : 0.0,
            msN - waitN, pre1 > preN ? pre1 : preN, graphs, hbm / 1e12, (unsigned long long)hash);
        fflush(stdout);
    }
    if (st != CAI_OK) cai_error_print(stderr);
    cai_weights_free(w);
    cai_device_free(dev);
    return st == CAI_OK ? 0 : 1;
}

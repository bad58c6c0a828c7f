/* Driver for the PyTorch check of Hugging Face export/import
 * (tests/apps/ckpt_hf_torch.sh, tests/parity/hf_reference.py). Not a test
 * by itself: it writes colossal's logits next to an HF directory so an
 * independent HF-convention forward in torch can compare them.
 *
 *   test_hf_logits export gpt2|llama DIR OUT [dtype [max_shard_bytes]]
 *       a tiny model with perturbed weights -> DIR (HF); its logits for
 *       fixed tokens -> OUT (tokens I32 [B,T], logits F32 [B,T,vocab])
 *   test_hf_logits import DIR TOKENS OUT
 *       DIR (HF, written by anyone) -> a fresh colossal model built from its
 *       config.json; logits for TOKENS' "tokens" (a safetensors file, or "-"
 *       for fixed pseudo-random ones) -> OUT
 *
 * Not collective; one process. */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/base.h"
#include "colossal/ckpt.h"
#include "colossal/model.h"
#include "colossal/tensor.h"

enum { BATCH = 2, SEQ = 12 };

/* Logits [B,T,vocab] (padding columns dropped) and the tokens into OUT. */
static cai_status write_logits(cai_model_t *m, const int32_t *tokens, int B, int T, const char *out) {
    CAI_CALL(cai_model_forward(m, tokens, NULL, NULL));
    cai_tensor lt;
    CAI_CALL(cai_model_logits(m, &lt));
    const int64_t Vp = cai_model_padded_vocab(m), V = cai_model_config_of(m)->vocab_size;
    const size_t n = (size_t)B * (size_t)T;
    float *all = malloc(n * (size_t)Vp * sizeof *all), *real = malloc(n * (size_t)V * sizeof *real);
    cai_status st = CAI_OK;
    if (!all || !real) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "logits");
        goto done;
    }
    CAI_CALL_GOTO(cai_device_copy(cai_model_device(m), all, lt.data, n * (size_t)Vp * sizeof *all, CAI_COPY_D2H), st,
                  done);
    for (size_t i = 0; i < n; i++) memcpy(real + i * (size_t)V, all + i * (size_t)Vp, (size_t)V * sizeof *real);
    const cai_st_tensor t[2] = {
        {"tokens", CAI_DTYPE_I32, 2, {(uint64_t)B, (uint64_t)T}, tokens},
        {"logits", CAI_DTYPE_F32, 3, {(uint64_t)B, (uint64_t)T, (uint64_t)V}, real},
    };
    CAI_CALL_GOTO(cai_safetensors_write(out, t, 2, NULL, 0), st, done);
done:
    free(all);
    free(real);
    return st;
}

static cai_status run_export(const char *family, const char *dir, const char *out, const char *dtype,
                             const char *shard) {
    cai_model_family fam;
    CAI_CALL(cai_model_family_parse(family, &fam));
    cai_model_config c = cai_model_config_default(fam);
    c.n_layers = 2;
    c.d_model = 48;
    c.n_heads = 6;
    c.max_seq_len = 20;
    c.seed = 77;
    if (fam == CAI_MODEL_GPT2) {
        c.vocab_size = 61; /* padded to 128 */
        c.n_kv_heads = 6;
        c.ffn_hidden = 0;
        c.tie_embeddings = 1;
    } else {
        c.vocab_size = 45;
        c.n_kv_heads = 2; /* GQA: 3 query heads per kv head */
        c.ffn_hidden = 80;
        c.rope_theta = 10000.0f;
        c.norm_eps = 1e-6f;
        c.tie_embeddings = 0;
    }
    cai_device_t *dev = NULL;
    cai_model_t *m = NULL;
    CAI_CALL(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_model_options o = cai_model_options_default(&c);
    o.batch = BATCH;
    o.seq_len = SEQ;
    cai_status st = CAI_OK;
    float *buf = NULL;
    CAI_CALL_GOTO(cai_model_create(&m, dev, &c, &o), st, done);
    /* Every parameter off its init (norm weights 1 + 0.2 z, the rest 0.1 z),
     * so a misplaced bias or norm weight changes the logits. */
    const cai_registry_t *reg = cai_model_registry(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        if (p->tie_primary != i) continue;
        cai_tensor w;
        CAI_CALL_GOTO(cai_model_param(m, p->name, &w, NULL), st, done);
        free(buf);
        buf = malloc((size_t)p->numel * sizeof *buf);
        if (!buf) {
            st = CAI_ERROR(CAI_ERR_NOMEM, "perturb %s", p->name);
            goto done;
        }
        const int norm = p->ndim == 1 && !strstr(p->name, "bias");
        for (uint64_t k = 0; k < p->numel; k++) {
            float z = cai_rng_normal(5, cai_hash64(p->name), k);
            buf[k] = norm ? 1.0f + 0.2f * z : 0.1f * z;
        }
        CAI_CALL_GOTO(cai_device_copy(dev, w.data, buf, (size_t)p->numel * sizeof *buf, CAI_COPY_H2D), st, done);
    }
    CAI_CALL_GOTO(cai_model_params_updated(m), st, done);
    cai_hf_export_options eo = cai_hf_export_options_default();
    if (dtype) CAI_CALL_GOTO(cai_dtype_parse(dtype, &eo.dtype), st, done);
    if (shard) eo.max_shard_bytes = strtoull(shard, NULL, 10);
    cai_hf_export_stats es;
    CAI_CALL_GOTO(cai_hf_export_model(dir, m, &eo, &es), st, done);
    int32_t tokens[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++)
        tokens[i] = (int32_t)(cai_philox4x32(9, 1, (uint64_t)i).v[0] % (uint32_t)c.vocab_size);
    CAI_CALL_GOTO(write_logits(m, tokens, BATCH, SEQ, out), st, done);
    printf("test_hf_logits: %s exported to %s (%d file%s, %s), logits -> %s\n", family, dir, es.n_files,
           es.n_files == 1 ? "" : "s", cai_dtype_name(eo.dtype), out);
done:
    free(buf);
    cai_model_free(m);
    cai_device_free(dev);
    return st;
}

/* TOKENS' "tokens" (I32 [B,T]), or for "-" fixed pseudo-random ones. */
static cai_status load_tokens(const char *path, const cai_model_config *c, int32_t **tokens, int *B, int *T) {
    *B = BATCH;
    *T = SEQ < c->max_seq_len ? SEQ : c->max_seq_len;
    cai_safetensors_t *tf = NULL;
    const cai_st_entry *te = NULL;
    if (strcmp(path, "-") != 0) {
        CAI_CALL(cai_safetensors_open(&tf, path));
        cai_status st = cai_safetensors_get(tf, "tokens", &te);
        if (st == CAI_OK && (te->dtype != CAI_DTYPE_I32 || te->ndim != 2))
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s: tokens must be I32 [B,T]", path);
        if (st != CAI_OK) {
            cai_safetensors_close(tf);
            return st;
        }
        *B = (int)te->shape[0];
        *T = (int)te->shape[1];
    }
    const size_t n = (size_t)*B * (size_t)*T;
    *tokens = malloc(n * sizeof **tokens);
    if (!*tokens) {
        cai_safetensors_close(tf);
        return CAI_ERROR(CAI_ERR_NOMEM, "tokens");
    }
    for (size_t i = 0; i < n; i++)
        (*tokens)[i] = te ? ((const int32_t *)te->data)[i]
                          : (int32_t)(cai_philox4x32(9, 2, (uint64_t)i).v[0] % (uint32_t)c->vocab_size);
    cai_safetensors_close(tf);
    return CAI_OK;
}

static cai_status run_import(const char *dir, const char *tokens_path, const char *out) {
    cai_hf_t *h = NULL;
    cai_device_t *dev = NULL;
    cai_model_t *m = NULL;
    int32_t *tokens = NULL;
    int B = 0, T = 0;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_hf_open(&h, dir), st, done);
    cai_model_config c = *cai_hf_config(h);
    CAI_CALL_GOTO(load_tokens(tokens_path, &c, &tokens, &B, &T), st, done);
    CAI_CALL_GOTO(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1), st, done);
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    CAI_CALL_GOTO(cai_model_create(&m, dev, &c, &o), st, done);
    CAI_CALL_GOTO(cai_hf_import_model(h, m), st, done);
    CAI_CALL_GOTO(write_logits(m, tokens, B, T, out), st, done);
    printf("test_hf_logits: imported %s (%s, %d file%s), logits -> %s\n", dir, cai_model_family_name(c.family),
           cai_hf_file_count(h), cai_hf_file_count(h) == 1 ? "" : "s", out);
done:
    free(tokens);
    cai_model_free(m);
    cai_device_free(dev);
    cai_hf_close(h);
    return st;
}

int main(int argc, char **argv) {
    cai_status st;
    if (argc >= 5 && !strcmp(argv[1], "export")) {
        st = run_export(argv[2], argv[3], argv[4], argc > 5 ? argv[5] : NULL, argc > 6 ? argv[6] : NULL);
    } else if (argc == 5 && !strcmp(argv[1], "import")) {
        st = run_import(argv[2], argv[3], argv[4]);
    } else {
        fprintf(stderr,
                "usage: %s export gpt2|llama DIR OUT [dtype [max_shard_bytes]]\n"
                "       %s import DIR TOKENS OUT\n",
                argv[0], argv[0]);
        return 2;
    }
    if (st != CAI_OK) {
        cai_error_print(stderr);
        return 1;
    }
    return 0;
}

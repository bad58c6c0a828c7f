/* Driver for tests/gpu/peft_check.py (not a test by itself): colossal's
 * logits of a model with LoRA adapters, next to the Hugging Face and PEFT
 * directories that transformers and peft load.
 *
 *   test_lora_logits make gpt2|llama BASE ADAPTER MERGED LOGITS
 *       a tiny random base -> BASE (HF), adapters on every adaptable linear
 *       with non-zero B -> ADAPTER (PEFT) and MERGED (HF, W + scale B A);
 *       the adapter model's logits for fixed tokens -> LOGITS
 *   test_lora_logits logits BASE ADAPTER LOGITS
 *       BASE (HF) with ADAPTER (PEFT, e.g. a colossal-sft run's
 *       run.dir/lora/adapter) -> LOGITS
 *
 * LOGITS: "tokens" I32 [B,T], "logits" F32 [B,T,vocab]. One process. */
#include "cai_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/lora.h"

enum { BATCH = 2, SEQ = 12 };

static cai_status write_logits(cai_model_t *m, const char *out) {
    const cai_model_config *c = cai_model_config_of(m);
    int32_t tok[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++) tok[i] = (int32_t)((i * 13 + 5) % c->vocab_size);
    CAI_CALL(cai_model_forward(m, tok, NULL, NULL));
    cai_tensor lt;
    CAI_CALL(cai_model_logits(m, &lt));
    const int64_t Vp = cai_model_padded_vocab(m), V = c->vocab_size;
    const size_t n = (size_t)BATCH * SEQ;
    float *real = malloc(n * (size_t)V * sizeof *real);
    if (!real) return CAI_ERROR(CAI_ERR_NOMEM, "logits");
    for (size_t i = 0; i < n; i++)
        memcpy(real + i * (size_t)V, (const float *)lt.data + i * (size_t)Vp, (size_t)V * sizeof *real);
    const cai_st_tensor t[2] = {
        {"tokens", CAI_DTYPE_I32, 2, {BATCH, SEQ}, tok},
        {"logits", CAI_DTYPE_F32, 3, {BATCH, SEQ, (uint64_t)V}, real},
    };
    cai_status st = cai_safetensors_write(out, t, 2, NULL, 0);
    free(real);
    return st;
}

static cai_status frozen_model(cai_device_t *dev, const cai_model_config *c, cai_model_t **m) {
    cai_model_options o = cai_model_options_default(c);
    o.batch = BATCH;
    o.seq_len = SEQ;
    o.frozen = 1;
    return cai_model_create(m, dev, c, &o);
}

static cai_status run_make(cai_device_t *dev, const char *family, char **dirs) {
    cai_model_family fam;
    CAI_CALL(cai_model_family_parse(family, &fam));
    cai_model_config c = cai_model_config_default(fam);
    c.n_layers = 2;
    c.d_model = 48;
    c.n_heads = 6;
    c.max_seq_len = 20;
    c.seed = 77;
    c.vocab_size = fam == CAI_MODEL_GPT2 ? 61 : 45;
    c.n_kv_heads = fam == CAI_MODEL_GPT2 ? 6 : 2;
    c.ffn_hidden = fam == CAI_MODEL_GPT2 ? 0 : 80;
    c.tie_embeddings = fam == CAI_MODEL_GPT2;
    cai_model_t *m = NULL;
    CAI_CALL(frozen_model(dev, &c, &m));
    cai_hf_export_options eo = cai_hf_export_options_default();
    cai_status st = cai_hf_export_model(dirs[0], m, &eo, NULL);
    cai_lora_config lc = cai_lora_config_default();
    lc.rank = 4;
    lc.alpha = 8;
    lc.dropout = 0.05f;
    lc.targets = fam == CAI_MODEL_GPT2 ? "c_attn,c_proj,c_fc" : "all-linear";
    cai_lora_t *l = NULL;
    if (st == CAI_OK) st = cai_lora_create(&l, dev, &c, &lc);
    for (int i = 0; st == CAI_OK && i < cai_lora_count(l); i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        float *b = malloc((size_t)(a->rows * lc.rank) * sizeof *b);
        for (int64_t k = 0; k < a->rows * lc.rank; k++) b[k] = 0.2f * cai_rng_normal(5, (uint64_t)i, (uint64_t)k);
        st = cai_lora_write(l, i, NULL, b);
        free(b);
    }
    if (st == CAI_OK) st = cai_model_set_lora(m, l);
    if (st == CAI_OK) st = cai_lora_export_peft(dirs[1], l, dirs[0]);
    if (st == CAI_OK) st = cai_lora_export_merged(dirs[2], m, l, &eo, NULL);
    if (st == CAI_OK) st = write_logits(m, dirs[3]);
    cai_lora_free(l);
    cai_model_free(m);
    return st;
}

static cai_status run_logits(cai_device_t *dev, char **dirs) {
    cai_hf_t *h = NULL;
    CAI_CALL(cai_hf_open(&h, dirs[0]));
    cai_model_config c = *cai_hf_config(h);
    cai_model_t *m = NULL;
    cai_lora_t *l = NULL;
    cai_lora_config lc;
    char targets[1024];
    cai_status st = frozen_model(dev, &c, &m);
    if (st == CAI_OK) st = cai_hf_import_model(h, m);
    if (st == CAI_OK) st = cai_lora_peft_config(dirs[1], &lc, targets, sizeof targets);
    if (st == CAI_OK) st = cai_lora_create(&l, dev, &c, &lc);
    if (st == CAI_OK) st = cai_lora_import_peft(dirs[1], l);
    if (st == CAI_OK) st = cai_model_set_lora(m, l);
    if (st == CAI_OK) st = write_logits(m, dirs[2]);
    cai_lora_free(l);
    cai_model_free(m);
    cai_hf_close(h);
    return st;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    cai_device_t *dev = NULL;
    cai_status st = cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1);
    if (argc == 7 && !strcmp(argv[1], "make")) {
        if (st == CAI_OK) st = run_make(dev, argv[2], argv + 3);
    } else if (argc == 5 && !strcmp(argv[1], "logits")) {
        if (st == CAI_OK) st = run_logits(dev, argv + 2);
    } else {
        fprintf(stderr,
                "usage: test_lora_logits make gpt2|llama BASE ADAPTER MERGED LOGITS\n"
                "       test_lora_logits logits BASE ADAPTER LOGITS\n");
        cai_device_free(dev);
        MPI_Finalize();
        return 2;
    }
    if (st != CAI_OK) cai_error_print(stderr);
    cai_device_free(dev);
    MPI_Finalize();
    return st == CAI_OK ? 0 : 1;
}

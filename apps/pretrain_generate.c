/* colossal-pretrain samples: greedy continuations of a few prompts with the
 * trained weights, through the training model's own (B, T) buffers. Each
 * new token costs a whole forward over row 0 (no KV cache); causal attention makes the padding after the context
 * irrelevant to its logits. */
#include "cai_config.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pretrain.h"

/* argmax over the real vocabulary of logits[0, pos, :]; under tensor
 * parallelism each rank's best of its own columns, then the best of those
 * over tp (MAXLOC keeps the lowest id of equal values, as the loop does). */
static cai_status next_token(cai_model_t *m, cai_mesh_t *mesh, int64_t pos, float *row, void *raw, int32_t *out) {
    cai_tensor logits;
    CAI_CALL(cai_model_logits(m, &logits));
    const cai_model_config *mc = cai_model_config_of(m);
    int64_t vpad = logits.shape[2], off = 0;
    cai_model_vocab_shard(m, &off, NULL);
    size_t es = cai_dtype_size(logits.dtype);
    const char *src = (const char *)logits.data + (size_t)(pos * logits.stride[1]) * es;
    cai_device_t *dev = cai_model_device(m);
    CAI_CALL(
        cai_device_copy(dev, raw, src, (size_t)vpad * es, dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H));
    CAI_CALL(cai_device_sync(dev));
    CAI_CALL(cai_convert_host(row, CAI_DTYPE_F32, raw, logits.dtype, (size_t)vpad));
    struct {
        float value;
        int id;
    } best = {-INFINITY, INT_MAX}; /* MPI_FLOAT_INT's layout */
    for (int64_t v = 0; v < vpad && off + v < mc->vocab_size; v++)
        if (row[v] > best.value || best.id == INT_MAX) {
            best.value = row[v];
            best.id = (int)(off + v);
        }
    if (cai_mesh_size(mesh, CAI_AXIS_TP) > 1)
        MPI_Allreduce(MPI_IN_PLACE, &best, 1, MPI_FLOAT_INT, MPI_MAXLOC, cai_mesh_comm(mesh, CAI_AXIS_TP));
    *out = best.id;
    return CAI_OK;
}

static cai_status one_sample(cai_model_t *m, cai_mesh_t *mesh, pt_tokenizer *tok, const char *prompt, int n_new,
                             int32_t *window, float *row, void *raw, cai_token_buf *ids, cai_byte_buf *text,
                             int print) {
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    ids->len = 0;
    text->len = 0;
    CAI_CALL(pt_encode(tok, prompt, ids));
    if (ids->len == 0) CAI_CALL(cai_token_buf_append(ids, &tok->eod, 1));
    size_t n_prompt = ids->len;
    for (int i = 0; i < n_new; i++) {
        /* The last T tokens of the context sit at the start of row 0. */
        size_t ctx = ids->len < (size_t)T ? ids->len : (size_t)T;
        memset(window, 0, (size_t)B * (size_t)T * sizeof *window);
        memcpy(window, ids->ids + ids->len - ctx, ctx * sizeof *window);
        CAI_CALL(cai_model_forward(m, window, NULL, NULL));
        int32_t next = 0;
        CAI_CALL(next_token(m, mesh, (int64_t)ctx - 1, row, raw, &next));
        if (next == tok->eod) break;
        CAI_CALL(cai_token_buf_append(ids, &next, 1));
    }
    CAI_CALL(pt_decode(tok, ids->ids + n_prompt, ids->len - n_prompt, text));
    if (!print) return CAI_OK;
    printf("> %s", prompt);
    fwrite(text->data, 1, text->len, stdout);
    printf("\n");
    return CAI_OK;
}

cai_status pt_generate(cai_model_t *m, cai_mesh_t *mesh, pt_tokenizer *tok, const pt_config *cfg, int print) {
    if (!*cfg->prompts || cfg->gen_tokens <= 0) return CAI_OK;
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    int64_t vpad = cai_model_padded_vocab(m);
    int32_t *window = NULL;
    float *row = NULL;
    void *raw = NULL;
    char *prompts = strdup(cfg->prompts);
    cai_token_buf ids = {0};
    cai_byte_buf text = {0};
    cai_status st = prompts ? CAI_OK : CAI_ERROR(CAI_ERR_NOMEM, "prompts");
    if (st == CAI_OK)
        CAI_CALL_GOTO(cai_malloc((void **)&window, (size_t)B * (size_t)T * sizeof *window, "sample window"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&row, (size_t)vpad * sizeof *row, "logits row"), st, done);
    CAI_CALL_GOTO(cai_malloc(&raw, (size_t)vpad * sizeof(float), "logits row"), st, done);
    if (print) printf("samples (greedy, up to %d tokens each):\n", cfg->gen_tokens);
    char *save = NULL;
    for (char *p = strtok_r(prompts, "|", &save); p; p = strtok_r(NULL, "|", &save))
        CAI_CALL_GOTO(one_sample(m, mesh, tok, p, cfg->gen_tokens, window, row, raw, &ids, &text, print), st, done);
    fflush(stdout);
done:
    free(prompts);
    cai_free(window);
    cai_free(row);
    cai_free(raw);
    cai_token_buf_free(&ids);
    cai_byte_buf_free(&text);
    return st;
}

/* The inference engine against the training model's full forward: greedy
 * continuations token for token (GPT-2 and Llama with GQA), whatever the
 * batch size, block size, step budget (chunked prefill), pool size
 * (preemption and recompute), prefix sharing (copy on write) and KV dtype;
 * seeded sampling independent of the batch; prompt log-probabilities;
 * weights shared live with the model; suspend and resume; finish reasons;
 * bad requests. */
#include "cai_config.h"
#include "colossal/infer.h"
#include "colossal/model.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *dev;

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

static cai_model_config tiny(cai_model_family f) {
    cai_model_config c = cai_model_config_default(f);
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.max_seq_len = 48;
    if (f == CAI_MODEL_LLAMA) {
        c.vocab_size = 61;
        c.n_kv_heads = 2;
        c.ffn_hidden = 48;
        c.rope_theta = 500.0f;
        c.seed = 11;
    } else {
        c.vocab_size = 53;
        c.n_kv_heads = 0;
        c.ffn_hidden = 0;
        c.seed = 7;
    }
    /* Larger weights than the default init: sharper distributions, so
     * greedy continuations vary with the prompt. */
    c.init_std = 0.3f;
    return c;
}

/* Greedy continuation through the model's full forward (no cache): the
 * reference every engine result is held to. */
static void reference(cai_model_t *m, const int32_t *prompt, int n_prompt, int n_new, int32_t *out) {
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    const cai_model_config *c = cai_model_config_of(m);
    int32_t *win = calloc((size_t)T, sizeof *win), *ids = calloc((size_t)(n_prompt + n_new), sizeof *ids);
    memcpy(ids, prompt, (size_t)n_prompt * sizeof *ids);
    int n = n_prompt;
    for (int i = 0; i < n_new; i++) {
        memset(win, 0, (size_t)T * sizeof *win);
        memcpy(win, ids, (size_t)n * sizeof *win);
        OK(cai_model_forward(m, win, NULL, NULL));
        cai_tensor lg;
        OK(cai_model_logits(m, &lg));
        const float *row = (const float *)lg.data + (size_t)(n - 1) * (size_t)lg.stride[1];
        int best = 0;
        for (int v = 1; v < c->vocab_size; v++)
            if (row[v] > row[best]) best = v;
        ids[n++] = best;
        out[i] = best;
    }
    free(win);
    free(ids);
}

/* log p(prompt[p+1] | prompt[..p]) from the full forward. */
static void reference_scores(cai_model_t *m, const int32_t *prompt, int n, float *out) {
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    const cai_model_config *c = cai_model_config_of(m);
    int32_t *win = calloc((size_t)T, sizeof *win);
    memcpy(win, prompt, (size_t)n * sizeof *win);
    OK(cai_model_forward(m, win, NULL, NULL));
    cai_tensor lg;
    OK(cai_model_logits(m, &lg));
    for (int p = 0; p + 1 < n; p++) {
        const float *row = (const float *)lg.data + (size_t)p * (size_t)lg.stride[1];
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < c->vocab_size; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < c->vocab_size; v++) sum += exp(row[v] - mx);
        out[p] = (float)(row[prompt[p + 1]] - mx - log(sum));
    }
    free(win);
}

enum { N_PROMPTS = 7, N_NEW = 12, MAX_PROMPT = 30 };

/* Prompts with shared prefixes (prefix sharing), one of exactly 16 tokens
 * repeated (a fully cached prompt: copy on write of its last block), and
 * lengths from 1 to 30. */
static int make_prompts(int vocab, int32_t prompts[N_PROMPTS][MAX_PROMPT], int *lens) {
    static const int L[N_PROMPTS] = {5, 20, 16, 16, 1, 30, 17};
    static const int group[N_PROMPTS] = {0, 0, 1, 1, 2, 0, 1};
    for (int i = 0; i < N_PROMPTS; i++) {
        lens[i] = L[i];
        for (int j = 0; j < L[i]; j++) prompts[i][j] = (int32_t)((j * 7 + group[i] * 5 + 1) % vocab);
    }
    return N_PROMPTS;
}

typedef struct {
    int32_t tokens[N_PROMPTS][N_NEW];
    int n[N_PROMPTS];
    const char *finish[N_PROMPTS];
} results;

static void run_engine(cai_weights_t *w, const cai_engine_options *o, const cai_sampling_params *sp, results *res,
                       cai_engine_stats *stats) {
    cai_engine_t *e = NULL;
    OK(cai_engine_create(&e, w, NULL, o));
    int32_t prompts[N_PROMPTS][MAX_PROMPT];
    int lens[N_PROMPTS];
    make_prompts(cai_weights_config(w)->vocab_size, prompts, lens);
    /* Requests join between steps: three now, the rest after two steps. */
    for (int i = 0; i < 3; i++) OK(cai_engine_add(e, i, prompts[i], lens[i], sp, 0));
    for (int s = 0; s < 2; s++) OK(cai_engine_step(e));
    for (int i = 3; i < N_PROMPTS; i++) OK(cai_engine_add(e, i, prompts[i], lens[i], sp, 0));
    memset(res, 0, sizeof *res);
    int taken = 0;
    while (cai_engine_pending(e) > 0) {
        OK(cai_engine_step(e));
        cai_engine_output out;
        while (cai_engine_take(e, &out)) {
            ck_assert(out.tag >= 0 && out.tag < N_PROMPTS);
            ck_assert_int_eq(res->n[out.tag], 0);
            ck_assert_int_le(out.n_tokens, N_NEW);
            memcpy(res->tokens[out.tag], out.tokens, (size_t)out.n_tokens * sizeof *out.tokens);
            res->n[out.tag] = (int)out.n_tokens;
            res->finish[out.tag] = out.finish_reason;
            taken++;
            cai_engine_output_free(&out);
        }
    }
    ck_assert_int_eq(taken, N_PROMPTS);
    if (stats) cai_engine_get_stats(e, stats);
    cai_engine_stats st;
    cai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.blocks_free, st.blocks_total); /* every block came back */
    cai_engine_free(e);
}

static cai_sampling_params greedy(void) {
    cai_sampling_params p = cai_sampling_default();
    p.max_new_tokens = N_NEW;
    return p;
}

/* A tiny model of family f, the prompts and their full-forward greedy continuations. */
static cai_model_t *model_and_references(cai_model_family f, int32_t prompts[N_PROMPTS][MAX_PROMPT], int *lens,
                                         int32_t ref[N_PROMPTS][N_NEW]) {
    cai_model_config c = tiny(f);
    cai_model_t *m = NULL;
    cai_model_options mo = cai_model_options_default(&c);
    OK(cai_model_create(&m, dev, &c, &mo));
    make_prompts(c.vocab_size, prompts, lens);
    for (int i = 0; i < N_PROMPTS; i++) reference(m, prompts[i], lens[i], N_NEW, ref[i]);
    return m;
}

static void check_greedy_family(cai_model_family f) {
    int32_t prompts[N_PROMPTS][MAX_PROMPT], ref[N_PROMPTS][N_NEW];
    int lens[N_PROMPTS];
    cai_model_t *m = model_and_references(f, prompts, lens, ref);
    /* the continuations differ: a test that any constant output would pass proves nothing */
    ck_assert(memcmp(ref[0], ref[1], sizeof ref[0]) != 0 || memcmp(ref[1], ref[5], sizeof ref[0]) != 0);

    const struct {
        int bs, max_batch, max_tokens;
        int64_t n_blocks;
        int sharing;
        const char *what;
    } cases[] = {
        {16, 64, 2048, 0, 1, "block 16, batch 64"},
        {16, 1, 2048, 0, 1, "batch 1"},
        {256, 64, 2048, 0, 1, "block 256"},
        {1, 3, 5, 0, 0, "block 1, 5 tokens a step (chunked prefill), no sharing"},
        {4, 64, 2048, 12, 1, "a pool of 12 blocks of 4 (preemption)"},
        {16, 2, 9, 0, 1, "batch 2, 9 tokens a step"},
    };
    cai_sampling_params sp = greedy();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cai_engine_options o = cai_engine_options_default();
        o.block_size = cases[k].bs;
        o.max_batch = cases[k].max_batch;
        o.max_tokens_per_step = cases[k].max_tokens;
        o.n_blocks = cases[k].n_blocks;
        o.prefix_sharing = cases[k].sharing;
        results r;
        cai_engine_stats st;
        run_engine(cai_model_weights(m), &o, &sp, &r, &st);
        for (int i = 0; i < N_PROMPTS; i++) {
            ck_assert_msg(r.n[i] == N_NEW, "%s: request %d made %d tokens", cases[k].what, i, r.n[i]);
            ck_assert_str_eq(r.finish[i], "length");
            for (int j = 0; j < N_NEW; j++)
                ck_assert_msg(r.tokens[i][j] == ref[i][j], "%s %s: request %d token %d is %d, the full forward's %d",
                              cai_model_family_name(f), cases[k].what, i, j, r.tokens[i][j], ref[i][j]);
        }
        if (cases[k].n_blocks) ck_assert_msg(st.preemptions > 0, "%s: no preemption", cases[k].what);
        if (cases[k].max_tokens < 30) ck_assert(st.steps > N_NEW + 2);
        if (cases[k].bs == 16 && cases[k].sharing && cases[k].max_batch == 64) {
            ck_assert_msg(st.prefix_hit_tokens >= 16, "prefix hits %lld", (long long)st.prefix_hit_tokens);
            ck_assert_msg(st.cow_copies >= 1, "no copy on write");
        }
    }
    cai_model_free(m);
}

START_TEST(greedy_equals_full_forward_gpt2) { check_greedy_family(CAI_MODEL_GPT2); }
END_TEST

START_TEST(greedy_equals_full_forward_llama_gqa) { check_greedy_family(CAI_MODEL_LLAMA); }
END_TEST

/* Seeded sampling: a request's tokens depend on its seed, not on its batch. */
START_TEST(seeded_sampling_is_independent_of_the_batch) {
    cai_model_config c = tiny(CAI_MODEL_LLAMA);
    cai_weights_t *w = NULL;
    cai_rank_view v = cai_rank_view_single();
    OK(cai_weights_create(&w, dev, &c, &v, 0, 1));
    cai_sampling_params sp = greedy();
    sp.temperature = 1.3f;
    sp.top_k = 20;
    sp.top_p = 0.95f;
    sp.seed = 99;
    sp.has_seed = 1;
    results a, b, d;
    cai_engine_options o = cai_engine_options_default();
    run_engine(w, &o, &sp, &a, NULL);
    o.max_batch = 1;
    o.block_size = 256;
    run_engine(w, &o, &sp, &b, NULL);
    o.max_batch = 3;
    o.block_size = 4;
    o.n_blocks = 12;
    o.max_tokens_per_step = 7;
    run_engine(w, &o, &sp, &d, NULL);
    ck_assert(memcmp(a.tokens, b.tokens, sizeof a.tokens) == 0);
    ck_assert(memcmp(a.tokens, d.tokens, sizeof a.tokens) == 0);
    /* requests 2 and 3 share their prompt and seed: the same tokens; not greedy's */
    ck_assert(memcmp(a.tokens[2], a.tokens[3], sizeof a.tokens[2]) == 0);
    results g;
    cai_sampling_params gp = greedy();
    o = cai_engine_options_default();
    run_engine(w, &o, &gp, &g, NULL);
    ck_assert(memcmp(a.tokens, g.tokens, sizeof a.tokens) != 0);
    cai_weights_free(w);
}
END_TEST

START_TEST(prompt_scores_match_full_forward) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_model_t *m = NULL;
    cai_model_options mo = cai_model_options_default(&c);
    OK(cai_model_create(&m, dev, &c, &mo));
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 11 + 3) % c.vocab_size);
    float ref[39];
    reference_scores(m, prompt, 40, ref);
    cai_engine_options o = cai_engine_options_default();
    o.max_score_rows = 9; /* the prompt is read in chunks of at most 9 rows */
    cai_engine_t *e = NULL;
    OK(cai_engine_create(&e, cai_model_weights(m), NULL, &o));
    cai_sampling_params sp = greedy();
    OK(cai_engine_add(e, 5, prompt, 40, &sp, 1));
    OK(cai_engine_add(e, 6, prompt, 40, &sp, 0)); /* generation beside it */
    int got = 0;
    while (cai_engine_pending(e) > 0) {
        OK(cai_engine_step(e));
        cai_engine_output out;
        while (cai_engine_take(e, &out)) {
            if (out.tag == 5) {
                ck_assert_int_eq(out.n_tokens, 0);
                ck_assert_ptr_nonnull(out.prompt_logprobs);
                for (int p = 0; p < 39; p++)
                    ck_assert_msg(fabsf(out.prompt_logprobs[p] - ref[p]) < 1e-4f, "position %d: %g vs %g", p,
                                  (double)out.prompt_logprobs[p], (double)ref[p]);
                got++;
            }
            cai_engine_output_free(&out);
        }
    }
    ck_assert_int_eq(got, 1);
    cai_engine_free(e);
    cai_model_free(m);
}
END_TEST

/* Suspended between uses, the engine holds no device memory beside the
 * weights; resumed, it allocates the same bytes again at new addresses and
 * its greedy continuations still equal the full forward's, graphs and
 * cached prefixes rebuilt. It refuses to suspend with sequences running
 * and to step while suspended. */
START_TEST(suspend_gives_memory_back_and_resume_continues) {
    int32_t prompts[N_PROMPTS][MAX_PROMPT], ref[N_PROMPTS][N_NEW];
    int lens[N_PROMPTS];
    cai_model_t *m = model_and_references(CAI_MODEL_LLAMA, prompts, lens, ref);
    cai_engine_t *e = NULL;
    cai_engine_options o = cai_engine_options_default();
    o.kv_memory = (size_t)1 << 20;
    OK(cai_engine_create(&e, cai_model_weights(m), NULL, &o));
    const size_t held = cai_engine_device_bytes(e);
    ck_assert_uint_gt(held, (size_t)1 << 19);
    cai_sampling_params sp = greedy();
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N_PROMPTS; i++) OK(cai_engine_add(e, i, prompts[i], lens[i], &sp, 0));
        OK(cai_engine_step(e));
        ck_assert_int_eq(cai_engine_suspend(e), CAI_ERR_INVALID_ARG); /* sequences hold blocks */
        cai_error_clear();
        ck_assert(!cai_engine_suspended(e));
        int got = 0;
        while (cai_engine_pending(e) > 0) {
            OK(cai_engine_step(e));
            cai_engine_output out;
            while (cai_engine_take(e, &out)) {
                ck_assert_int_eq(out.n_tokens, N_NEW);
                for (int j = 0; j < N_NEW; j++)
                    ck_assert_msg(out.tokens[j] == ref[out.tag][j], "round %d request %lld token %d: %d, not %d", round,
                                  (long long)out.tag, j, out.tokens[j], ref[out.tag][j]);
                got++;
                cai_engine_output_free(&out);
            }
        }
        ck_assert_int_eq(got, N_PROMPTS);
        OK(cai_engine_suspend(e));
        OK(cai_engine_suspend(e)); /* already suspended: nothing to do */
        ck_assert(cai_engine_suspended(e));
        ck_assert_uint_eq(cai_engine_device_bytes(e), 0);
        OK(cai_engine_add(e, 0, prompts[0], lens[0], &sp, 0)); /* queued while suspended */
        ck_assert_int_eq(cai_engine_step(e), CAI_ERR_INVALID_ARG);
        cai_error_clear();
        uint64_t bytes0 = 0, bytes1 = 0;
        const uint64_t n0 = cai_device_alloc_count(dev, &bytes0);
        OK(cai_engine_resume(e));
        const uint64_t n1 = cai_device_alloc_count(dev, &bytes1);
        ck_assert_uint_eq(n1 - n0, 2); /* the pool and the step buffers, nothing else */
        ck_assert_uint_eq(bytes1 - bytes0, held);
        ck_assert_uint_eq(cai_engine_device_bytes(e), held);
        while (cai_engine_pending(e) > 0) OK(cai_engine_step(e));
        cai_engine_output out;
        ck_assert(cai_engine_take(e, &out));
        ck_assert_int_eq(out.tag, 0);
        ck_assert(memcmp(out.tokens, ref[0], sizeof ref[0]) == 0);
        cai_engine_output_free(&out);
    }
    cai_engine_stats st;
    cai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.suspends, 3);
    ck_assert_int_eq(st.blocks_free, st.blocks_total);
    cai_engine_free(e);
    cai_model_free(m);
}
END_TEST

/* The engine reads the model's weights live: an update is what it uses
 * next, once cai_engine_weights_changed has dropped the prompt blocks the
 * old weights computed (the prompt holds two full blocks of 16, which the
 * second round would otherwise share). */
START_TEST(weights_are_shared_live_with_the_model) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_model_t *m = NULL;
    cai_model_options mo = cai_model_options_default(&c);
    OK(cai_model_create(&m, dev, &c, &mo));
    cai_engine_t *e = NULL;
    OK(cai_engine_create(&e, cai_model_weights(m), NULL, NULL));
    enum { P = 34 };
    int32_t prompt[P], before[N_NEW], after[N_NEW];
    for (int i = 0; i < P; i++) prompt[i] = 1 + (i * 7) % 50;
    cai_sampling_params sp = greedy();
    for (int round = 0; round < 2; round++) {
        OK(cai_engine_add(e, round, prompt, P, &sp, 0));
        while (cai_engine_pending(e) > 0) OK(cai_engine_step(e));
        cai_engine_output out;
        ck_assert(cai_engine_take(e, &out));
        memcpy(round ? after : before, out.tokens, sizeof before);
        cai_engine_output_free(&out);
        if (round) break;
        /* A different head: scale the final norm's weight and shift a row. */
        cai_tensor wt;
        OK(cai_model_param(m, "wte.weight", &wt, NULL));
        float *d = wt.data;
        for (int64_t i = 0; i < cai_tensor_numel(&wt); i++) d[i] = -d[i] * 1.5f;
        OK(cai_model_params_updated(m));
        cai_engine_weights_changed(e);
    }
    cai_engine_stats st;
    cai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.prefix_hit_tokens, 0);
    int32_t ref[N_NEW];
    reference(m, prompt, P, N_NEW, ref);
    ck_assert(memcmp(after, ref, sizeof ref) == 0);
    ck_assert(memcmp(after, before, sizeof ref) != 0);
    cai_engine_free(e);
    cai_model_free(m);
}
END_TEST

START_TEST(finish_reasons_and_stops) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_model_t *m = NULL;
    cai_model_options mo = cai_model_options_default(&c);
    OK(cai_model_create(&m, dev, &c, &mo));
    int32_t prompt[5] = {3, 1, 4, 1, 5}, ref[N_NEW];
    reference(m, prompt, 5, N_NEW, ref);
    cai_engine_options o = cai_engine_options_default();
    o.eos_id = ref[3]; /* the fourth token is "end of text" */
    cai_engine_t *e = NULL;
    OK(cai_engine_create(&e, cai_model_weights(m), NULL, &o));
    cai_sampling_params sp = greedy();
    OK(cai_engine_add(e, 0, prompt, 5, &sp, 0));
    sp.ignore_eos = 1;
    sp.stop_ids[0] = ref[6];
    sp.n_stop_ids = 1;
    OK(cai_engine_add(e, 1, prompt, 5, &sp, 0));
    sp.n_stop_ids = 0;
    sp.max_new_tokens = 2;
    OK(cai_engine_add(e, 2, prompt, 5, &sp, 0));
    int64_t want_n[3] = {0, 0, 2};
    for (int i = 0; i < 4; i++) want_n[0] = want_n[0] ? want_n[0] : (ref[i] == o.eos_id ? i + 1 : 0);
    for (int i = 0; i < 7; i++) want_n[1] = want_n[1] ? want_n[1] : (ref[i] == ref[6] ? i + 1 : 0);
    int got = 0;
    while (cai_engine_pending(e) > 0) {
        OK(cai_engine_step(e));
        cai_engine_output out;
        while (cai_engine_take(e, &out)) {
            ck_assert_int_eq(out.n_tokens, want_n[out.tag]);
            ck_assert_str_eq(out.finish_reason, out.tag == 2 ? "length" : "stop");
            ck_assert(memcmp(out.tokens, ref, (size_t)out.n_tokens * sizeof *ref) == 0);
            got++;
            cai_engine_output_free(&out);
        }
    }
    ck_assert_int_eq(got, 3);
    /* Requests the model or the pool cannot hold are refused, naming sizes. */
    int32_t big[48] = {0};
    ck_assert_int_eq(cai_engine_add(e, 9, big, 48, &sp, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "48 tokens"));
    int32_t bad[2] = {1, 999};
    ck_assert_int_eq(cai_engine_add(e, 9, bad, 2, &sp, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "999"));
    cai_engine_free(e);
    /* A request that alone would outgrow the pool at its longest is refused up front. */
    o = cai_engine_options_default();
    o.block_size = 4;
    o.n_blocks = 3;
    OK(cai_engine_create(&e, cai_model_weights(m), NULL, &o));
    sp = greedy();
    ck_assert_int_eq(cai_engine_add(e, 1, prompt, 5, &sp, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "needs 5 KV blocks of 4; the pool has 3"));
    sp.max_new_tokens = 7;
    OK(cai_engine_add(e, 2, prompt, 5, &sp, 0));
    while (cai_engine_pending(e) > 0) OK(cai_engine_step(e));
    cai_engine_free(e);
    cai_model_free(m);
}
END_TEST

/* bf16 and f16 caches: the same machinery over rounded K and V; the
 * continuations stay those of the f32 cache for this model. */
START_TEST(low_precision_kv_cache) {
    cai_model_config c = tiny(CAI_MODEL_LLAMA);
    cai_weights_t *w = NULL;
    cai_rank_view v = cai_rank_view_single();
    OK(cai_weights_create(&w, dev, &c, &v, 0, 1));
    cai_sampling_params sp = greedy();
    results f32, low;
    cai_engine_options o = cai_engine_options_default();
    run_engine(w, &o, &sp, &f32, NULL);
    const cai_dtype kinds[2] = {CAI_DTYPE_BF16, CAI_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        o.kv_dtype = kinds[k];
        run_engine(w, &o, &sp, &low, NULL);
        int same = 0;
        for (int i = 0; i < N_PROMPTS; i++) same += memcmp(f32.tokens[i], low.tokens[i], sizeof low.tokens[i]) == 0;
        ck_assert_msg(same >= N_PROMPTS - 2, "%s cache: %d of %d continuations as with f32", cai_dtype_name(kinds[k]),
                      same, N_PROMPTS);
    }
    cai_weights_free(w);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, greedy_equals_full_forward_gpt2);
    tcase_add_test(tc, greedy_equals_full_forward_llama_gqa);
    tcase_add_test(tc, seeded_sampling_is_independent_of_the_batch);
    tcase_add_test(tc, prompt_scores_match_full_forward);
    tcase_add_test(tc, weights_are_shared_live_with_the_model);
    tcase_add_test(tc, suspend_gives_memory_back_and_resume_continues);
    tcase_add_test(tc, finish_reasons_and_stops);
    tcase_add_test(tc, low_precision_kv_cache);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, 2) != CAI_OK) {
        cai_error_print(stderr);
        MPI_Finalize();
        return 1;
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    MPI_Finalize();
    return failed ? 1 : 0;
}

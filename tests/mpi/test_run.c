/* The run module on several ranks: a signal any rank receives stops every
 * rank after the same step; checkpoint cadence, keep, train.stop_at and the
 * final checkpoint; resume from "", auto, latest, a file and a directory;
 * the metrics.jsonl records and config.yaml. The app is a fake whose step
 * only counts, over a real tiny model so checkpoints are real files. */
#include "cai_config.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colossal/run.h"
#include "test_mesh_util.h"

typedef struct {
    int64_t steps;
    cai_run_options run;
} tcfg;

static const cai_config_field k_fields[] = {
    {"train.steps", CAI_CFG_INT64, offsetof(tcfg, steps), "10", "steps", 1, 1e9, NULL, NULL},
    CAI_RUN_FIELDS(tcfg, run, "runs/test"),
};
static const cai_config_schema k_schema = {"test-run", "run module test", k_fields, CAI_CFG_NFIELDS(k_fields)};

/* ------------------------------------------------------------------ the fake app */

typedef struct {
    cai_model_t *model;
    int64_t ran[64];
    int n_ran;
    int64_t saved[64];
    int n_saved;
    int n_evals, n_loads;
    int64_t loaded_step, loaded_tokens;
    char loaded_path[4096];
    int64_t raise_at; /* raise `raise_sig` on the last rank in this step's hook */
    int raise_sig;
} fake;

static cai_status f_step(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *st) {
    fake *f = ctx;
    if (f->n_ran < 64) f->ran[f->n_ran++] = step;
    if (step == f->raise_at && g_world_rank == g_world_size - 1) raise(f->raise_sig);
    *st = (cai_step_stats){10.0f / (float)step, 1.0f, 1e-3f, 1.0f, 0};
    (void)run;
    return CAI_OK;
}

static cai_status f_eval(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran) {
    fake *f = ctx;
    f->n_evals++;
    *loss = 2.0;
    *ran = 1;
    (void)run;
    (void)step;
    return CAI_OK;
}

static cai_status f_save(void *ctx, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path, size_t cap,
                         cai_ckpt_stats *st) {
    fake *f = ctx;
    if (f->n_saved < 64) f->saved[f->n_saved++] = m->step;
    m->consumed_samples = m->step * 8;
    return cai_ckpt_save_step(cai_run_mesh(run), dir, keep, f->model, NULL, m, path, cap, st);
}

static cai_status f_load(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    fake *f = ctx;
    CAI_CALL(cai_ckpt_load(cai_run_mesh(run), path, f->model, NULL, m, st));
    f->n_loads++;
    f->loaded_step = m->step;
    f->loaded_tokens = m->tokens;
    snprintf(f->loaded_path, sizeof f->loaded_path, "%s", path);
    return CAI_OK;
}

/* ------------------------------------------------------------------ fixture */

static char g_dir[256];

/* Check's runner installs its own SIGINT/SIGTERM handlers (they kill the
 * process group): the run module's go back in for every test. */
static void setup(void) {
    cai_run_signals_install();
    cai_run_signal_reset();
    if (g_world_rank == 0) {
        snprintf(g_dir, sizeof g_dir, "/tmp/cai-test-run-XXXXXX");
        if (!mkdtemp(g_dir)) g_dir[0] = 0;
    }
    MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void teardown(void) {
    test_all_ranks_done();
    cai_run_signal_reset();
    if (g_world_rank == 0 && g_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    }
}

/* A config with run.dir = g_dir/<sub> and the given overrides ("key=value"). */
static void make_config(tcfg *c, const char *sub, const char *const *overrides) {
    CK_CAI(cai_config_defaults(&k_schema, c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    CK_CAI(cai_config_set(&k_schema, c, "run.dir", dir, "test"));
    CK_CAI(cai_config_set(&k_schema, c, "run.device", "cpu", "test"));
    CK_CAI(cai_config_set(&k_schema, c, "run.peak_tflops", "1", "test"));
    for (int i = 0; overrides && overrides[i]; i++) {
        char key[128];
        const char *eq = strchr(overrides[i], '=');
        ck_assert_ptr_nonnull(eq);
        snprintf(key, sizeof key, "%.*s", (int)(eq - overrides[i]), overrides[i]);
        CK_CAI(cai_config_set(&k_schema, c, key, eq + 1, "test"));
    }
}

static cai_run_config run_config(const tcfg *c) {
    cai_run_config rc = {.program = "test-run", .schema = &k_schema, .app_cfg = c, .opt = &c->run, .steps = c->steps};
    rc.mesh = test_mesh_config(1, g_world_size, 1, 1, 1, NULL);
    return rc;
}

static void make_model(cai_device_t *dev, cai_model_t **m) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_GPT2);
    c.vocab_size = 61;
    c.n_layers = 1;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_kv_heads = 2;
    c.max_seq_len = 8;
    cai_model_config r;
    CK_CAI(cai_model_config_resolve(&c, &r));
    cai_model_options mo = cai_model_options_default(&r);
    mo.batch = 2;
    mo.seq_len = 8;
    CK_CAI(cai_model_create(m, dev, &r, &mo));
}

/* The whole job as an app runs it: init, resume, start, train, finish. */
static cai_run_t *run_job(const tcfg *c, fake *f, int64_t eval_interval) {
    cai_run_config rc = run_config(c);
    cai_run_t *run = NULL;
    CK_CAI(cai_run_init(&run, &rc, MPI_COMM_WORLD));
    make_model(cai_run_device(run), &f->model);
    cai_run_hooks h = {f, f_step, f_eval, f_save, f_load};
    CK_CAI(cai_run_resume(run, &h));
    CK_CAI(cai_run_start(run, f->model, 8, 16));
    CK_CAI(cai_run_train(run, &h, eval_interval));
    CK_CAI(cai_run_finish(run));
    return run;
}

static void end_job(cai_run_t *run, fake *f, tcfg *c) {
    cai_model_free(f->model);
    f->model = NULL;
    cai_run_free(run);
    cai_config_free(&k_schema, c);
}

static void expect_steps(const int64_t *got, int n, const int64_t *want, int nw, const char *what) {
    ck_assert_msg(n == nw, "%s: %d entries, expected %d", what, n, nw);
    for (int i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s[%d] = %lld, expected %lld", what, i, (long long)got[i],
                      (long long)want[i]);
}

/* Lines of run_dir/metrics.jsonl holding `needle`. */
static int count_records(const tcfg *c, const char *needle) {
    char path[600], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run.dir);
    FILE *fp = fopen(path, "r");
    ck_assert_msg(fp != NULL, "no %s", path);
    int n = 0;
    while (fgets(line, sizeof line, fp)) {
        ck_assert_msg(line[0] == '{' && strstr(line, "}\n"), "not one JSON object a line: %s", line);
        if (strstr(line, needle)) n++;
    }
    fclose(fp);
    return n;
}

static int exists(const char *dir, const char *name) {
    char path[700];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

/* ------------------------------------------------------------------ tests */

START_TEST(signals_agree) {
    int sig = -1;
    cai_mesh_t *mesh = NULL;
    cai_mesh_config mc = test_mesh_config(1, g_world_size, 1, 1, 1, NULL);
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    CK_CAI(cai_run_stop_agree(mesh, &sig));
    ck_assert_int_eq(sig, 0);
    if (g_world_rank == g_world_size - 1) raise(SIGUSR1);
    CK_CAI(cai_run_stop_agree(mesh, &sig));
    ck_assert_int_eq(sig, SIGUSR1);
    ck_assert_int_eq(cai_run_signal_pending(), g_world_rank == g_world_size - 1 ? SIGUSR1 : 0);
    /* Different signals on different ranks: SIGTERM wins everywhere. */
    cai_run_signal_reset();
    if (g_world_rank == 0) raise(SIGINT);
    if (g_world_rank == g_world_size - 1) raise(SIGTERM);
    CK_CAI(cai_run_stop_agree(mesh, &sig));
    ck_assert_int_eq(sig, SIGTERM);
    /* A later, weaker signal does not replace a stronger one; a repeated
     * SIGTERM stays caught. */
    cai_run_signal_reset();
    cai_run_signals_install();
    raise(SIGUSR1);
    raise(SIGINT);
    raise(SIGTERM);
    raise(SIGTERM);
    ck_assert_int_eq(cai_run_signal_pending(), SIGTERM);
    cai_run_signal_reset();
    cai_run_signals_install(); /* SA_RESETHAND took the handlers off */
    CK_CAI(cai_run_stop_agree(mesh, &sig));
    ck_assert_int_eq(sig, 0);
    ck_assert_str_eq(cai_run_stop_name(SIGUSR1), "SIGUSR1");
    ck_assert_str_eq(cai_run_stop_name(CAI_RUN_STOP_AT), "train.stop_at");
    cai_mesh_free(mesh);
}
END_TEST

START_TEST(cadence_keep_and_records) {
    tcfg c;
    fake f = {0};
    make_config(&c, "a", (const char *const[]){"checkpoint.every=3", "checkpoint.keep=2", "log.interval=5", NULL});
    cai_run_t *run = run_job(&c, &f, 4);
    expect_steps(f.ran, f.n_ran, (const int64_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, "steps");
    /* every 3 steps, then the end */
    expect_steps(f.saved, f.n_saved, (const int64_t[]){3, 6, 9, 10}, 4, "checkpoints");
    ck_assert_int_eq(f.n_evals, 3); /* 4, 8 and the last step */
    ck_assert_int_eq(cai_run_stopped_by(run), 0);
    ck_assert_int_eq(cai_run_exit_code(run), 0);
    if (g_world_rank == 0) {
        const char *ck = cai_run_ckpt_dir(run);
        ck_assert(exists(ck, "step-00000010.h5") && exists(ck, "step-00000009.h5"));
        ck_assert(!exists(ck, "step-00000006.h5") && !exists(ck, "step-00000003.h5"));
        ck_assert(exists(c.run.dir, "config.yaml"));
        ck_assert_int_eq(count_records(&c, "\"kind\":\"start\""), 1);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"train\""), 10);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"progress\""), 2);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"eval\""), 3);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"checkpoint\""), 4);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"summary\""), 1);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"end\",\"status\":\"done\""), 1);
        ck_assert_int_eq(count_records(&c, "\"step\":10,\"loss\":1,"), 1);
    }
    char latest[4096];
    int found = 0;
    CK_CAI(cai_ckpt_latest(cai_run_ckpt_dir(run), latest, sizeof latest, &found));
    ck_assert(found && strstr(latest, "step-00000010.h5"));
    end_job(run, &f, &c);
}
END_TEST

START_TEST(stop_at_checkpoints_and_exits_3) {
    tcfg c;
    fake f = {0};
    make_config(&c, "b", (const char *const[]){"checkpoint.every=3", "train.stop_at=4", NULL});
    cai_run_t *run = run_job(&c, &f, 0);
    expect_steps(f.ran, f.n_ran, (const int64_t[]){1, 2, 3, 4}, 4, "steps");
    expect_steps(f.saved, f.n_saved, (const int64_t[]){3, 4}, 2, "checkpoints");
    ck_assert_int_eq(f.n_evals, 0);
    ck_assert_int_eq(cai_run_stopped_by(run), CAI_RUN_STOP_AT);
    ck_assert_int_eq(cai_run_exit_code(run), CAI_RUN_EXIT_CHECKPOINTED);
    if (g_world_rank == 0) ck_assert_int_eq(count_records(&c, "\"kind\":\"end\",\"status\":\"stopped\""), 1);
    end_job(run, &f, &c);
}
END_TEST

/* One rank's SIGUSR1 stops every rank after the same step, with a
 * checkpoint; SIGINT stops without one. */
START_TEST(signal_stops_every_rank) {
    tcfg c;
    fake f = {.raise_at = 2, .raise_sig = SIGUSR1};
    make_config(&c, "c", (const char *const[]){"checkpoint.every=5", NULL});
    cai_run_t *run = run_job(&c, &f, 0);
    expect_steps(f.ran, f.n_ran, (const int64_t[]){1, 2}, 2, "steps");
    expect_steps(f.saved, f.n_saved, (const int64_t[]){2}, 1, "checkpoints");
    ck_assert_int_eq(cai_run_stopped_by(run), SIGUSR1);
    ck_assert_int_eq(cai_run_exit_code(run), CAI_RUN_EXIT_CHECKPOINTED);
    end_job(run, &f, &c);
    cai_run_signal_reset();
    cai_run_signals_install();

    fake g = {.raise_at = 3, .raise_sig = SIGINT};
    make_config(&c, "d", (const char *const[]){"checkpoint.every=5", NULL});
    run = run_job(&c, &g, 0);
    expect_steps(g.ran, g.n_ran, (const int64_t[]){1, 2, 3}, 3, "steps");
    ck_assert_int_eq(g.n_saved, 0);
    ck_assert_int_eq(cai_run_stopped_by(run), SIGINT);
    ck_assert_int_eq(cai_run_exit_code(run), 0);
    end_job(run, &g, &c);
    cai_run_signals_install();
}
END_TEST

START_TEST(resume_modes) {
    tcfg c;
    /* latest with nothing there is an error; auto starts from step 1 */
    {
        fake f = {0};
        make_config(&c, "e", (const char *const[]){"checkpoint.every=3", "checkpoint.resume=latest", NULL});
        cai_run_config rc = run_config(&c);
        cai_run_t *run = NULL;
        CK_CAI(cai_run_init(&run, &rc, MPI_COMM_WORLD));
        cai_run_hooks h = {&f, f_step, NULL, f_save, f_load};
        cai_error_clear();
        ck_assert_int_eq(cai_run_resume(run, &h), CAI_ERR_CONFIG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "holds no checkpoint"));
        cai_error_clear();
        cai_run_free(run);
        cai_config_free(&k_schema, &c);
    }
    fake f = {0};
    make_config(&c, "e", (const char *const[]){"checkpoint.every=3", "checkpoint.resume=auto", "train.steps=6", NULL});
    cai_run_t *run = run_job(&c, &f, 0);
    ck_assert_int_eq(f.n_loads, 0);
    expect_steps(f.saved, f.n_saved, (const int64_t[]){3, 6}, 2, "checkpoints");
    end_job(run, &f, &c);

    /* latest: continues after step 6, tokens and the metrics record too */
    fake g = {0};
    make_config(&c, "e", (const char *const[]){"checkpoint.every=3", "checkpoint.resume=latest", NULL});
    run = run_job(&c, &g, 0);
    ck_assert_int_eq(g.n_loads, 1);
    ck_assert_int_eq(g.loaded_step, 6);
    ck_assert_int_eq(g.loaded_tokens, 6 * 16);
    ck_assert_ptr_nonnull(strstr(g.loaded_path, "step-00000006.h5"));
    ck_assert_int_eq(cai_run_first_step(run), 7);
    expect_steps(g.ran, g.n_ran, (const int64_t[]){7, 8, 9, 10}, 4, "steps");
    expect_steps(g.saved, g.n_saved, (const int64_t[]){9, 10}, 2, "checkpoints");
    if (g_world_rank == 0) {
        ck_assert_int_eq(count_records(&c, "\"kind\":\"train\""), 10);
        ck_assert_int_eq(count_records(&c, "\"kind\":\"start\""), 2);
    }
    char ckdir[4096];
    snprintf(ckdir, sizeof ckdir, "%s", cai_run_ckpt_dir(run));
    end_job(run, &g, &c);

    /* a directory: its latest (step 10, the end: nothing left to run) */
    fake h = {0};
    char opt[4200];
    snprintf(opt, sizeof opt, "checkpoint.resume=%s", ckdir);
    make_config(&c, "f", (const char *const[]){opt, NULL});
    run = run_job(&c, &h, 0);
    ck_assert_int_eq(h.loaded_step, 10);
    ck_assert_int_eq(h.n_ran, 0);
    end_job(run, &h, &c);

    /* latest naming a damaged file: the newest older one that loads */
    if (g_world_rank == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/step-00000010.h5", ckdir);
        ck_assert_int_eq(truncate(p, 100), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    fake d = {0};
    make_config(&c, "e", (const char *const[]){"checkpoint.resume=latest", "checkpoint.every=100", NULL});
    run = run_job(&c, &d, 0);
    ck_assert_int_eq(d.loaded_step, 9);
    expect_steps(d.ran, d.n_ran, (const int64_t[]){10}, 1, "steps");
    end_job(run, &d, &c);

    /* step files without `latest`: auto refuses to start over them */
    if (g_world_rank == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/latest", ckdir);
        ck_assert_int_eq(unlink(p), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    {
        fake e = {0};
        make_config(&c, "e", (const char *const[]){"checkpoint.every=3", "checkpoint.resume=auto", NULL});
        cai_run_config rc = run_config(&c);
        cai_run_t *r2 = NULL;
        CK_CAI(cai_run_init(&r2, &rc, MPI_COMM_WORLD));
        cai_run_hooks hk = {&e, f_step, NULL, f_save, f_load};
        cai_error_clear();
        ck_assert_int_eq(cai_run_resume(r2, &hk), CAI_ERR_CONFIG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "but no 'latest'"));
        ck_assert_int_eq(e.n_loads, 0);
        cai_error_clear();
        cai_run_free(r2);
        cai_config_free(&k_schema, &c);
    }

    /* a file: step 9 of the kept ones */
    fake k = {0};
    snprintf(opt, sizeof opt, "checkpoint.resume=%s/step-00000009.h5", ckdir);
    make_config(&c, "g", (const char *const[]){opt, "checkpoint.every=100", NULL});
    run = run_job(&c, &k, 0);
    ck_assert_int_eq(k.loaded_step, 9);
    expect_steps(k.ran, k.n_ran, (const int64_t[]){10}, 1, "steps");
    expect_steps(k.saved, k.n_saved, (const int64_t[]){10}, 1, "checkpoints");
    end_job(run, &k, &c);
}
END_TEST

START_TEST(memory_limit) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    size_t all = cai_run_mem_limit(CAI_CFG_BYTES_AUTO, dev, 1), half = cai_run_mem_limit(CAI_CFG_BYTES_AUTO, dev, 2);
    ck_assert(all > 0 && half > 0 && half <= all / 2 + 1 && half >= all / 2 - 1);
    ck_assert_uint_eq(cai_run_mem_limit(0, dev, 2), 0);
    ck_assert_uint_eq(cai_run_mem_limit(5 << 20, dev, 2), 5u << 20);
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    /* checkpoint cadence and resume need parallel HDF5 */
    if (!cai_ckpt_available()) {
        fprintf(stderr, "SKIP: this build has no parallel HDF5 (checkpoints)\n");
        return 77;
    }
    const TTest *const tests[] = {
        signals_agree, cadence_keep_and_records, stop_at_checkpoints_and_exits_3, signal_stops_every_rank, resume_modes,
        memory_limit};
    return test_mpi_main_fixture(argc, argv, "run", tests, TEST_COUNT(tests), setup, teardown);
}

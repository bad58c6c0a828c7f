/* Checkpoint directories: step-<N>.h5 files, the `latest` pointer, keeping
 * the newest K. Only rank 0 touches the directory; the others learn the
 * outcome through ck_agree. The ordering is what makes a crash harmless:
 * a checkpoint file appears (rename) only when complete, `latest` changes
 * (rename of a synced temporary) only after that, and old checkpoints are
 * deleted only after `latest` points past them. */
#include "cai_config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"

#define LATEST "latest"

cai_status ck_agree(MPI_Comm comm, cai_status st) {
    int rank = 0, mine, first = INT_MAX;
    MPI_Comm_rank(comm, &rank);
    mine = st != CAI_OK ? rank : INT_MAX;
    CAI_CALL_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == INT_MAX) return CAI_OK;
    char msg[1536];
    int code = (int)st;
    if (rank == first) snprintf(msg, sizeof msg, "%s", cai_error_message());
    CAI_CALL_MPI(MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, comm));
    CAI_CALL_MPI(MPI_Bcast(&code, 1, MPI_INT, first, comm));
    if (st != CAI_OK) return st; /* keeps this rank's own trace */
    return CAI_ERROR((cai_status)code, "%s (reported by rank %d)", msg, first);
}

static cai_status join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint path '%s/%s' is longer than %zu bytes", dir, name, cap - 1);
    return CAI_OK;
}

cai_status cai_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap) {
    CAI_CHECK_ARG(dir && *dir && out && cap, "cai_ckpt_step_path: NULL argument");
    CAI_CHECK_ARG(step >= 0, "cai_ckpt_step_path: step %lld is negative", (long long)step);
    char name[64];
    snprintf(name, sizeof name, "step-%08" PRId64 ".h5", step);
    return join(out, cap, dir, name);
}

/* "step-<digits>.h5" -> the step; -1 for anything else. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5, *q = p;
    int64_t v = 0;
    while (*q >= '0' && *q <= '9') {
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*q++ - '0');
    }
    if (q == p || strcmp(q, ".h5") != 0) return -1;
    return v;
}

cai_status cai_ckpt_latest(const char *dir, char *out, size_t cap, int *found) {
    CAI_CHECK_ARG(dir && *dir && out && cap && found, "cai_ckpt_latest: NULL argument");
    *found = 0;
    out[0] = '\0';
    char path[4096];
    CAI_CALL(join(path, sizeof path, dir, LATEST));
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return CAI_OK;
        return CAI_ERROR(CAI_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    }
    /* One line: the name of a file in the directory. Anything else (a second
     * line, control bytes, a path) is not what write_latest produces. */
    char line[512] = "";
    size_t n = fread(line, 1, sizeof line - 1, f);
    const int longer = fgetc(f) != EOF;
    fclose(f);
    line[n] = '\0';
    if (longer || strlen(line) != n)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "'%s' should hold one line naming a checkpoint file (\"step-00000100.h5\"), "
                         "but it %s",
                         path, longer ? "is longer than 511 bytes" : "holds a zero byte");
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = '\0';
    const char *nl = strpbrk(line, "\r\n");
    if (nl)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "'%s' should hold one line naming a checkpoint file (\"step-00000100.h5\"), "
                         "but it holds more than one (line 2: \"%.60s\")",
                         path, nl + strspn(nl, "\r\n"));
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "'%s' should name a checkpoint file (\"step-00000100.h5\"), but byte %zu "
                             "is the control character 0x%02x",
                             path, i, (unsigned)(unsigned char)line[i]);
    if (!n || strchr(line, '/') || strcmp(line, ".") == 0 || strcmp(line, "..") == 0)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "'%s' should name a checkpoint file in its directory (\"step-00000100.h5\"), "
                         "not \"%s\"",
                         path, line);
    CAI_CALL(join(out, cap, dir, line));
    struct stat sb;
    if (stat(out, &sb) != 0)
        return CAI_ERROR(CAI_ERR_IO, "'%s' names %s, which cannot be found: %s", path, out, strerror(errno));
    *found = 1;
    return CAI_OK;
}

cai_status cai_ckpt_resolve(const char *path, char *out, size_t cap) {
    CAI_CHECK_ARG(path && *path && out && cap, "cai_ckpt_resolve: NULL argument");
    struct stat sb;
    if (stat(path, &sb) != 0) return CAI_ERROR(CAI_ERR_IO, "no checkpoint at '%s': %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        int found = 0;
        CAI_CALL(cai_ckpt_latest(path, out, cap, &found));
        if (!found)
            return CAI_ERROR(CAI_ERR_IO, "checkpoint directory '%s' holds no complete checkpoint (no '%s' file)", path,
                             LATEST);
        return CAI_OK;
    }
    int n = snprintf(out, cap, "%s", path);
    if (n < 0 || (size_t)n >= cap) return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint path '%s' is too long", path);
    return CAI_OK;
}

static cai_status mkdir_p(const char *dir) {
    char p[4096];
    int n = snprintf(p, sizeof p, "%s", dir);
    if (n < 0 || (size_t)n >= sizeof p) return CAI_ERROR(CAI_ERR_INVALID_ARG, "directory '%s' is too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return CAI_ERROR(CAI_ERR_IO, "cannot create checkpoint directory '%s': %s", p, strerror(errno));
        *s = c;
        if (!c) break;
    }
    return CAI_OK;
}

cai_status ck_sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return CAI_ERROR(CAI_ERR_IO, "cannot open directory '%s' to sync it: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return CAI_ERROR(CAI_ERR_IO, "fsync of directory '%s' failed: %s", dir, strerror(errno));
    return CAI_OK;
}

/* `latest` <- name, through a synced temporary file and a rename. */
static cai_status write_latest(const char *dir, const char *name) {
    char tmp[4096], path[4096];
    CAI_CALL(join(tmp, sizeof tmp, dir, "." LATEST ".tmp"));
    CAI_CALL(join(path, sizeof path, dir, LATEST));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) return CAI_ERROR(CAI_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    char line[512];
    int n = snprintf(line, sizeof line, "%s\n", name);
    int ok = n > 0 && (size_t)n < sizeof line && write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    int err = errno;
    close(fd);
    if (!ok) {
        unlink(tmp);
        return CAI_ERROR(CAI_ERR_IO, "cannot write '%s': %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        return CAI_ERROR(CAI_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(err));
    }
    return ck_sync_dir(dir);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

cai_status cai_ckpt_list_steps(const char *dir, int64_t **steps_out, size_t *n_out) {
    CAI_CHECK_ARG(dir && steps_out && n_out, "cai_ckpt_list_steps: NULL argument");
    *steps_out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return CAI_OK;
        return CAI_ERROR(CAI_ERR_IO, "cannot list checkpoint directory '%s': %s", dir, strerror(errno));
    }
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int64_t s = step_of_name(ent->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            int64_t *g = realloc(steps, cap * sizeof *g);
            if (!g) {
                closedir(d);
                free(steps);
                return CAI_ERROR(CAI_ERR_NOMEM, "listing checkpoint directory '%s'", dir);
            }
            steps = g;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof *steps, cmp_desc);
    *steps_out = steps;
    *n_out = n;
    return CAI_OK;
}

/* Delete all but the newest `keep` step files (never `current`) and
 * temporary files left by interrupted saves. */
static cai_status prune(const char *dir, int keep, int64_t current) {
    DIR *d = opendir(dir);
    if (!d) return CAI_ERROR(CAI_ERR_IO, "cannot list checkpoint directory '%s': %s", dir, strerror(errno));
    char path[4096];
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        const char *nm = ent->d_name;
        size_t len = strlen(nm);
        if (nm[0] == '.' && len > 4 && strcmp(nm + len - 4, ".tmp") == 0 && step_of_name(nm + 1) < 0 &&
            strncmp(nm, ".step-", 6) == 0) {
            if (join(path, sizeof path, dir, nm) == CAI_OK && unlink(path) == 0)
                CAI_INFO("checkpoint: removed %s, left by an interrupted save", path);
        }
    }
    closedir(d);
    if (keep <= 0) return CAI_OK;
    int64_t *steps = NULL;
    size_t n = 0;
    cai_status st = cai_ckpt_list_steps(dir, &steps, &n);
    for (size_t i = (size_t)keep; st == CAI_OK && i < n; i++) {
        if (steps[i] == current) continue;
        st = cai_ckpt_step_path(dir, steps[i], path, sizeof path);
        if (st == CAI_OK && unlink(path) != 0 && errno != ENOENT)
            st = CAI_ERROR(CAI_ERR_IO, "cannot delete old checkpoint '%s': %s", path, strerror(errno));
    }
    free(steps);
    return st;
}

/* What a directory save writes into its step file. */
typedef struct {
    cai_model_t *model;
    cai_optim_t *optim;
    cai_zero_t *zero; /* non-NULL: cai_ckpt_save_zero */
    const cai_adamw_config *oc;
    cai_ckpt_write_fn write; /* non-NULL: the caller's own file (cai_ckpt_save_step_with) */
    void *write_ctx;
} step_state;

/* The step file, then `latest`, then pruning: the order that keeps a crash
 * harmless (see the top of this file). */
static cai_status save_step(cai_mesh_t *mesh, const char *dir, int keep, const step_state *s, int64_t step,
                            const cai_ckpt_meta *meta, char *path_out, size_t cap, cai_ckpt_stats *stats) {
    MPI_Comm comm = cai_mesh_comm(mesh, CAI_AXIS_WORLD);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    char path[4096];
    CAI_CALL(cai_ckpt_step_path(dir, step, path, sizeof path));
    CAI_CALL(ck_agree(comm, rank == 0 ? mkdir_p(dir) : CAI_OK));
    if (s->write) CAI_CALL(s->write(s->write_ctx, mesh, path, meta, stats));
    else if (s->zero) CAI_CALL(cai_ckpt_save_zero(mesh, path, s->zero, s->optim, s->oc, meta, stats));
    else CAI_CALL(cai_ckpt_save(mesh, path, s->model, s->optim, meta, stats));
    cai_status st = CAI_OK;
    if (rank == 0) {
        const char *name = strrchr(path, '/') + 1;
        st = write_latest(dir, name);
        if (st == CAI_OK) st = prune(dir, keep, step);
    }
    CAI_CALL(ck_agree(comm, st));
    if (path_out && cap) snprintf(path_out, cap, "%s", path);
    return CAI_OK;
}

cai_status cai_ckpt_save_step(cai_mesh_t *mesh, const char *dir, int keep, cai_model_t *model, cai_optim_t *optim,
                              const cai_ckpt_meta *meta, char *path_out, size_t cap, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && dir && *dir && model, "cai_ckpt_save_step: NULL argument");
    step_state s = {model, optim, NULL, NULL, NULL, NULL};
    int64_t step = meta ? meta->step : optim ? cai_optim_step_count(optim) : 0;
    return save_step(mesh, dir, keep, &s, step, meta, path_out, cap, stats);
}

cai_status cai_ckpt_save_step_zero(cai_mesh_t *mesh, const char *dir, int keep, cai_zero_t *zero, cai_optim_t *optim,
                                   const cai_adamw_config *oc, const cai_ckpt_meta *meta, char *path_out, size_t cap,
                                   cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && dir && *dir && zero, "cai_ckpt_save_step_zero: NULL argument");
    step_state s = {cai_zero_model(zero), optim, zero, oc, NULL, NULL};
    int64_t step = meta ? meta->step : optim ? cai_optim_step_count(optim) : cai_zero_step_count(zero);
    return save_step(mesh, dir, keep, &s, step, meta, path_out, cap, stats);
}

cai_status cai_ckpt_save_step_with(cai_mesh_t *mesh, const char *dir, int keep, int64_t step, cai_ckpt_write_fn write,
                                   void *ctx, const cai_ckpt_meta *meta, char *path_out, size_t cap,
                                   cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && dir && *dir && write, "cai_ckpt_save_step_with: NULL argument");
    step_state s = {NULL, NULL, NULL, NULL, write, ctx};
    return save_step(mesh, dir, keep, &s, step, meta, path_out, cap, stats);
}

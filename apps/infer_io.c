/* colossal-infer I/O: the tokenizer, the input lines, job-array shards and
 * the output file that world rank 0 writes for every replica. */
#include "cai_config.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infer.h"

enum { TAG_LINE = 7301, TAG_DONE = 7302 };

cai_status ij_encode(const ij_tokenizer *t, const char *text, size_t len, cai_token_buf *out) {
    if (t->bos >= 0) CAI_CALL(cai_token_buf_append(out, &t->bos, 1));
    /* Prompts may spell special tokens (chat templates do). */
    if (t->bpe) return cai_bpe_encode(t->bpe, text, len, out);
    return cai_byte_tokenize(NULL, text, len, out);
}

/* Text leaves special tokens (end of text, chat markers) unspelled, as
 * Hugging Face's skip_special_tokens does; token_ids keep them. */
cai_status ij_decode(void *ctx, const int32_t *ids, size_t n, cai_byte_buf *out) {
    const ij_tokenizer *t = ctx;
    if (!t->bpe) return cai_byte_detokenize(ids, n, out);
    for (size_t a = 0; a < n;) {
        size_t b = a;
        while (b < n && !cai_bpe_is_special(t->bpe, ids[b])) b++;
        if (b > a) CAI_CALL(cai_bpe_decode(t->bpe, ids + a, b - a, out));
        a = b + 1;
    }
    return CAI_OK;
}

cai_status ij_lines_read(const char *path, ij_lines *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "infer.input: cannot open %s: %s", path, strerror(errno));
    cai_status st = CAI_OK;
    if (fseek(f, 0, SEEK_END) != 0) st = CAI_ERROR(CAI_ERR_IO, "infer.input: cannot seek %s", path);
    long size = st == CAI_OK ? ftell(f) : -1;
    if (st == CAI_OK && size < 0) st = CAI_ERROR(CAI_ERR_IO, "infer.input: cannot size %s", path);
    if (st == CAI_OK) rewind(f);
    if (st == CAI_OK) st = cai_malloc((void **)&out->data, (size_t)size + 1, "infer input");
    if (st == CAI_OK && size > 0 && fread(out->data, 1, (size_t)size, f) != (size_t)size)
        st = CAI_ERROR(CAI_ERR_IO, "infer.input: short read of %s", path);
    fclose(f);
    if (st != CAI_OK) return st;
    out->data[size] = 0;
    out->size = (size_t)size;
    int64_t n = 0;
    for (long i = 0; i < size; i++) n += out->data[i] == '\n';
    if (size > 0 && out->data[size - 1] != '\n') n++;
    CAI_CALL(cai_calloc((void **)&out->start, (size_t)n + 1, sizeof *out->start, "infer input lines"));
    CAI_CALL(cai_calloc((void **)&out->len, (size_t)n + 1, sizeof *out->len, "infer input lines"));
    size_t s = 0;
    int64_t k = 0;
    for (size_t i = 0; i <= (size_t)size; i++)
        if (i == (size_t)size ? s < i : out->data[i] == '\n') {
            size_t e = i;
            if (e > s && out->data[e - 1] == '\r') e--;
            out->start[k] = s;
            out->len[k++] = e - s;
            s = i + 1;
        }
    out->n = k;
    return CAI_OK;
}

void ij_lines_free(ij_lines *l) {
    cai_free(l->data);
    cai_free(l->start);
    cai_free(l->len);
    memset(l, 0, sizeof *l);
}

static int parse_int(const char *s, int *v) {
    char *end = NULL;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || x < 0 || x > 1 << 24) return 0;
    *v = (int)x;
    return *end == 0 || *end == '/';
}

cai_status ij_shard(const char *spec, int *shard, int *n_shards) {
    *shard = 0;
    *n_shards = 1;
    if (spec && *spec) {
        const char *slash = strchr(spec, '/');
        if (!slash || !parse_int(spec, shard) || !parse_int(slash + 1, n_shards) || *n_shards < 1 ||
            *shard >= *n_shards)
            return CAI_ERROR(CAI_ERR_CONFIG, "infer.shard='%s': expected i/n with 0 <= i < n (e.g. 3/8)", spec);
        return CAI_OK;
    }
    const char *id = getenv("SLURM_ARRAY_TASK_ID"), *count = getenv("SLURM_ARRAY_TASK_COUNT");
    if (!id || !count) return CAI_OK;
    const char *mn = getenv("SLURM_ARRAY_TASK_MIN");
    int i = 0, n = 0, lo = 0;
    if (!parse_int(id, &i) || !parse_int(count, &n) || (mn && !parse_int(mn, &lo)) || n < 1 || i - lo < 0 ||
        i - lo >= n)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "SLURM_ARRAY_TASK_ID=%s, SLURM_ARRAY_TASK_COUNT=%s, SLURM_ARRAY_TASK_MIN=%s do not name a "
                         "task of a contiguous array (--array=0-N); set infer.shard=i/n",
                         id, count, mn ? mn : "(unset)");
    *shard = i - lo;
    *n_shards = n;
    return CAI_OK;
}

cai_status ij_shard_path(const char *output, int shard, int n_shards, char *out, size_t cap) {
    char tag[64];
    snprintf(tag, sizeof tag, "%d-of-%d", shard, n_shards);
    const char *ph = strstr(output, "{shard}");
    int n;
    if (ph) n = snprintf(out, cap, "%.*s%s%s", (int)(ph - output), output, tag, ph + 7);
    else if (n_shards == 1) n = snprintf(out, cap, "%s", output);
    else {
        const char *base = strrchr(output, '/'), *dot = strrchr(output, '.');
        if (!dot || (base && dot < base)) n = snprintf(out, cap, "%s.%s", output, tag);
        else n = snprintf(out, cap, "%.*s.%s%s", (int)(dot - output), output, tag, dot);
    }
    if (n < 0 || (size_t)n >= cap) return CAI_ERROR(CAI_ERR_CONFIG, "infer.output: path too long (%s)", output);
    return CAI_OK;
}

static cai_status write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CAI_ERROR(CAI_ERR_IO, "infer.output: write failed: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return CAI_OK;
}

cai_status ij_output_open(ij_output *o, const char *path, MPI_Comm world, int is_writer) {
    memset(o, 0, sizeof *o);
    o->world = world;
    o->fd = -1;
    o->is_writer = is_writer;
    MPI_Comm_rank(world, &o->rank);
    int w = is_writer;
    MPI_Allreduce(&w, &o->writer_count, 1, MPI_INT, MPI_SUM, world);
    if (o->rank != 0) return CAI_OK;
    o->fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (o->fd < 0) return CAI_ERROR(CAI_ERR_IO, "infer.output: cannot open %s: %s", path, strerror(errno));
    return CAI_OK;
}

cai_status ij_output_emit(ij_output *o, const char *line, size_t len, int64_t tokens) {
    if (!o->is_writer) return CAI_OK;
    if (o->rank == 0) {
        CAI_CALL(write_all(o->fd, line, len));
        o->done++;
        o->tokens += tokens;
        return CAI_OK;
    }
    if (len > (size_t)INT32_MAX - 16) return CAI_ERROR(CAI_ERR_INVALID_ARG, "infer: a result line of %zu bytes", len);
    /* The token count rides in front of the line. */
    char *msg = malloc(len + sizeof(int64_t));
    if (!msg) return CAI_ERROR(CAI_ERR_NOMEM, "infer: result line of %zu bytes", len);
    memcpy(msg, &tokens, sizeof tokens);
    memcpy(msg + sizeof tokens, line, len);
    int rc = MPI_Send(msg, (int)(len + sizeof tokens), MPI_CHAR, 0, TAG_LINE, o->world);
    free(msg);
    if (rc != MPI_SUCCESS) return CAI_ERROR(CAI_ERR_MPI, "infer: sending a result line to rank 0 failed");
    return CAI_OK;
}

static cai_status receive(ij_output *o, MPI_Status *ps) {
    int count = 0;
    MPI_Get_count(ps, MPI_CHAR, &count);
    char *msg = malloc((size_t)count + 1);
    if (!msg) return CAI_ERROR(CAI_ERR_NOMEM, "infer: result line of %d bytes", count);
    MPI_Recv(msg, count, MPI_CHAR, ps->MPI_SOURCE, ps->MPI_TAG, o->world, MPI_STATUS_IGNORE);
    cai_status st = CAI_OK;
    if (ps->MPI_TAG == TAG_DONE) {
        o->finished_writers++;
    } else if (count >= (int)sizeof(int64_t)) {
        int64_t tokens = 0;
        memcpy(&tokens, msg, sizeof tokens);
        st = write_all(o->fd, msg + sizeof tokens, (size_t)count - sizeof tokens);
        o->done++;
        o->tokens += tokens;
    }
    free(msg);
    return st;
}

cai_status ij_output_poll(ij_output *o) {
    if (o->rank != 0) return CAI_OK;
    for (;;) {
        int flag = 0;
        MPI_Status ps;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, o->world, &flag, &ps);
        if (!flag || (ps.MPI_TAG != TAG_LINE && ps.MPI_TAG != TAG_DONE)) return CAI_OK;
        CAI_CALL(receive(o, &ps));
    }
}

cai_status ij_output_close(ij_output *o) {
    cai_status st = CAI_OK;
    if (o->rank != 0 && o->is_writer) {
        char c = 0;
        if (MPI_Send(&c, 1, MPI_CHAR, 0, TAG_DONE, o->world) != MPI_SUCCESS)
            st = CAI_ERROR(CAI_ERR_MPI, "infer: telling rank 0 this replica is done failed");
    }
    if (o->rank == 0) {
        const int others = o->writer_count - (o->is_writer ? 1 : 0);
        while (st == CAI_OK && o->finished_writers < others) {
            MPI_Status ps;
            MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, o->world, &ps);
            st = receive(o, &ps);
        }
        if (o->fd >= 0 && fsync(o->fd) != 0 && errno != EINVAL && st == CAI_OK)
            st = CAI_ERROR(CAI_ERR_IO, "infer.output: fsync failed: %s", strerror(errno));
        if (o->fd >= 0) close(o->fd);
        o->fd = -1;
    }
    return st;
}

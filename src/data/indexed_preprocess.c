/* Text/JSONL -> Megatron indexed dataset, in parallel over MPI ranks.
 *
 * The inputs are one virtual byte stream (the files back to back). Each
 * rank takes an equal byte range whose ends are moved forward to the next
 * document start; a document start is a property of the file alone, so all
 * ranks agree on the cut points without talking. A rank tokenizes the
 * documents that start in its range into a partial dataset; the partials
 * are then written side by side into the final files with MPI-IO at
 * offsets from a prefix sum. Because a document never depends on the cut,
 * the output bytes do not depend on the number of ranks. */
#include "cai_config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colossal/data.h"
#include "preprocess_internal.h"

typedef struct {
    const char *path;
    const unsigned char *data;
    size_t size;
} in_file;

typedef struct {
    in_file *files;
    int n;
    int64_t *start; /* global offset of each file; start[n] = total */
} in_stream;

static void stream_close(in_stream *s) {
    for (int i = 0; i < s->n; i++)
        if (s->files[i].data) munmap((void *)s->files[i].data, s->files[i].size);
    free(s->files);
    free(s->start);
    memset(s, 0, sizeof *s);
}

static cai_status stream_open(in_stream *s, const char *const *paths, int n) {
    memset(s, 0, sizeof *s);
    s->files = calloc((size_t)n, sizeof *s->files);
    s->start = calloc((size_t)n + 1, sizeof *s->start);
    if (!s->files || !s->start) {
        stream_close(s);
        return CAI_ERROR(CAI_ERR_NOMEM, "preprocess: %d input descriptors", n);
    }
    s->n = n;
    for (int i = 0; i < n; i++) {
        in_file *f = &s->files[i];
        f->path = paths[i];
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        struct stat st;
        const char *why = NULL;
        if (fd < 0 || fstat(fd, &st) != 0) why = strerror(errno);
        else if (!S_ISREG(st.st_mode)) why = "not a regular file";
        if (why) {
            if (fd >= 0) close(fd);
            stream_close(s);
            return CAI_ERROR(CAI_ERR_IO, "%s: cannot read input: %s", paths[i], why);
        }
        f->size = (size_t)st.st_size;
        if (f->size) {
            void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                int e = errno;
                close(fd);
                stream_close(s);
                return CAI_ERROR(CAI_ERR_IO, "%s: mmap of %zu bytes failed: %s", paths[i], f->size, strerror(e));
            }
            f->data = p;
            madvise(p, f->size, MADV_SEQUENTIAL);
        }
        close(fd);
        s->start[i + 1] = s->start[i] + (int64_t)f->size;
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ documents */

static int is_blank(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

static size_t line_end(const in_file *f, size_t q) {
    const unsigned char *nl = memchr(f->data + q, '\n', f->size - q);
    return nl ? (size_t)(nl - f->data) : f->size;
}

/* First document start at or after local offset l (l > 0), or f->size.
 * JSONL: any line start. Text: a non-blank line that opens the file or
 * follows a blank line. */
static size_t align_local(const in_file *f, size_t l, cai_preprocess_format fmt) {
    size_t q = f->data[l - 1] == '\n' ? l : line_end(f, l) + 1;
    if (q >= f->size) return f->size;
    if (fmt == CAI_PREPROCESS_JSONL) return q;
    size_t p = q - 1; /* the '\n' ending the previous line */
    while (p > 0 && f->data[p - 1] != '\n') p--;
    int prev_blank = is_blank(f->data + p, q - 1 - p);
    while (q < f->size) {
        size_t e = line_end(f, q);
        int blank = is_blank(f->data + q, e - q);
        if (!blank && prev_blank) return q;
        prev_blank = blank;
        q = e + 1;
    }
    return f->size;
}

/* Global offset -> first document start at or after it. */
static int64_t align_global(const in_stream *s, int64_t o, cai_preprocess_format fmt) {
    for (int i = 0; i < s->n; i++) {
        if (o >= s->start[i + 1]) continue;
        if (o <= s->start[i]) return s->start[i];
        return s->start[i] + (int64_t)align_local(&s->files[i], (size_t)(o - s->start[i]), fmt);
    }
    return s->start[s->n];
}

/* The document starting at or after *pos (skipping blank lines) if it
 * starts before `end`: its text in [*text, *text + *len), and *pos moves past
 * it. Returns 0 when no document starts in [*pos, end). */
typedef struct {
    const in_file *f;
    cai_preprocess_format fmt;
    const char *key; /* NULL: a JSONL document is its whole line, unparsed */
    json_t *json;    /* keeps the JSONL text alive until the next call */
    /* The line number at byte line_pos of f, advanced as documents are read
     * so that a callback can name the line without a rescan of the file. */
    size_t line_pos;
    int64_t line;
} doc_reader;

static void reader_file(doc_reader *r, const in_file *f) {
    r->f = f;
    r->line_pos = 0;
    r->line = 1;
}

static int64_t reader_line(doc_reader *r, size_t q) {
    const in_file *f = r->f;
    if (q < r->line_pos) {
        r->line_pos = 0;
        r->line = 1;
    }
    for (const unsigned char *p = f->data + r->line_pos, *end = f->data + q;
         (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++)
        r->line++;
    r->line_pos = q;
    return r->line;
}

static cai_status next_document(doc_reader *r, size_t *pos, size_t end, const char **text, size_t *len, int64_t *line,
                                int *found) {
    const in_file *f = r->f;
    *found = 0;
    size_t q = *pos;
    for (;;) { /* skip blank lines */
        if (q >= end || q >= f->size) {
            *pos = q;
            return CAI_OK;
        }
        size_t e = line_end(f, q);
        if (!is_blank(f->data + q, e - q)) break;
        q = e + 1;
    }
    if (q >= end) {
        *pos = q;
        return CAI_OK;
    }
    size_t e = line_end(f, q);
    *line = reader_line(r, q);
    if (r->fmt == CAI_PREPROCESS_TEXT) {
        size_t last = e; /* end of the last non-blank line's content */
        size_t next = e + 1;
        while (next < f->size) {
            size_t e2 = line_end(f, next);
            if (is_blank(f->data + next, e2 - next)) break;
            last = e2;
            next = e2 + 1;
        }
        if (last > q && f->data[last - 1] == '\r') last--;
        *text = (const char *)f->data + q;
        *len = last - q;
        *pos = next;
        *found = 1;
        return CAI_OK;
    }
    size_t n = e - q;
    if (n && f->data[q + n - 1] == '\r') n--;
    if (!r->key) {
        *text = (const char *)f->data + q;
        *len = n;
        *pos = e + 1;
        *found = 1;
        return CAI_OK;
    }
    if (r->json) json_decref(r->json);
    json_error_t jerr;
    r->json = json_loadb((const char *)f->data + q, n, JSON_ALLOW_NUL, &jerr);
    if (!r->json)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: not valid JSON: %s (column %d)", f->path, (long long)*line,
                         jerr.text, jerr.column);
    if (!json_is_object(r->json))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: a JSONL line must be an object with a \"%s\" string", f->path,
                         (long long)*line, r->key);
    json_t *v = json_object_get(r->json, r->key);
    if (!v)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: no \"%s\" key in this object (set the key with --json-key)", f->path,
                         (long long)*line, r->key);
    if (!json_is_string(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: \"%s\" is not a string", f->path, (long long)*line, r->key);
    *text = json_string_value(v);
    *len = json_string_length(v);
    *pos = e + 1;
    *found = 1;
    return CAI_OK;
}

/* ------------------------------------------------------------------ collective helpers */

/* Every rank learns whether any rank failed. The other ranks get the
 * first failing rank's status and message, so whichever rank reports the
 * error reports its cause. */
static cai_status agree(MPI_Comm comm, cai_status st, const char *phase) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int mine = st == CAI_OK ? INT_MAX : rank * CAI_STATUS_COUNT + (int)st, first = INT_MAX;
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (rc != MPI_SUCCESS) return cai_error_mpi(rc, __FILE__, __LINE__, __func__, "MPI_Allreduce");
    if (first == INT_MAX) return CAI_OK;
    const int root = first / CAI_STATUS_COUNT;
    char msg[768] = "";
    if (rank == root) snprintf(msg, sizeof msg, "%s", cai_error_message());
    rc = MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, root, comm);
    if (st != CAI_OK) return st;
    if (rc != MPI_SUCCESS) return cai_error_mpi(rc, __FILE__, __LINE__, __func__, "MPI_Bcast");
    return CAI_ERROR((cai_status)(first % CAI_STATUS_COUNT), "rank %d failed while %s: %s", root, phase, msg);
}

static cai_status mpi_file_error(int rc, const char *what, const char *path) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return CAI_ERROR(CAI_ERR_IO, "%s: %s failed: %s", path, what, msg);
}

static cai_status write_at(MPI_File fh, int64_t off, const void *p, int64_t n, const char *path) {
    const int64_t chunk = 1 << 28;
    for (int64_t done = 0; done < n; done += chunk) {
        int c = (int)(n - done < chunk ? n - done : chunk);
        MPI_Status status;
        int rc = MPI_File_write_at(fh, (MPI_Offset)(off + done), (const char *)p + done, c, MPI_BYTE, &status);
        if (rc != MPI_SUCCESS) return mpi_file_error(rc, "MPI_File_write_at", path);
        int wrote = 0;
        MPI_Get_count(&status, MPI_BYTE, &wrote);
        if (wrote != c)
            return CAI_ERROR(CAI_ERR_IO, "%s: short write at offset %lld (%d of %d bytes)", path,
                             (long long)(off + done), wrote, c);
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ phases */

typedef struct {
    const cai_pp_config *cfg;
    int rank, size;
    in_stream in;
    int64_t lo, hi;                      /* this rank's global byte range */
    char part[CAI_PP_MAX_STREAMS][4096]; /* partial prefixes */
    int64_t docs, tokens;
} pp_state;

static cai_status tokenize_range(pp_state *S) {
    const cai_pp_config *cfg = S->cfg;
    const int ns = cfg->n_streams;
    cai_indexed_builder_t *b[CAI_PP_MAX_STREAMS] = {NULL};
    cai_token_buf buf[CAI_PP_MAX_STREAMS] = {{0}};
    doc_reader r = {NULL, cfg->format, cfg->json_key, NULL, 0, 1};
    cai_status st = CAI_OK;
    for (int k = 0; k < ns; k++)
        CAI_CALL_GOTO(cai_indexed_builder_init(&b[k], S->part[k], cfg->dtypes[k], cfg->vocab[k]), st, done);
    const double t0 = cai_time_now();
    double next_report = t0 + cfg->progress_interval_s;
    const int64_t mine = S->hi - S->lo;
    for (int i = 0; i < S->in.n; i++) {
        const int64_t fs = S->in.start[i], fe = S->in.start[i + 1];
        if (fe <= S->lo || fs >= S->hi) continue;
        reader_file(&r, &S->in.files[i]);
        size_t pos = (size_t)((S->lo > fs ? S->lo : fs) - fs);
        const size_t end = (size_t)((S->hi < fe ? S->hi : fe) - fs);
        for (;;) {
            const char *text = NULL;
            size_t len = 0;
            int64_t line = 0;
            int found = 0, keep = 1;
            CAI_CALL_GOTO(next_document(&r, &pos, end, &text, &len, &line, &found), st, done);
            if (!found) break;
            for (int k = 0; k < ns; k++) buf[k].len = 0;
            CAI_CALL_GOTO(cfg->document(cfg->ctx, r.f->path, line, text, len, buf, &keep), st, done);
            for (int k = 0; k < ns && keep; k++)
                CAI_CALL_GOTO(cai_indexed_builder_add_document(b[k], buf[k].ids, (int64_t)buf[k].len), st, done);
            S->docs += keep;
            if (S->rank == 0 && cfg->progress_interval_s > 0 && (S->docs & 63) == 0) {
                const double now = cai_time_now();
                if (now >= next_report) {
                    const double done_b = (double)(fs + (int64_t)pos - S->lo);
                    cai_log(CAI_LOG_INFO,
                            "preprocess: rank 0 at %.1f%% of its %.1f MB, %lld documents, %.2f MB/s per rank",
                            mine ? 100.0 * done_b / (double)mine : 100.0, (double)mine / 1e6, (long long)S->docs,
                            done_b / 1e6 / (now - t0));
                    next_report = now + cfg->progress_interval_s;
                }
            }
        }
    }
    S->tokens = cai_indexed_builder_num_tokens(b[0]);
    for (int k = 0; k < ns; k++) {
        cai_status fst = cai_indexed_builder_finish(b[k]);
        b[k] = NULL;
        if (fst != CAI_OK && st == CAI_OK) {
            cai_error_push(__FILE__, __LINE__, __func__, "cai_indexed_builder_finish(b[k])");
            st = fst;
        }
    }
done:
    for (int k = 0; k < ns; k++) {
        cai_indexed_builder_abort(b[k]);
        cai_token_buf_free(&buf[k]);
    }
    if (r.json) json_decref(r.json);
    return st;
}

/* Write this rank's partial into the final files. */
static cai_status merge_write(const cai_indexed_dataset_t *part, MPI_File fbin, MPI_File fidx, const char *bin_path,
                              const char *idx_path, int rank, const int64_t off[3], const int64_t tot[3]) {
    const int64_t S = tot[1], seq_off = off[1], doc_off = off[2], bin_off = off[0];
    const int64_t s = cai_indexed_num_sequences(part), nd = cai_indexed_num_documents(part);
    const int64_t H = CAI_INDEXED_HEADER_BYTES, len_at = H, ptr_at = H + 4 * S, doc_at = H + 12 * S;
    if (rank == 0) {
        unsigned char hdr[CAI_INDEXED_HEADER_BYTES];
        const uint64_t version = 1, us = (uint64_t)S, ud = (uint64_t)tot[2] + 1;
        memcpy(hdr, "MMIDIDX\0\0", 9);
        memcpy(hdr + 9, &version, 8);
        hdr[17] = (unsigned char)cai_indexed_get_dtype(part);
        memcpy(hdr + 18, &us, 8);
        memcpy(hdr + 26, &ud, 8);
        const int64_t zero = 0;
        CAI_CALL(write_at(fidx, 0, hdr, H, idx_path));
        CAI_CALL(write_at(fidx, doc_at, &zero, 8, idx_path));
    }
    enum { CHUNK = 1 << 16 };
    int64_t *tmp = malloc(CHUNK * sizeof *tmp);
    int32_t *lens = malloc(CHUNK * sizeof *lens);
    cai_status st = CAI_OK;
    if (!tmp || !lens) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "preprocess merge buffers");
        goto done;
    }
    for (int64_t i = 0; i < s; i += CHUNK) {
        const int64_t c = s - i < CHUNK ? s - i : CHUNK;
        for (int64_t k = 0; k < c; k++) lens[k] = cai_indexed_sequence_length(part, i + k);
        CAI_CALL_GOTO(write_at(fidx, len_at + 4 * (seq_off + i), lens, 4 * c, idx_path), st, done);
        for (int64_t k = 0; k < c; k++) tmp[k] = cai_indexed_sequence_pointer(part, i + k) + bin_off;
        CAI_CALL_GOTO(write_at(fidx, ptr_at + 8 * (seq_off + i), tmp, 8 * c, idx_path), st, done);
    }
    for (int64_t d = 0; d < nd; d += CHUNK) {
        const int64_t c = nd - d < CHUNK ? nd - d : CHUNK;
        for (int64_t k = 0; k < c; k++) tmp[k] = cai_indexed_document_start(part, d + k + 1) + seq_off;
        CAI_CALL_GOTO(write_at(fidx, doc_at + 8 * (1 + doc_off + d), tmp, 8 * c, idx_path), st, done);
    }
    /* The token bytes are already in the final dtype: copy the partial's
     * .bin verbatim (the handle is opaque, so through the file). Rank 0's
     * partial already is the start of the final file. */
    if (rank != 0) {
        char *bp = NULL;
        const size_t isz = cai_indexed_dtype_size(cai_indexed_get_dtype(part));
        int64_t written = 0;
        FILE *f = NULL;
        char path[4200];
        snprintf(path, sizeof path, "%s.bin", cai_indexed_prefix(part));
        f = fopen(path, "rb");
        bp = malloc(1 << 22);
        if (!f || !bp) {
            st = f ? CAI_ERROR(CAI_ERR_NOMEM, "preprocess merge buffer")
                   : CAI_ERROR(CAI_ERR_IO, "%s: cannot reopen partial: %s", path, strerror(errno));
        } else {
            size_t got;
            while (st == CAI_OK && (got = fread(bp, 1, 1 << 22, f)) > 0) {
                st = write_at(fbin, bin_off + written, bp, (int64_t)got, bin_path);
                written += (int64_t)got;
            }
            if (st == CAI_OK && ferror(f)) st = CAI_ERROR(CAI_ERR_IO, "%s: read failed", path);
            if (st == CAI_OK && written != off[3])
                st = CAI_ERROR(CAI_ERR_IO, "%s: %lld bytes read back, %lld expected (%zu-byte tokens)", path,
                               (long long)written, (long long)off[3], isz);
        }
        if (f) fclose(f);
        free(bp);
    }
done:
    free(tmp);
    free(lens);
    return st;
}

static cai_status open_out(MPI_Comm comm, const char *path, MPI_Offset size, MPI_File *fh) {
    int rc = MPI_File_open(comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, fh);
    if (rc != MPI_SUCCESS) {
        *fh = MPI_FILE_NULL;
        return mpi_file_error(rc, "MPI_File_open", path);
    }
    /* Collective; also truncates what a previous run left under this name. */
    rc = MPI_File_set_size(*fh, size);
    if (rc != MPI_SUCCESS) return mpi_file_error(rc, "MPI_File_set_size", path);
    return CAI_OK;
}

static cai_status merge(pp_state *S, int k, MPI_Comm comm, int64_t totals_out[3], int64_t *out_bytes) {
    const char *prefix = S->cfg->prefixes[k];
    cai_indexed_dataset_t *part = NULL;
    cai_status st = cai_indexed_open(&part, S->part[k], 0);
    CAI_CALL(agree(comm, st, "reopening its partial dataset"));
    int64_t mine[3] = {0, cai_indexed_num_sequences(part), cai_indexed_num_documents(part)};
    for (int64_t i = 0; i < mine[1]; i++) mine[0] += cai_indexed_sequence_length(part, i);
    mine[0] *= (int64_t)cai_indexed_dtype_size(cai_indexed_get_dtype(part));
    int64_t *all = malloc((size_t)S->size * 3 * sizeof *all);
    if (!all) st = CAI_ERROR(CAI_ERR_NOMEM, "preprocess: %d x 3 sizes", S->size);
    st = agree(comm, st, "allocating");
    if (st != CAI_OK) {
        free(all);
        cai_indexed_free(part);
        return st;
    }
    MPI_Allgather(mine, 3, MPI_INT64_T, all, 3, MPI_INT64_T, comm);
    int64_t off[4] = {0, 0, 0, mine[0]}, tot[3] = {0, 0, 0};
    for (int r = 0; r < S->size; r++) {
        if (r < S->rank)
            for (int k = 0; k < 3; k++) off[k] += all[3 * r + k];
        for (int k = 0; k < 3; k++) tot[k] += all[3 * r + k];
    }
    free(all);
    char bin_tmp[4200], idx_tmp[4200], bin_path[4200], idx_path[4200];
    snprintf(bin_tmp, sizeof bin_tmp, "%s.bin.tmp", prefix);
    snprintf(idx_tmp, sizeof idx_tmp, "%s.idx.tmp", prefix);
    snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    const int64_t idx_size = CAI_INDEXED_HEADER_BYTES + 12 * tot[1] + 8 * (tot[2] + 1);
    MPI_File fbin = MPI_FILE_NULL, fidx = MPI_FILE_NULL;
    /* Rank 0's tokens open the final .bin: renaming its partial saves
     * copying them (all of them on one rank). */
    if (S->rank == 0) {
        char part_bin[4200];
        snprintf(part_bin, sizeof part_bin, "%s.bin", S->part[k]);
        if (rename(part_bin, bin_tmp) != 0)
            st = CAI_ERROR(CAI_ERR_IO, "rename %s -> %s failed: %s", part_bin, bin_tmp, strerror(errno));
    }
    st = agree(comm, st, "renaming its partial");
    if (st == CAI_OK) {
        st = agree(comm, open_out(comm, bin_tmp, (MPI_Offset)tot[0], &fbin), "opening the output");
        if (st == CAI_OK) st = agree(comm, open_out(comm, idx_tmp, (MPI_Offset)idx_size, &fidx), "opening the output");
    }
    if (st == CAI_OK) st = merge_write(part, fbin, fidx, bin_tmp, idx_tmp, S->rank, off, tot);
    cai_indexed_free(part);
    st = agree(comm, st, "writing its part of the output");
    /* Close is collective: every rank closes whatever it opened. */
    cai_status cst = CAI_OK;
    if (fbin != MPI_FILE_NULL && MPI_File_close(&fbin) != MPI_SUCCESS)
        cst = CAI_ERROR(CAI_ERR_IO, "%s: MPI_File_close failed", bin_tmp);
    if (fidx != MPI_FILE_NULL && MPI_File_close(&fidx) != MPI_SUCCESS && cst == CAI_OK)
        cst = CAI_ERROR(CAI_ERR_IO, "%s: MPI_File_close failed", idx_tmp);
    cst = agree(comm, cst, "closing the output");
    if (st == CAI_OK) st = cst;
    if (st == CAI_OK && S->rank == 0) {
        if (rename(bin_tmp, bin_path) != 0 || rename(idx_tmp, idx_path) != 0)
            st = CAI_ERROR(CAI_ERR_IO, "rename %s.{bin,idx}.tmp into place failed: %s", prefix, strerror(errno));
    }
    if (st != CAI_OK && S->rank == 0) {
        unlink(bin_tmp);
        unlink(idx_tmp);
    }
    st = agree(comm, st, "renaming the output");
    totals_out[0] = tot[0];
    totals_out[1] = tot[1];
    totals_out[2] = tot[2];
    *out_bytes = tot[0] + idx_size;
    return st;
}

static void remove_part(const char *part) {
    const char *ext[] = {".bin", ".idx", ".bin.tmp", ".idx.tmp"};
    char path[4200];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s%s", part, ext[i]);
        unlink(path);
    }
}

cai_status cai_pp_agree(MPI_Comm comm, cai_status st, const char *phase) { return agree(comm, st, phase); }

/* A failure after the first stream is in place removes what was renamed. */
static void remove_outputs(const cai_pp_config *cfg, int upto) {
    char path[4200];
    for (int k = 0; k < upto; k++) {
        snprintf(path, sizeof path, "%s.bin", cfg->prefixes[k]);
        unlink(path);
        snprintf(path, sizeof path, "%s.idx", cfg->prefixes[k]);
        unlink(path);
    }
}

cai_status cai_pp_run(const cai_pp_config *cfg, MPI_Comm comm, cai_preprocess_stats *stats) {
    CAI_CHECK_ARG(cfg && cfg->inputs && cfg->n_inputs > 0 && cfg->document && cfg->n_streams >= 1 &&
                      cfg->n_streams <= CAI_PP_MAX_STREAMS,
                  "preprocess needs inputs, a document callback and 1 to %d output streams", CAI_PP_MAX_STREAMS);
    CAI_CHECK_ARG(cfg->format == CAI_PREPROCESS_TEXT || cfg->format == CAI_PREPROCESS_JSONL,
                  "preprocess: unknown input format %d", (int)cfg->format);
    CAI_CHECK_ARG(cfg->format == CAI_PREPROCESS_JSONL || cfg->json_key, "preprocess: whole lines are JSONL only");
    for (int k = 0; k < cfg->n_streams; k++) {
        CAI_CHECK_ARG(cfg->prefixes[k] && *cfg->prefixes[k], "preprocess: no output prefix for stream %d", k);
        CAI_CHECK_ARG(strlen(cfg->prefixes[k]) < 4000, "preprocess: output prefix is too long");
    }
    pp_state S;
    memset(&S, 0, sizeof S);
    S.cfg = cfg;
    CAI_CALL_MPI(MPI_Comm_rank(comm, &S.rank));
    CAI_CALL_MPI(MPI_Comm_size(comm, &S.size));
    CAI_CALL_MPI(MPI_Barrier(comm));
    const double t0 = cai_time_now();
    cai_status st = stream_open(&S.in, cfg->inputs, cfg->n_inputs);
    CAI_CALL(agree(comm, st, "opening the inputs"));
    const int64_t total = S.in.start[S.in.n];
    const int64_t raw_lo = (int64_t)((unsigned __int128)total * (unsigned)S.rank / (unsigned)S.size);
    const int64_t raw_hi = (int64_t)((unsigned __int128)total * (unsigned)(S.rank + 1) / (unsigned)S.size);
    S.lo = S.rank == 0 ? 0 : align_global(&S.in, raw_lo, cfg->format);
    S.hi = S.rank == S.size - 1 ? total : align_global(&S.in, raw_hi, cfg->format);
    if (S.hi < S.lo) S.hi = S.lo;
    for (int k = 0; k < cfg->n_streams; k++)
        snprintf(S.part[k], sizeof S.part[k], "%s.part-%05d-of-%05d", cfg->prefixes[k], S.rank, S.size);
    st = tokenize_range(&S);
    stream_close(&S.in);
    st = agree(comm, st, "tokenizing its input range");
    int64_t tot[3] = {0, 0, 0}, out_bytes = 0;
    int merged = 0;
    for (int k = 0; k < cfg->n_streams && st == CAI_OK; k++) {
        int64_t t[3], b = 0;
        st = merge(&S, k, comm, t, &b);
        if (st != CAI_OK) {
            cai_error_push(__FILE__, __LINE__, __func__, "merge(&S, k, comm, t, &b)");
            break;
        }
        merged++;
        out_bytes += b;
        if (k == 0) memcpy(tot, t, sizeof tot);
    }
    for (int k = 0; k < cfg->n_streams; k++) remove_part(S.part[k]);
    if (st != CAI_OK) {
        if (S.rank == 0) remove_outputs(cfg, merged);
        return st;
    }
    int64_t loc[2] = {S.tokens, S.hi - S.lo}, glob[2];
    CAI_CALL_MPI(MPI_Allreduce(loc, glob, 2, MPI_INT64_T, MPI_SUM, comm));
    double dt = cai_time_now() - t0, dtmax = dt;
    CAI_CALL_MPI(MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, comm));
    cai_log(CAI_LOG_DEBUG,
            "preprocess: %lld documents, %lld tokens (%s) from %.2f MB in %.2f s: %.2f MB/s on %d rank%s -> "
            "%s.{bin,idx}",
            (long long)tot[2], (long long)glob[0], cai_indexed_dtype_name(cfg->dtypes[0]), (double)glob[1] / 1e6, dtmax,
            dtmax > 0 ? (double)glob[1] / 1e6 / dtmax : 0.0, S.size, S.size == 1 ? "" : "s", cfg->prefixes[0]);
    if (stats) {
        stats->documents = tot[2];
        stats->tokens = glob[0];
        stats->input_bytes = glob[1];
        stats->output_bytes = out_bytes;
        stats->seconds = dtmax;
    }
    return CAI_OK;
}

/* cai_preprocess's document: its tokens and the end-of-document id. */
static cai_status plain_document(void *ctx, const char *file, int64_t line, const char *text, size_t len,
                                 cai_token_buf *streams, int *keep) {
    (void)file;
    (void)line;
    const cai_preprocess_config *cfg = ctx;
    CAI_CALL(cfg->tokenize(cfg->tokenize_ctx, text, len, &streams[0]));
    if (cfg->eod >= 0) CAI_CALL(cai_token_buf_append(&streams[0], &cfg->eod, 1));
    *keep = 1;
    return CAI_OK;
}

cai_status cai_preprocess(const cai_preprocess_config *cfg, MPI_Comm comm, cai_preprocess_stats *stats) {
    CAI_CHECK_ARG(cfg && cfg->inputs && cfg->n_inputs > 0 && cfg->output_prefix && *cfg->output_prefix && cfg->tokenize,
                  "cai_preprocess needs inputs, an output prefix and a tokenizer");
    CAI_CHECK_ARG(cfg->vocab_size > 0 && cfg->vocab_size <= (int64_t)INT32_MAX + 1,
                  "preprocess: vocabulary size %lld must be in [1, 2^31]", (long long)cfg->vocab_size);
    CAI_CHECK_ARG(cfg->eod < cfg->vocab_size, "preprocess: end-of-document id %d is outside the vocabulary of %lld",
                  cfg->eod, (long long)cfg->vocab_size);
    cai_pp_config pc = {.inputs = cfg->inputs,
                        .n_inputs = cfg->n_inputs,
                        .format = cfg->format,
                        .json_key = cfg->json_key && *cfg->json_key ? cfg->json_key : "text",
                        .n_streams = 1,
                        .prefixes = {cfg->output_prefix},
                        .dtypes = {cai_indexed_dtype_for_vocab(cfg->vocab_size)},
                        .vocab = {cfg->vocab_size},
                        .document = plain_document,
                        .ctx = (void *)cfg,
                        .progress_interval_s = cfg->progress_interval_s};
    return cai_pp_run(&pc, comm, stats);
}

cai_status cai_preprocess_documents(const char *const *inputs, int n_inputs, cai_preprocess_format format,
                                    const char *json_key, cai_document_fn fn, void *ctx) {
    CAI_CHECK_ARG(inputs && n_inputs > 0 && fn, "cai_preprocess_documents needs inputs and a callback");
    CAI_CHECK_ARG(format == CAI_PREPROCESS_TEXT || format == CAI_PREPROCESS_JSONL, "unknown input format %d",
                  (int)format);
    in_stream in;
    CAI_CALL(stream_open(&in, inputs, n_inputs));
    doc_reader r = {NULL, format, json_key && *json_key ? json_key : "text", NULL, 0, 1};
    cai_status st = CAI_OK;
    for (int i = 0; i < in.n && st == CAI_OK; i++) {
        reader_file(&r, &in.files[i]);
        size_t pos = 0;
        for (;;) {
            const char *text = NULL;
            size_t len = 0;
            int64_t line = 0;
            int found = 0;
            CAI_CALL_GOTO(next_document(&r, &pos, r.f->size, &text, &len, &line, &found), st, done);
            if (!found) break;
            CAI_CALL_GOTO(fn(ctx, text, len), st, done);
        }
    }
done:
    if (r.json) json_decref(r.json);
    stream_close(&in);
    return st;
}

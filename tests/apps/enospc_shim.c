/* A full disk, simulated for the tests (tests/apps/disk_full.sh): an
 * LD_PRELOAD library that makes writes into files under one directory fail
 * with ENOSPC (or EIO) once a byte budget is spent, the way a file system
 * that has run out of space does (a write that crosses the limit is short,
 * every later one fails, and the disk stays full), or at the n-th write call
 * only.
 *
 * Configured by the environment (read once, at the first intercepted call):
 *   CAI_ENOSPC_PATH   absolute directory (prefix); files whose path starts
 *                     with it are on the "small disk". Unset: the shim does
 *                     nothing.
 *   CAI_ENOSPC_AFTER  bytes that fit on it (per process); then it is full.
 *   CAI_ENOSPC_CALL   or: the n-th write call into it fails (1 = the first),
 *                     and only that one (an I/O error that passes).
 *   CAI_ENOSPC_OPS    what fails once full, a comma list of write (write,
 *                     pwrite, writev, pwritev, fwrite, fflush, fclose of a
 *                     stream with unwritten data), fsync (fsync, fdatasync),
 *                     close, rename (onto a path under the prefix).
 *                     Default: write,fsync.
 *   CAI_ENOSPC_RANK   only the process of this MPI rank is affected
 *                     (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK).
 *   CAI_ENOSPC_ERRNO  ENOSPC (default) or EIO.
 *   CAI_ENOSPC_STATVFS  "real": statvfs shows the real file system's space
 *                     (as with a quota, which statvfs does not see).
 *   CAI_ENOSPC_STATE  a file (outside the prefix) where the processes share
 *                     their reservations.
 * Space reserved with posix_fallocate/fallocate is taken from the budget
 * then, and later writes inside it always succeed, as on a real file
 * system; statvfs of a directory under the prefix reports the budget left.
 * The first failure prints "enospc shim: <op> of <path> fails with <errno>"
 * on stderr, so a test can tell the fault was injected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_WRITE = 1, OP_FSYNC = 2, OP_CLOSE = 4, OP_RENAME = 8 };

static struct {
    int init, active, mine, ops, err;
    char prefix[PATH_MAX];
    size_t prefix_len;
    long long budget; /* bytes left; -1: unlimited */
    long long call;   /* the failing call; 0: none */
    long long calls;  /* write calls seen */
    int full, announced;
} g;

static void init(void) {
    if (__atomic_load_n(&g.init, __ATOMIC_ACQUIRE)) return;
    const char *p = getenv("CAI_ENOSPC_PATH");
    g.budget = -1;
    g.ops = OP_WRITE | OP_FSYNC;
    g.err = ENOSPC;
    if (p && *p == '/') {
        snprintf(g.prefix, sizeof g.prefix, "%s", p);
        g.prefix_len = strlen(g.prefix);
        while (g.prefix_len > 1 && g.prefix[g.prefix_len - 1] == '/') g.prefix[--g.prefix_len] = '\0';
        g.active = 1;
        g.mine = 1;
    }
    const char *v = getenv("CAI_ENOSPC_AFTER");
    if (v && *v) g.budget = atoll(v);
    v = getenv("CAI_ENOSPC_CALL");
    if (v && *v) g.call = atoll(v);
    v = getenv("CAI_ENOSPC_OPS");
    if (v && *v) {
        g.ops = 0;
        if (strstr(v, "write")) g.ops |= OP_WRITE;
        if (strstr(v, "fsync")) g.ops |= OP_FSYNC;
        if (strstr(v, "close")) g.ops |= OP_CLOSE;
        if (strstr(v, "rename")) g.ops |= OP_RENAME;
    }
    v = getenv("CAI_ENOSPC_ERRNO");
    if (v && !strcmp(v, "EIO")) g.err = EIO;
    v = getenv("CAI_ENOSPC_RANK");
    if (v && *v) {
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r) r = getenv("PMIX_RANK");
        if (!r) r = getenv("PMI_RANK");
        if (!r || atoi(r) != atoi(v)) g.mine = 0;
    }
    __atomic_store_n(&g.init, 1, __ATOMIC_RELEASE);
}

static int under_prefix(const char *path) {
    return !strncmp(path, g.prefix, g.prefix_len) && (path[g.prefix_len] == '/' || path[g.prefix_len] == '\0');
}

static int fd_path(int fd, char *out, size_t cap) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, cap - 1);
    if (n <= 0) return -1;
    out[n] = '\0';
    return 0;
}

/* fd is a file on the small disk. */
static int under_disk(int fd, char *path, size_t cap) {
    init();
    if (!g.active || fd < 0) return 0;
    return fd_path(fd, path, cap) == 0 && under_prefix(path);
}

/* ... and this process is one whose writes fail. */
static int on_disk(int fd, char *path, size_t cap) { return g.mine && under_disk(fd, path, cap); }

static void announce(const char *op, const char *path) {
    if (__atomic_exchange_n(&g.announced, 1, __ATOMIC_ACQ_REL)) return;
    char line[PATH_MAX + 128];
    int n =
        snprintf(line, sizeof line, "enospc shim: %s of %s fails with %s\n", op, path, g.err == EIO ? "EIO" : "ENOSPC");
    if (n > 0) {
        ssize_t (*real_write)(int, const void *, size_t) =
            (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
        if (real_write && real_write(2, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0) {
            /* nothing to do: stderr is gone */
        }
    }
}

/* Reserved (fallocated) ranges, by inode. */
#define N_RESERVED 64
static struct {
    dev_t dev;
    ino_t ino;
    off_t begin, end;
} g_res[N_RESERVED];
static int g_nres;

/* The reservations of every process (a file system's allocation is shared):
 * CAI_ENOSPC_STATE names a file of "dev ino begin end" lines. */
static int reserved(int fd, off_t off, size_t len) {
    struct stat sb;
    if (len == 0 || fstat(fd, &sb) != 0) return 0;
    for (int i = 0; i < g_nres && i < N_RESERVED; i++)
        if (g_res[i].dev == sb.st_dev && g_res[i].ino == sb.st_ino && off >= g_res[i].begin &&
            off + (off_t)len <= g_res[i].end)
            return 1;
    const char *state = getenv("CAI_ENOSPC_STATE");
    FILE *f = state && *state ? fopen(state, "r") : NULL;
    if (!f) return 0;
    unsigned long long d, i, b, e;
    int hit = 0;
    while (!hit && fscanf(f, "%llu %llu %llu %llu", &d, &i, &b, &e) == 4)
        hit = d == (unsigned long long)sb.st_dev && i == (unsigned long long)sb.st_ino &&
              (unsigned long long)off >= b && (unsigned long long)off + len <= e;
    fclose(f);
    return hit;
}

static void reserve(int fd, off_t off, off_t len) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return;
    int i = __atomic_fetch_add(&g_nres, 1, __ATOMIC_ACQ_REL);
    if (i >= N_RESERVED) return;
    g_res[i].dev = sb.st_dev;
    g_res[i].ino = sb.st_ino;
    g_res[i].begin = off;
    g_res[i].end = off + len;
    const char *state = getenv("CAI_ENOSPC_STATE");
    int sfd = state && *state ? open(state, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (sfd < 0) return;
    char line[128];
    int n = snprintf(line, sizeof line, "%llu %llu %llu %llu\n", (unsigned long long)sb.st_dev,
                     (unsigned long long)sb.st_ino, (unsigned long long)off, (unsigned long long)(off + len));
    if (n > 0 && write(sfd, line, (size_t)n) < 0) { /* the others will count those writes */
    }
    close(sfd);
}

/* How many of len bytes may be written now (0 with errno set: none). */
static size_t allow(const char *op, const char *path, size_t len) {
    long long c = __atomic_add_fetch(&g.calls, 1, __ATOMIC_ACQ_REL);
    if (g.call > 0 && c == g.call && len) { /* one failing call: the later ones go through */
        announce(op, path);
        errno = g.err;
        return 0;
    }
    if (!__atomic_load_n(&g.full, __ATOMIC_ACQUIRE) && g.budget >= 0) {
        long long left = __atomic_load_n(&g.budget, __ATOMIC_ACQUIRE);
        for (;;) {
            long long take = (long long)len < left ? (long long)len : left;
            if (__atomic_compare_exchange_n(&g.budget, &left, left - take, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                if (take < (long long)len) __atomic_store_n(&g.full, 1, __ATOMIC_RELEASE);
                if (take > 0 || len == 0) return (size_t)take;
                break;
            }
        }
    }
    if (!__atomic_load_n(&g.full, __ATOMIC_ACQUIRE)) return len;
    if (len == 0) return 0;
    announce(op, path);
    errno = g.err;
    return 0;
}

static int full_fails(int op, const char *what, const char *path) {
    if (!(g.ops & op) || !__atomic_load_n(&g.full, __ATOMIC_ACQUIRE)) return 0;
    announce(what, path);
    errno = g.err;
    return 1;
}

/* The next definition of `name`, and the configuration read. */
#define REAL(name)                                                               \
    static __typeof__(name) *real_##name;                                        \
    if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name); \
    init()

static size_t iov_total(const struct iovec *iov, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += iov[i].iov_len;
    return t;
}

/* The first `room` bytes of an iovec array: a shortened copy in `out`. */
static int iov_cut(const struct iovec *iov, int n, size_t room, struct iovec *out, int cap) {
    int k = 0;
    for (int i = 0; i < n && room > 0 && k < cap; i++) {
        out[k] = iov[i];
        if (out[k].iov_len > room) out[k].iov_len = room;
        room -= out[k].iov_len;
        k++;
    }
    return k;
}

ssize_t write(int fd, const void *buf, size_t len) {
    REAL(write);
    char path[PATH_MAX];
    if (g.ops & OP_WRITE && on_disk(fd, path, sizeof path) && !reserved(fd, lseek(fd, 0, SEEK_CUR), len)) {
        size_t ok = allow("write", path, len);
        if (ok == 0 && len) return -1;
        len = ok;
    }
    return real_write(fd, buf, len);
}

/* pwrite and pwrite64 (the same call under two names). */
static ssize_t pwrite_via(ssize_t (*real)(int, const void *, size_t, off_t), int fd, const void *buf, size_t len,
                          off_t off) {
    char path[PATH_MAX];
    if (g.ops & OP_WRITE && on_disk(fd, path, sizeof path) && !reserved(fd, off, len)) {
        size_t ok = allow("pwrite", path, len);
        if (ok == 0 && len) return -1;
        len = ok;
    }
    return real(fd, buf, len, off);
}

ssize_t pwrite(int fd, const void *buf, size_t len, off_t off) {
    REAL(pwrite);
    return pwrite_via(real_pwrite, fd, buf, len, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off) {
    REAL(pwrite64);
    return pwrite_via(real_pwrite64, fd, buf, len, off);
}

#define IOV_CAP 1024
static ssize_t call_writev(int fd, const struct iovec *iov, int n, off_t off, int flags);
static ssize_t vec(int fd, const struct iovec *iov, int n, const char *op,
                   ssize_t (*call)(int, const struct iovec *, int, off_t, int), off_t off, int flags) {
    char path[PATH_MAX];
    init();
    size_t len = iov_total(iov, n);
    if (call == call_writev) off = lseek(fd, 0, SEEK_CUR);
    if (getenv("CAI_ENOSPC_DEBUG") && under_disk(fd, path, sizeof path))
        fprintf(stderr, "enospc shim debug: %s %lld+%zu reserved %d\n", op, (long long)off, len,
                reserved(fd, off, len));
    if (g.ops & OP_WRITE && on_disk(fd, path, sizeof path) && !reserved(fd, off, len)) {
        size_t ok = allow(op, path, len);
        if (ok == 0 && len) return -1;
        if (ok < len) {
            struct iovec cut[IOV_CAP];
            int k = iov_cut(iov, n, ok, cut, IOV_CAP);
            return call(fd, cut, k, off, flags);
        }
    }
    return call(fd, iov, n, off, flags);
}

static ssize_t call_writev(int fd, const struct iovec *iov, int n, off_t off, int flags) {
    (void)off;
    (void)flags;
    REAL(writev);
    return real_writev(fd, iov, n);
}
static ssize_t call_pwritev(int fd, const struct iovec *iov, int n, off_t off, int flags) {
    (void)flags;
    REAL(pwritev);
    return real_pwritev(fd, iov, n, off);
}
static ssize_t call_pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags) {
    REAL(pwritev2);
    return real_pwritev2(fd, iov, n, off, flags);
}

ssize_t writev(int fd, const struct iovec *iov, int n) { return vec(fd, iov, n, "writev", call_writev, 0, 0); }
ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off) {
    return vec(fd, iov, n, "pwritev", call_pwritev, off, 0);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int n, off_t off) {
    return vec(fd, iov, n, "pwritev", call_pwritev, off, 0);
}
ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags) {
    return vec(fd, iov, n, "pwritev", call_pwritev2, off, flags);
}

/* stdio: glibc's streams call its internal write, which no preload can
 * catch, so the stream functions are caught instead. fwrite counts against
 * the budget as it is called; fflush and fclose fail once the disk is full
 * and the stream holds unwritten data. */
static int stream_on_disk(FILE *f, char *path, size_t cap) {
    if (!f) return 0;
    int fd = fileno(f);
    return fd >= 0 && on_disk(fd, path, cap);
}

size_t fwrite(const void *buf, size_t size, size_t n, FILE *f) {
    REAL(fwrite);
    char path[PATH_MAX];
    if (g.ops & OP_WRITE && size && stream_on_disk(f, path, sizeof path)) {
        size_t len = size * n, ok = allow("fwrite", path, len);
        if (ok < len) {
            size_t items = ok / size;
            if (items) real_fwrite(buf, size, items, f);
            errno = g.err;
            return items;
        }
    }
    return real_fwrite(buf, size, n, f);
}

static int pending(FILE *f) { return __fpending(f) > 0; }

int fflush(FILE *f) {
    REAL(fflush);
    char path[PATH_MAX];
    if (g.ops & OP_WRITE && f && stream_on_disk(f, path, sizeof path) && pending(f)) {
        size_t len = __fpending(f), ok = allow("fflush", path, len);
        if (ok < len) {
            __fpurge(f);
            errno = g.err;
            return EOF;
        }
    }
    return real_fflush(f);
}

int fclose(FILE *f) {
    REAL(fclose);
    char path[PATH_MAX];
    int fail = 0;
    if (f && stream_on_disk(f, path, sizeof path)) {
        if (g.ops & OP_WRITE && pending(f)) {
            size_t len = __fpending(f), ok = allow("fclose", path, len);
            if (ok < len) {
                __fpurge(f);
                fail = 1;
            }
        }
        if (!fail && full_fails(OP_CLOSE, "close", path)) fail = 1;
    }
    int rc = real_fclose(f);
    if (fail) {
        errno = g.err;
        return EOF;
    }
    return rc;
}

int fsync(int fd) {
    REAL(fsync);
    char path[PATH_MAX];
    if (on_disk(fd, path, sizeof path) && full_fails(OP_FSYNC, "fsync", path)) return -1;
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    char path[PATH_MAX];
    if (on_disk(fd, path, sizeof path) && full_fails(OP_FSYNC, "fdatasync", path)) return -1;
    return real_fdatasync(fd);
}

int close(int fd) {
    REAL(close);
    char path[PATH_MAX];
    int fail = g.ops & OP_CLOSE && on_disk(fd, path, sizeof path) && full_fails(OP_CLOSE, "close", path);
    int rc = real_close(fd);
    if (fail) {
        errno = g.err;
        return -1;
    }
    return rc;
}

int rename(const char *from, const char *to) {
    REAL(rename);
    init();
    if (g.mine && to && under_prefix(to) && full_fails(OP_RENAME, "rename", to)) return -1;
    return real_rename(from, to);
}

/* fallocate: the space comes from the budget now, the writes into it later
 * are free. */
static int take_space(int fd, off_t off, off_t len) {
    char path[PATH_MAX];
    if (!under_disk(fd, path, sizeof path) || len <= 0) return 0;
    if (g.mine && g.budget >= 0) {
        long long left = __atomic_load_n(&g.budget, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g.full, __ATOMIC_ACQUIRE) || left < (long long)len) {
            announce("fallocate", path);
            return g.err == EIO ? EIO : ENOSPC;
        }
        __atomic_sub_fetch(&g.budget, (long long)len, __ATOMIC_ACQ_REL);
    }
    reserve(fd, off, len);
    return 0;
}

int posix_fallocate(int fd, off_t off, off_t len) {
    REAL(posix_fallocate);
    int rc = take_space(fd, off, len);
    return rc ? rc : real_posix_fallocate(fd, off, len);
}

int posix_fallocate64(int fd, off_t off, off_t len) {
    REAL(posix_fallocate64);
    int rc = take_space(fd, off, len);
    return rc ? rc : real_posix_fallocate64(fd, off, len);
}

int fallocate(int fd, int mode, off_t off, off_t len) {
    REAL(fallocate);
    int rc = mode == 0 ? take_space(fd, off, len) : 0;
    if (rc) {
        errno = rc;
        return -1;
    }
    return real_fallocate(fd, mode, off, len);
}

/* statvfs: a directory under the prefix has the budget left. */
static void report_space(const char *path, struct statvfs *sv) {
    const char *v = getenv("CAI_ENOSPC_STATVFS");
    if (v && !strcmp(v, "real")) return;
    if (!g.mine || g.budget < 0 || !path || !under_prefix(path)) return;
    unsigned long bs = sv->f_frsize ? sv->f_frsize : sv->f_bsize;
    long long left = __atomic_load_n(&g.full, __ATOMIC_ACQUIRE) ? 0 : __atomic_load_n(&g.budget, __ATOMIC_ACQUIRE);
    sv->f_bavail = sv->f_bfree = (fsblkcnt_t)((unsigned long long)left / (bs ? bs : 1));
}

int statvfs(const char *path, struct statvfs *sv) {
    REAL(statvfs);
    int rc = real_statvfs(path, sv);
    if (rc == 0) report_space(path, sv);
    return rc;
}

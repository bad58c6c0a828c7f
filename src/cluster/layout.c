/* Pure layout arithmetic: validation with suggestions, and the coordinates and
 * groups of any rank, computed exactly as MPI_Cart_create + MPI_Cart_sub lay
 * them out (row-major, last grid dimension fastest, reorder = 0) but without
 * MPI, so a layout can be checked and printed for a world we are not in. */
#include "cai_config.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_internal.h"

static const char *const k_axis_names[CAI_AXIS_COUNT] = {
    [CAI_AXIS_PP] = "pp", [CAI_AXIS_DP] = "dp",   [CAI_AXIS_EP] = "ep",       [CAI_AXIS_SP] = "sp",
    [CAI_AXIS_TP] = "tp", [CAI_AXIS_EDP] = "edp", [CAI_AXIS_DP_SP] = "dp_sp", [CAI_AXIS_WORLD] = "world",
};

/* Names of the grid dimensions in order strings; the edp dimension is
 * called "dp" there because that is what users think of it as. */
static const char *const k_grid_names[CAI_GRID_N] = {"pp", "dp", "ep", "sp", "tp"};

#define G(d) (1u << (d))
static const unsigned k_axis_mask[CAI_AXIS_COUNT] = {
    [CAI_AXIS_PP] = G(CAI_GRID_PP),
    [CAI_AXIS_DP] = G(CAI_GRID_EDP) | G(CAI_GRID_EP),
    [CAI_AXIS_EP] = G(CAI_GRID_EP),
    [CAI_AXIS_SP] = G(CAI_GRID_SP),
    [CAI_AXIS_TP] = G(CAI_GRID_TP),
    [CAI_AXIS_EDP] = G(CAI_GRID_EDP),
    [CAI_AXIS_DP_SP] = G(CAI_GRID_EDP) | G(CAI_GRID_EP) | G(CAI_GRID_SP),
    [CAI_AXIS_WORLD] = G(CAI_GRID_N) - 1,
};

#define DEFAULT_ORDER "pp,dp,ep,sp,tp"

const char *cai_axis_name(cai_axis axis) {
    if ((int)axis < 0 || axis >= CAI_AXIS_COUNT) return "?";
    return k_axis_names[axis];
}

cai_status cai_axis_parse(const char *name, cai_axis *out) {
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        if (name && strcmp(name, k_axis_names[a]) == 0) {
            *out = (cai_axis)a;
            return CAI_OK;
        }
    }
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "unknown axis '%s' (expected pp, dp, ep, sp, tp, edp, dp_sp or world)",
                     name ? name : "(null)");
}

unsigned cai_axis_grid_mask(cai_axis axis) {
    if ((int)axis < 0 || axis >= CAI_AXIS_COUNT) return 0;
    return k_axis_mask[axis];
}

/* -------------------------------------------------------------- order */

/* Parses an order string into grid dimension ids; on failure writes why into
 * msg and returns 0. */
static int parse_order(const char *order, int out[CAI_GRID_N], char *msg, size_t msgcap) {
    if (!order || !*order) order = DEFAULT_ORDER;
    int seen[CAI_GRID_N] = {0};
    int n = 0;
    const char *p = order;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        const char *start = p;
        while (*p && *p != ',' && *p != ' ') p++;
        size_t len = (size_t)(p - start);
        int id = -1;
        for (int d = 0; d < CAI_GRID_N; d++)
            if (strlen(k_grid_names[d]) == len && strncmp(start, k_grid_names[d], len) == 0) id = d;
        if (len == 3 && strncmp(start, "edp", 3) == 0) id = CAI_GRID_EDP;
        if (id < 0) {
            snprintf(msg, msgcap, "mesh order '%s': unknown dimension '%.*s' (expected a permutation of %s)", order,
                     (int)len, start, DEFAULT_ORDER);
            return 0;
        }
        if (seen[id]) {
            snprintf(msg, msgcap, "mesh order '%s' names '%s' twice (expected a permutation of %s)", order,
                     k_grid_names[id], DEFAULT_ORDER);
            return 0;
        }
        seen[id] = 1;
        if (n < CAI_GRID_N) out[n] = id;
        n++;
    }
    if (n != CAI_GRID_N) {
        char missing[64] = "";
        for (int d = 0; d < CAI_GRID_N; d++)
            if (!seen[d]) {
                strcat(missing, missing[0] ? ", " : "");
                strcat(missing, k_grid_names[d]);
            }
        snprintf(msg, msgcap,
                 "mesh order '%s' must name each of pp, dp, ep, sp, tp once, outermost first (e.g. %s); missing: %s",
                 order, DEFAULT_ORDER, missing);
        return 0;
    }
    return 1;
}

static int grid_size(const cai_layout *l, int dim) {
    switch (dim) {
    case CAI_GRID_PP: return l->pp;
    case CAI_GRID_EDP: return l->ep > 0 ? l->dp / l->ep : 0;
    case CAI_GRID_EP: return l->ep;
    case CAI_GRID_SP: return l->sp;
    default: return l->tp;
    }
}

/* Structural checks that need no world size; returns 0 and a message on failure. */
static int check_shape(const cai_layout *l, char *msg, size_t cap) {
    const struct {
        const char *name;
        int v;
    } f[] = {{"pp", l->pp}, {"dp", l->dp}, {"ep", l->ep}, {"sp", l->sp}, {"tp", l->tp}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < 1) {
            snprintf(msg, cap, "%s=%d: every axis size must be >= 1", f[i].name, f[i].v);
            return 0;
        }
    if (l->dp % l->ep != 0) {
        snprintf(msg, cap,
                 "ep=%d does not divide dp=%d (expert parallelism factors the data-parallel ranks: dp = edp x ep)",
                 l->ep, l->dp);
        return 0;
    }
    long long world = (long long)l->pp * l->dp * l->sp * l->tp;
    if (world > INT_MAX) {
        snprintf(msg, cap, "pp*dp*sp*tp = %lld exceeds the largest MPI communicator", world);
        return 0;
    }
    return 1;
}

cai_status cai_layout_grid(const cai_layout *layout, int order[CAI_GRID_N], int dims[CAI_GRID_N]) {
    char msg[256];
    if (!layout) return CAI_ERROR(CAI_ERR_INVALID_ARG, "layout is NULL");
    if (!check_shape(layout, msg, sizeof msg)) return CAI_ERROR(CAI_ERR_LAYOUT, "%s", msg);
    if (!parse_order(layout->order, order, msg, sizeof msg)) return CAI_ERROR(CAI_ERR_LAYOUT, "%s", msg);
    for (int i = 0; i < CAI_GRID_N; i++) dims[i] = grid_size(layout, order[i]);
    return CAI_OK;
}

/* -------------------------------------------------------------- validation */

void cai_sbuf_vadd(cai_sbuf *s, const char *fmt, va_list ap) {
    if (s->len + 1 >= s->cap) return;
    int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
    if (n > 0) s->len += (size_t)n;
    if (s->len >= s->cap) s->len = s->cap - 1;
}

void cai_sbuf_add(cai_sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cai_sbuf_vadd(s, fmt, ap);
    va_end(ap);
}

/* A list of problems joined by "; ". */
typedef struct {
    cai_sbuf s;
    int count;
} msgbuf;

static void msg_add(msgbuf *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void msg_add(msgbuf *m, const char *fmt, ...) {
    if (m->count++ > 0) cai_sbuf_add(&m->s, "; ");
    va_list ap;
    va_start(ap, fmt);
    cai_sbuf_vadd(&m->s, fmt, ap);
    va_end(ap);
}

/* Model rules; appends one message per broken rule and returns how many broke. */
static int check_model(const cai_layout *l, const cai_layout_model *mo, msgbuf *m) {
    if (!mo) return 0;
    int bad = 0;
    if (mo->n_heads > 0 && mo->n_heads % l->tp != 0) {
        bad++;
        if (m)
            msg_add(m, "n_heads=%d is not divisible by tp=%d (each TP rank owns whole query heads)", mo->n_heads,
                    l->tp);
    }
    if (mo->n_kv_heads > 0 && mo->n_kv_heads % l->tp != 0 && l->tp % mo->n_kv_heads != 0) {
        bad++;
        if (m)
            msg_add(m,
                    "n_kv_heads=%d and tp=%d: neither divides the other (KV heads are split over TP ranks, or "
                    "replicated when tp is a multiple of them)",
                    mo->n_kv_heads, l->tp);
    }
    int chunks = mo->pp_chunks > 0 ? mo->pp_chunks : 1;
    long long stages = (long long)l->pp * chunks;
    if (mo->n_layers > 0 && mo->n_layers % stages != 0) {
        bad++;
        if (m)
            msg_add(
                m,
                "n_layers=%d is not divisible by pp*chunks=%d*%d=%lld (every pipeline stage owns the same number of layers)",
                mo->n_layers, l->pp, chunks, stages);
    }
    if (mo->n_experts > 0 && mo->n_experts % l->ep != 0) {
        bad++;
        if (m)
            msg_add(m, "n_experts=%d is not divisible by ep=%d (each EP rank owns whole experts)", mo->n_experts,
                    l->ep);
    }
    return bad;
}

size_t cai_layout_str(const cai_layout *l, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "tp=%d pp=%d dp=%d", l->tp, l->pp, l->dp);
    if (l->sp != 1 && n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " sp=%d", l->sp);
    if (l->ep != 1 && n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " ep=%d", l->ep);
    return n < 0 ? 0 : (size_t)n;
}

#define SUGGEST_IN_MESSAGE 8

cai_status cai_layout_validate(int world_size, const cai_layout *layout, const cai_layout_model *model) {
    if (!layout) return CAI_ERROR(CAI_ERR_INVALID_ARG, "layout is NULL");
    char text[1800];
    msgbuf m = {{text, sizeof text, 0}, 0};
    text[0] = 0;
    int order[CAI_GRID_N];
    char one[512];
    if (!parse_order(layout->order, order, one, sizeof one)) return CAI_ERROR(CAI_ERR_LAYOUT, "%s", one);
    if (!check_shape(layout, one, sizeof one)) {
        msg_add(&m, "%s", one);
    } else {
        long long product = (long long)layout->pp * layout->dp * layout->sp * layout->tp;
        if (world_size < 1) {
            msg_add(&m, "world size %d must be >= 1", world_size);
        } else if (product != world_size) {
            msg_add(&m, "pp*dp*sp*tp = %d*%d*%d*%d = %lld but the world has %d ranks", layout->pp, layout->dp,
                    layout->sp, layout->tp, product, world_size);
            long long fixed = (long long)layout->pp * layout->sp * layout->tp;
            if (world_size % fixed != 0)
                msg_add(&m, "pp*sp*tp = %lld does not divide %d, so no dp fits", fixed, world_size);
            else if (world_size / fixed % layout->ep == 0) msg_add(&m, "dp=%lld would fit", world_size / fixed);
        }
        check_model(layout, model, &m);
    }
    if (m.count == 0) return CAI_OK;

    if (world_size >= 1) {
        cai_layout sug[SUGGEST_IN_MESSAGE];
        int ns = cai_layout_suggest(world_size, layout, model, sug, SUGGEST_IN_MESSAGE);
        if (ns == 0) {
            msg_add(&m, "no layout of %d ranks satisfies this model", world_size);
        } else {
            msg_add(&m, "layouts that fit %d ranks:", world_size);
            for (int i = 0; i < ns; i++) {
                char s[96];
                cai_layout_str(&sug[i], s, sizeof s);
                m.count = 0; /* no "; " between suggestions */
                msg_add(&m, "%s \"%s\"", i ? "," : "", s);
            }
        }
    }
    return CAI_ERROR(CAI_ERR_LAYOUT, "world of %d ranks: %s", world_size, text);
}

/* -------------------------------------------------------------- suggestions */

static int is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

static double log2_ratio(int a, int b) { return fabs(log2((double)a) - log2((double)b)); }

/* Lower is better: keep tp a small power of two close to what was asked
 * (TP wants one NVLink domain), keep sp and pp as asked, and let dp absorb
 * the rest because data parallelism is the cheapest axis to change. */
static double layout_score(const cai_layout *c, const cai_layout *h, int ep_kept) {
    double s = 0;
    if (!is_pow2(c->tp)) s += 100;
    if (c->tp > 8) s += 40;
    s += 10 * log2_ratio(c->tp, h->tp);
    if (c->sp != h->sp) s += 20 * log2_ratio(c->sp, h->sp) + (is_pow2(c->sp) ? 0 : 50);
    s += 5 * log2_ratio(c->pp, h->pp);
    s += 1 * log2_ratio(c->dp, h->dp);
    if (!ep_kept) s += 30;
    return s;
}

typedef struct {
    cai_layout l;
    double score;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    if (x->l.tp != y->l.tp) return y->l.tp - x->l.tp;
    if (x->l.pp != y->l.pp) return x->l.pp - y->l.pp;
    return x->l.sp - y->l.sp;
}

int cai_layout_suggest(int world_size, const cai_layout *hint, const cai_layout_model *model, cai_layout *out,
                       int max) {
    if (world_size < 1 || max < 0) return 0;
    cai_layout h = {1, world_size, 1, 1, 1, NULL};
    if (hint) {
        h = *hint;
        if (h.pp < 1) h.pp = 1;
        if (h.dp < 1) h.dp = 1;
        if (h.ep < 1) h.ep = 1;
        if (h.sp < 1) h.sp = 1;
        if (h.tp < 1) h.tp = 1;
    }
    size_t cap = 64, n = 0;
    scored *all = malloc(cap * sizeof *all);
    if (!all) return 0;
    for (int tp = 1; tp <= world_size; tp++) {
        if (world_size % tp) continue;
        for (int sp = 1; sp <= world_size / tp; sp++) {
            if ((world_size / tp) % sp) continue;
            int rest = world_size / tp / sp;
            for (int pp = 1; pp <= rest; pp++) {
                if (rest % pp) continue;
                cai_layout c = {pp, rest / pp, 1, sp, tp, h.order};
                int ep_kept = h.ep == 1;
                if (c.dp % h.ep == 0) {
                    c.ep = h.ep;
                    ep_kept = 1;
                }
                if (check_model(&c, model, NULL)) continue;
                if (n == cap) {
                    scored *grown = realloc(all, 2 * cap * sizeof *all);
                    if (!grown) break;
                    all = grown;
                    cap *= 2;
                }
                all[n].l = c;
                all[n].score = layout_score(&c, &h, ep_kept);
                n++;
            }
        }
    }
    qsort(all, n, sizeof *all, cmp_scored);
    int k = 0;
    for (size_t i = 0; i < n && k < max; i++) {
        /* The layout that was asked for is not a suggestion. */
        if (hint && all[i].l.pp == hint->pp && all[i].l.dp == hint->dp && all[i].l.sp == hint->sp &&
            all[i].l.tp == hint->tp && all[i].l.ep == hint->ep)
            continue;
        if (out) out[k] = all[i].l;
        k++;
    }
    free(all);
    return k;
}

/* -------------------------------------------------------------- coordinates */

int cai_layout_axis_size(const cai_layout *l, cai_axis axis) {
    if (!l || l->pp < 1 || l->dp < 1 || l->ep < 1 || l->sp < 1 || l->tp < 1 || l->dp % l->ep) return 0;
    switch (axis) {
    case CAI_AXIS_PP: return l->pp;
    case CAI_AXIS_DP: return l->dp;
    case CAI_AXIS_EP: return l->ep;
    case CAI_AXIS_SP: return l->sp;
    case CAI_AXIS_TP: return l->tp;
    case CAI_AXIS_EDP: return l->dp / l->ep;
    case CAI_AXIS_DP_SP: return l->dp * l->sp;
    case CAI_AXIS_WORLD: return l->pp * l->dp * l->sp * l->tp;
    default: return 0;
    }
}

/* Grid coordinates of a rank: row-major over dims, last one fastest. */
static void decompose(const int dims[CAI_GRID_N], int rank, int coord[CAI_GRID_N]) {
    for (int i = CAI_GRID_N - 1; i >= 0; i--) {
        coord[i] = rank % dims[i];
        rank /= dims[i];
    }
}

static int compose(const int dims[CAI_GRID_N], const int coord[CAI_GRID_N]) {
    int r = 0;
    for (int i = 0; i < CAI_GRID_N; i++) r = r * dims[i] + coord[i];
    return r;
}

/* The index within an axis group is row-major over the grid positions the
 * axis spans, in grid order — what MPI_Cart_sub gives. */
static int axis_index(const int order[CAI_GRID_N], const int dims[CAI_GRID_N], const int coord[CAI_GRID_N],
                      unsigned mask) {
    int idx = 0;
    for (int i = 0; i < CAI_GRID_N; i++)
        if (mask & G(order[i])) idx = idx * dims[i] + coord[i];
    return idx;
}

static cai_status grid_for_rank(const cai_layout *l, int rank, int order[CAI_GRID_N], int dims[CAI_GRID_N]) {
    CAI_CALL(cai_layout_grid(l, order, dims));
    int world = cai_layout_axis_size(l, CAI_AXIS_WORLD);
    if (rank < 0 || rank >= world)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "rank %d is outside a layout of %d ranks", rank, world);
    return CAI_OK;
}

cai_status cai_layout_coords(const cai_layout *layout, int world_rank, int coords[CAI_AXIS_COUNT]) {
    int order[CAI_GRID_N], dims[CAI_GRID_N], coord[CAI_GRID_N];
    CAI_CALL(grid_for_rank(layout, world_rank, order, dims));
    decompose(dims, world_rank, coord);
    for (int a = 0; a < CAI_AXIS_COUNT; a++) coords[a] = axis_index(order, dims, coord, k_axis_mask[a]);
    return CAI_OK;
}

cai_status cai_layout_group(const cai_layout *layout, cai_axis axis, int world_rank, int *ranks_out) {
    int order[CAI_GRID_N], dims[CAI_GRID_N], coord[CAI_GRID_N];
    CAI_CHECK_ARG((int)axis >= 0 && axis < CAI_AXIS_COUNT, "axis %d out of range", (int)axis);
    CAI_CALL(grid_for_rank(layout, world_rank, order, dims));
    decompose(dims, world_rank, coord);
    unsigned mask = k_axis_mask[axis];
    int n = cai_layout_axis_size(layout, axis);
    for (int k = 0; k < n; k++) {
        /* Spread k over the spanned positions, innermost fastest. */
        int rem = k;
        for (int i = CAI_GRID_N - 1; i >= 0; i--) {
            if (!(mask & G(order[i]))) continue;
            coord[i] = rem % dims[i];
            rem /= dims[i];
        }
        ranks_out[k] = compose(dims, coord);
    }
    return CAI_OK;
}

#define PRINT_MAX_GROUPS 64

void cai_layout_print(const cai_layout *layout, FILE *out) {
    int world = cai_layout_axis_size(layout, CAI_AXIS_WORLD);
    int order[CAI_GRID_N], dims[CAI_GRID_N];
    if (world < 1 || cai_layout_grid(layout, order, dims) != CAI_OK) {
        fprintf(out, "invalid layout: %s\n", cai_error_message());
        cai_error_clear();
        return;
    }
    char s[96];
    cai_layout_str(layout, s, sizeof s);
    fprintf(out, "layout %s, %d ranks, grid", s, world);
    for (int i = 0; i < CAI_GRID_N; i++)
        fprintf(out, "%s%s=%d", i ? " x " : " ", order[i] == CAI_GRID_EDP ? "edp" : k_grid_names[order[i]], dims[i]);
    fprintf(out, " (outermost first)\n");
    int *grp = malloc((size_t)world * sizeof *grp);
    if (!grp) return;
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        int n = cai_layout_axis_size(layout, (cai_axis)a);
        fprintf(out, "%s groups:", k_axis_names[a]);
        int printed = 0, total = world / n;
        for (int r = 0; r < world; r++) {
            int coords[CAI_AXIS_COUNT];
            cai_layout_coords(layout, r, coords);
            if (coords[a] != 0) continue;
            if (printed == PRINT_MAX_GROUPS) {
                fprintf(out, " ... (%d groups)", total);
                break;
            }
            cai_layout_group(layout, (cai_axis)a, r, grp);
            fprintf(out, " [");
            for (int k = 0; k < n; k++) fprintf(out, "%s%d", k ? " " : "", grp[k]);
            fprintf(out, "]");
            printed++;
        }
        fprintf(out, "\n");
    }
    free(grp);
}

/* The embedded default corpus: templated short stories, arithmetic drills
 * and word problems with worked answers. Small vocabularies, recurring
 * structure and exact arithmetic give a tiny model something it can learn
 * quickly (the loss falls visibly within minutes on a CPU), while the
 * seeded choices make enough distinct documents that it cannot simply
 * memorise a handful. Document i is a pure function of (seed, i). */
#include "cai_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"

typedef struct {
    uint64_t seed, doc;
    uint64_t counter;
    char *buf;
    size_t cap, len;
    int overflow;
} gen;

/* Uniform integer in [0, n): one Philox block per draw, stream = document. */
static int pick(gen *g, int n) {
    cai_philox_block b = cai_philox4x32(g->seed, 0x434f5250ull << 32 | (g->doc >> 32), (g->doc << 32) | g->counter++);
    return (int)(((uint64_t)b.v[0] * (uint64_t)n) >> 32);
}

static int range(gen *g, int lo, int hi) { return lo + pick(g, hi - lo + 1); }

#define ONE_OF(g, arr) (arr)[pick((g), (int)(sizeof(arr) / sizeof((arr)[0])))]

static void put(gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(gen *g, const char *fmt, ...) {
    if (g->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g->buf + g->len, g->cap - g->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= g->cap - g->len) {
        g->overflow = 1;
        return;
    }
    g->len += (size_t)n;
}

static const char *const k_girls[] = {"Mia",  "Lily", "Emma", "Zoe", "Anna", "Sara", "Lucy", "Nora",
                                      "Ella", "Ruby", "Maya", "Ava", "Iris", "Hana", "Rosa", "Leila"};
static const char *const k_boys[] = {"Tom",  "Ben",  "Sam",  "Leo", "Max",  "Jack", "Omar", "Finn",
                                     "Noah", "Theo", "Ravi", "Kai", "Luis", "Eli",  "Ivan", "Hugo"};
static const char *const k_animals[] = {"dog",  "cat",    "rabbit", "bird", "duck",  "fox",
                                        "frog", "turtle", "horse",  "owl",  "mouse", "bear"};
static const char *const k_adj[] = {"little", "small", "big",  "happy",  "curious",
                                    "brave",  "shy",   "kind", "sleepy", "clever"};
static const char *const k_colors[] = {"red", "blue", "green", "yellow", "orange", "purple", "pink", "white"};
static const char *const k_objects[] = {"ball", "kite", "box", "hat",   "book",  "boat",   "cup",
                                        "drum", "key",  "map", "shell", "stone", "flower", "balloon"};
static const char *const k_places[] = {"the park",  "the forest", "the beach", "the garden",  "the market",
                                       "the river", "the hill",   "the farm",  "the library", "the old barn"};
static const char *const k_times[] = {"One sunny morning",    "One rainy day", "One cold evening",
                                      "On a windy afternoon", "Early one day", "One quiet night"};
static const char *const k_feel[] = {"happy", "sad", "surprised", "scared", "proud", "excited", "tired", "worried"};
static const char *const k_fruits[] = {"apples",   "oranges", "pears", "cookies", "marbles",
                                       "stickers", "pencils", "eggs",  "cards",   "shells"};

static void story(gen *g) {
    const int girl = pick(g, 2);
    const char *hero = girl ? ONE_OF(g, k_girls) : ONE_OF(g, k_boys);
    const char *he = girl ? "she" : "he", *He = girl ? "She" : "He", *his = girl ? "her" : "his";
    const char *friend = pick(g, 2) ? ONE_OF(g, k_girls) : ONE_OF(g, k_boys);
    if (!strcmp(friend, hero)) friend = girl ? "Tom" : "Lily";
    const char *animal = ONE_OF(g, k_animals), *color = ONE_OF(g, k_colors), *obj = ONE_OF(g, k_objects);
    const char *place = ONE_OF(g, k_places);
    switch (pick(g, 3)) {
    case 0:
        put(g, "Once upon a time, there was a %s %s named %s.", ONE_OF(g, k_adj), girl ? "girl" : "boy", hero);
        break;
    case 1:
        put(g, "%s was a %s %s who loved to play near %s.", hero, ONE_OF(g, k_adj), girl ? "girl" : "boy", place);
        break;
    default:
        put(g, "There once lived a %s %s and a %s %s.", ONE_OF(g, k_adj), animal, ONE_OF(g, k_adj),
            girl ? "girl" : "boy");
        put(g, " The %s was called %s.", girl ? "girl" : "boy", hero);
    }
    put(g, "\n%s, %s went to %s with %s friend %s.", ONE_OF(g, k_times), hero, place, his, friend);
    const int events = range(g, 2, 5);
    for (int e = 0; e < events; e++) {
        put(g, "%s", e % 2 ? "\n" : " ");
        switch (pick(g, 8)) {
        case 0: put(g, "%s found a %s %s on the ground.", He, color, obj); break;
        case 1: put(g, "A %s %s came out and looked at them.", ONE_OF(g, k_adj), animal); break;
        case 2: put(g, "%s felt %s and said, \"Look, %s!\"", He, ONE_OF(g, k_feel), friend); break;
        case 3: put(g, "They counted %d %s and put them in the %s.", range(g, 2, 9), ONE_OF(g, k_fruits), obj); break;
        case 4: put(g, "%s wanted to hold the %s, so %s gave it to %s.", friend, obj, he, friend); break;
        case 5: put(g, "Then it started to rain, so they ran under a big tree."); break;
        case 6: put(g, "The %s %s was lost, so they helped it find its home.", color, animal); break;
        default: put(g, "%s shared the %s with %s, and %s smiled.", hero, obj, friend, friend);
        }
    }
    switch (pick(g, 4)) {
    case 0: put(g, "\nIn the end, %s and %s played together until the sun went down.", hero, friend); break;
    case 1:
        put(g, "\nThat night, %s told %s mom about the %s %s. %s felt %s.", hero, his, color, obj, He,
            ONE_OF(g, k_feel));
        break;
    case 2: put(g, "\nFrom that day on, %s and the %s were best friends.", hero, animal); break;
    default: put(g, "\n%s learned that sharing makes everyone happy. The end.", hero);
    }
}

static void drill(gen *g) {
    const int n = range(g, 3, 8);
    for (int i = 0; i < n; i++) {
        if (i) put(g, "\n");
        int a, b;
        switch (pick(g, 4)) {
        case 0:
            a = range(g, 0, 99);
            b = range(g, 0, 99);
            put(g, "Q: What is %d + %d? A: %d", a, b, a + b);
            break;
        case 1:
            a = range(g, 0, 99);
            b = range(g, 0, a);
            put(g, "Q: What is %d - %d? A: %d", a, b, a - b);
            break;
        case 2:
            a = range(g, 0, 12);
            b = range(g, 0, 12);
            put(g, "Q: What is %d times %d? A: %d", a, b, a * b);
            break;
        default:
            b = range(g, 1, 12);
            a = b * range(g, 0, 12);
            put(g, "Q: What is %d divided by %d? A: %d", a, b, a / b);
        }
    }
}

static void word_problem(gen *g) {
    const int girl = pick(g, 2);
    const char *who = girl ? ONE_OF(g, k_girls) : ONE_OF(g, k_boys), *He = girl ? "She" : "He";
    const char *other = pick(g, 2) ? ONE_OF(g, k_girls) : ONE_OF(g, k_boys);
    if (!strcmp(other, who)) other = girl ? "Ben" : "Zoe";
    const char *thing = ONE_OF(g, k_fruits);
    int a = range(g, 2, 20), b = range(g, 1, 15), r;
    switch (pick(g, 4)) {
    case 0:
        r = a + b;
        put(g, "%s has %d %s. %s gets %d more from %s. How many %s does %s have now?", who, a, thing, He, b, other,
            thing, who);
        put(g, "\nAnswer: %d + %d = %d. %s has %d %s.", a, b, r, who, r, thing);
        break;
    case 1:
        if (b > a) b = a;
        r = a - b;
        put(g, "%s has %d %s. %s gives %d to %s. How many %s are left?", who, a, thing, He, b, other, thing);
        put(g, "\nAnswer: %d - %d = %d. %s has %d %s left.", a, b, r, who, r, thing);
        break;
    case 2:
        a = range(g, 2, 9);
        b = range(g, 2, 9);
        r = a * b;
        put(g, "%s has %d bags. Each bag has %d %s. How many %s are there in all?", who, a, b, thing, thing);
        put(g, "\nAnswer: %d x %d = %d. There are %d %s.", a, b, r, r, thing);
        break;
    default:
        r = a > b ? a - b : b - a;
        put(g, "%s has %d %s and %s has %d %s. Who has more, and by how many?", who, a, thing, other, b, thing);
        if (a == b) put(g, "\nAnswer: They have the same number of %s.", thing);
        else put(g, "\nAnswer: %s has %d more %s than %s.", a > b ? who : other, r, thing, a > b ? other : who);
    }
}

cai_status cai_corpus_document(uint64_t seed, int64_t index, char *buf, size_t cap, size_t *len) {
    CAI_CHECK_ARG(buf && len && index >= 0, "cai_corpus_document: bad arguments");
    CAI_CHECK_ARG(cap >= CAI_CORPUS_MAX_DOC, "cai_corpus_document: buffer of %zu bytes, need %d", cap,
                  CAI_CORPUS_MAX_DOC);
    gen g = {seed, (uint64_t)index, 0, buf, CAI_CORPUS_MAX_DOC, 0, 0};
    buf[0] = 0;
    const int kind = pick(&g, 10);
    if (kind < 5) story(&g);
    else if (kind < 8) word_problem(&g);
    else drill(&g);
    if (g.overflow) return CAI_ERROR(CAI_ERR_INTERNAL, "corpus document %lld overflowed its buffer", (long long)index);
    *len = g.len;
    return CAI_OK;
}

cai_status cai_corpus_write(const char *path, int64_t n_docs, uint64_t seed, cai_preprocess_format format) {
    CAI_CHECK_ARG(path && *path && n_docs >= 0, "cai_corpus_write: bad arguments");
    CAI_CHECK_ARG(format == CAI_PREPROCESS_TEXT || format == CAI_PREPROCESS_JSONL, "corpus: unknown format %d",
                  (int)format);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    char *doc = malloc(CAI_CORPUS_MAX_DOC);
    if (!tmp || !doc) {
        free(tmp);
        free(doc);
        return CAI_ERROR(CAI_ERR_NOMEM, "corpus buffers");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    cai_status st = CAI_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = CAI_ERROR(CAI_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    for (int64_t i = 0; i < n_docs && st == CAI_OK; i++) {
        size_t len;
        CAI_CALL_GOTO(cai_corpus_document(seed, i, doc, CAI_CORPUS_MAX_DOC, &len), st, done);
        if (format == CAI_PREPROCESS_JSONL) {
            json_t *o = json_pack("{s:s%}", "text", doc, len);
            char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (!line || fprintf(f, "%s\n", line) < 0)
                st =
                    CAI_ERROR(line ? CAI_ERR_IO : CAI_ERR_NOMEM, "%s: writing document %lld failed", tmp, (long long)i);
            free(line);
            json_decref(o);
        } else if (fprintf(f, "%s%s\n", i ? "\n" : "", doc) < 0) {
            st = CAI_ERROR(CAI_ERR_IO, "%s: writing document %lld failed: %s", tmp, (long long)i, strerror(errno));
        }
    }
done:
    if (f && fclose(f) != 0 && st == CAI_OK) st = CAI_ERROR(CAI_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (st == CAI_OK && rename(tmp, path) != 0)
        st = CAI_ERROR(CAI_ERR_IO, "rename %s -> %s failed: %s", tmp, path, strerror(errno));
    if (st != CAI_OK) remove(tmp);
    free(tmp);
    free(doc);
    return st;
}

/* ------------------------------------------------------------------ instruction set
 * Chat conversations from the same generators: a fine-tuned model should
 * answer arithmetic in one fixed format ("The answer is N.") and continue
 * a story when asked, which a model pretrained on the corpus above does
 * not do unprompted. */

static const char *const k_systems[] = {"You are a helpful assistant.", "Answer briefly.",
                                        "You are a patient teacher for children."};

/* The question of an arithmetic conversation; returns the answer. */
static int question(gen *g) {
    int a, b;
    const char *who = pick(g, 2) ? ONE_OF(g, k_girls) : ONE_OF(g, k_boys), *thing = ONE_OF(g, k_fruits);
    switch (pick(g, 6)) {
    case 0:
        a = range(g, 0, 99);
        b = range(g, 0, 99);
        put(g, "What is %d + %d?", a, b);
        return a + b;
    case 1:
        a = range(g, 0, 99);
        b = range(g, 0, a);
        put(g, "What is %d - %d?", a, b);
        return a - b;
    case 2:
        a = range(g, 0, 12);
        b = range(g, 0, 12);
        put(g, "What is %d times %d?", a, b);
        return a * b;
    case 3:
        b = range(g, 1, 12);
        a = b * range(g, 0, 12);
        put(g, "What is %d divided by %d?", a, b);
        return a / b;
    case 4:
        a = range(g, 2, 20);
        b = range(g, 1, 15);
        put(g, "%s has %d %s and gets %d more. How many %s does %s have now?", who, a, thing, b, thing, who);
        return a + b;
    default:
        a = range(g, 2, 20);
        b = range(g, 1, a);
        put(g, "%s has %d %s and gives away %d. How many %s are left?", who, a, thing, b, thing);
        return a - b;
    }
}

static cai_status chat_push(cai_chat_conversation *c, const char *role, const char *text, size_t len) {
    cai_chat_message *m = realloc(c->messages, (size_t)(c->n_messages + 1) * sizeof *m);
    if (!m) return CAI_ERROR(CAI_ERR_NOMEM, "instruction set message");
    c->messages = m;
    char *r = strdup(role), *s = malloc(len + 1);
    if (!r || !s) {
        free(r);
        free(s);
        return CAI_ERROR(CAI_ERR_NOMEM, "instruction set message");
    }
    memcpy(s, text, len);
    s[len] = '\0';
    c->messages[c->n_messages++] = (cai_chat_message){r, s};
    return CAI_OK;
}

cai_status cai_sft_example_conversation(const cai_sft_example_config *cfg, int64_t i, cai_chat_conversation *out,
                                        int *held_out) {
    CAI_CHECK_ARG(cfg && out && i >= 0 && cfg->held_out_percent >= 0 && cfg->held_out_percent <= 100,
                  "cai_sft_example_conversation: bad arguments");
    memset(out, 0, sizeof *out);
    char buf[CAI_CORPUS_MAX_DOC];
    /* its own seed: conversation i is not corpus document i */
    gen g = {cfg->seed ^ 0x5346542d43484154ull /* "SFT-CHAT" */, (uint64_t)i, 0, buf, sizeof buf, 0, 0};
    const int held = pick(&g, 100) < cfg->held_out_percent;
    cai_status st = CAI_OK;
    if (pick(&g, 4) == 0) {
        const char *sys = ONE_OF(&g, k_systems);
        st = chat_push(out, "system", sys, strlen(sys));
    }
    if (st == CAI_OK && pick(&g, 3) != 0) {
        const int answer = question(&g);
        st = chat_push(out, "user", buf, g.len);
        if (st == CAI_OK) {
            char a[64];
            const int n = snprintf(a, sizeof a, "The answer is %d.", answer);
            st = chat_push(out, "assistant", a, (size_t)n);
        }
    } else if (st == CAI_OK) {
        /* a story's first line is its opening; the rest continues it */
        put(&g, "Continue this story: ");
        const size_t lead = g.len;
        story(&g);
        const char *nl = memchr(buf + lead, '\n', g.len - lead);
        const size_t cut = nl ? (size_t)(nl - buf) : g.len;
        st = chat_push(out, "user", buf, cut);
        if (st == CAI_OK)
            st = nl ? chat_push(out, "assistant", nl + 1, g.len - cut - 1) : chat_push(out, "assistant", "The end.", 8);
    }
    if (st == CAI_OK && g.overflow)
        st = CAI_ERROR(CAI_ERR_INTERNAL, "instruction set conversation %lld overflowed its buffer", (long long)i);
    if (st != CAI_OK) {
        cai_chat_conversation_free(out);
        return st;
    }
    if (held_out) *held_out = held;
    return CAI_OK;
}

cai_status cai_out_file_open(cai_out_file *o, const char *path) {
    memset(o, 0, sizeof *o);
    if (!path) return CAI_OK;
    o->path = path;
    o->tmp = malloc(strlen(path) + 5);
    if (!o->tmp) return CAI_ERROR(CAI_ERR_NOMEM, "file name");
    sprintf(o->tmp, "%s.tmp", path);
    o->f = fopen(o->tmp, "wb");
    if (!o->f) return CAI_ERROR(CAI_ERR_IO, "%s: cannot create: %s", o->tmp, strerror(errno));
    return CAI_OK;
}

cai_status cai_out_file_close(cai_out_file *o, cai_status st) {
    if (o->f && fclose(o->f) != 0 && st == CAI_OK)
        st = CAI_ERROR(CAI_ERR_IO, "%s: close failed: %s", o->tmp, strerror(errno));
    if (o->f && st == CAI_OK && rename(o->tmp, o->path) != 0)
        st = CAI_ERROR(CAI_ERR_IO, "rename %s -> %s failed: %s", o->tmp, o->path, strerror(errno));
    if (o->f && st != CAI_OK) remove(o->tmp);
    free(o->tmp);
    memset(o, 0, sizeof *o);
    return st;
}

static cai_status write_conversation(FILE *f, const char *path, const cai_chat_conversation *c) {
    json_t *arr = json_array();
    for (int k = 0; arr && k < c->n_messages; k++)
        if (json_array_append_new(arr, json_pack("{s:s,s:s}", "role", c->messages[k].role, "content",
                                                 c->messages[k].content)) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    json_t *o = arr ? json_pack("{s:o}", "messages", arr) : NULL;
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    cai_status st = CAI_OK;
    if (!line) st = CAI_ERROR(CAI_ERR_NOMEM, "%s: a conversation as JSON", path);
    else if (fprintf(f, "%s\n", line) < 0) st = CAI_ERROR(CAI_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    free(line);
    json_decref(o);
    return st;
}

int cai_sft_example_arithmetic(const cai_chat_conversation *c, const char **question, long long *answer) {
    if (c->n_messages < 2) return 0;
    const cai_chat_message *u = &c->messages[c->n_messages - 2], *a = &c->messages[c->n_messages - 1];
    if (strcmp(u->role, "user") != 0 || strcmp(a->role, "assistant") != 0) return 0;
    long long n;
    int used = 0;
    if (sscanf(a->content, "The answer is %lld.%n", &n, &used) != 1 || used == 0 || a->content[used] != '\0') return 0;
    *question = u->content;
    *answer = n;
    return 1;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void cai_sft_question_set_free(cai_sft_question_set *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->q[i]);
    free(s->q);
    s->q = NULL;
    s->n = 0;
}

/* Appends a copy of q to s (capacity *cap). */
static cai_status question_push(cai_sft_question_set *s, int64_t *cap, const char *q, int64_t conversation) {
    if (s->n == *cap) {
        const int64_t grown = *cap ? 2 * *cap : 256;
        char **b = realloc(s->q, (size_t)grown * sizeof *b);
        if (!b) return CAI_ERROR(CAI_ERR_NOMEM, "instruction set: %lld held-out questions", (long long)grown);
        s->q = b;
        *cap = grown;
    }
    if (!(s->q[s->n] = strdup(q)))
        return CAI_ERROR(CAI_ERR_NOMEM, "instruction set: held-out question of conversation %lld",
                         (long long)conversation);
    s->n++;
    return CAI_OK;
}

cai_status cai_sft_example_held_questions(const cai_sft_example_config *cfg, cai_sft_question_set *out) {
    CAI_CHECK_ARG(cfg && out && cfg->n >= 0, "cai_sft_example_held_questions: bad arguments");
    memset(out, 0, sizeof *out);
    cai_sft_question_set s = {0};
    int64_t cap = 0;
    cai_status st = CAI_OK;
    /* with nothing held out there is nothing to collect */
    for (int64_t i = 0; i < cfg->n && cfg->held_out_percent > 0 && st == CAI_OK; i++) {
        cai_chat_conversation c = {0};
        int held = 0;
        const char *q;
        long long answer;
        st = cai_sft_example_conversation(cfg, i, &c, &held);
        if (st == CAI_OK && held && cai_sft_example_arithmetic(&c, &q, &answer)) st = question_push(&s, &cap, q, i);
        cai_chat_conversation_free(&c);
    }
    if (st != CAI_OK) {
        cai_sft_question_set_free(&s);
        return st;
    }
    if (s.n > 0) qsort(s.q, (size_t)s.n, sizeof *s.q, str_cmp);
    int64_t k = 0;
    for (int64_t i = 0; i < s.n; i++) {
        if (k > 0 && strcmp(s.q[i], s.q[k - 1]) == 0) free(s.q[i]);
        else s.q[k++] = s.q[i];
    }
    s.n = k;
    *out = s;
    return CAI_OK;
}

int cai_sft_question_set_has(const cai_sft_question_set *s, const char *question) {
    return s->n > 0 && bsearch(&question, s->q, (size_t)s->n, sizeof *s->q, str_cmp) != NULL;
}

int cai_sft_question_set_asked(const cai_sft_question_set *s, const cai_chat_conversation *c) {
    for (int k = 0; k < c->n_messages; k++)
        if (strcmp(c->messages[k].role, "user") == 0 && cai_sft_question_set_has(s, c->messages[k].content)) return 1;
    return 0;
}

cai_status cai_sft_example_write(const cai_sft_example_config *cfg, const char *train_path, const char *held_out_path,
                                 int64_t *n_train, int64_t *n_held, int64_t *n_left_out) {
    CAI_CHECK_ARG(cfg && cfg->n >= 0, "cai_sft_example_write: bad arguments");
    cai_sft_question_set hq;
    CAI_CALL(cai_sft_example_held_questions(cfg, &hq));
    cai_out_file files[2] = {{0}};
    int64_t counts[2] = {0, 0}, left_out = 0;
    cai_status st = cai_out_file_open(&files[0], train_path);
    if (st == CAI_OK) st = cai_out_file_open(&files[1], held_out_path);
    for (int64_t i = 0; i < cfg->n && st == CAI_OK; i++) {
        cai_chat_conversation c;
        int held = 0;
        st = cai_sft_example_conversation(cfg, i, &c, &held);
        if (st != CAI_OK) break;
        if (!held && cai_sft_question_set_asked(&hq, &c)) {
            left_out++;
        } else {
            counts[held]++;
            if (files[held].f) st = write_conversation(files[held].f, files[held].tmp, &c);
        }
        cai_chat_conversation_free(&c);
    }
    st = cai_out_file_close(&files[0], st);
    st = cai_out_file_close(&files[1], st);
    cai_sft_question_set_free(&hq);
    if (n_train) *n_train = counts[0];
    if (n_held) *n_held = counts[1];
    if (n_left_out) *n_left_out = left_out;
    return st;
}

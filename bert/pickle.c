/* pickle.c — the restricted pickle reader of tk_pickle.h.
 *
 * A stack machine like Python's Unpickler, but its only effects are building
 * value nodes: no opcode looks anything up or calls anything. Every length
 * is checked against the bytes left before it is used, every node is
 * charged against the memory cap, and every node sits on one list so
 * destroy frees shared and cyclic trees in one pass. Streaming (on_item)
 * frees each handed-over item's nodes at once, except those the memo keeps.
 */
#include "tk_pickle.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Streamed records free and remake millions of small strings and item
 * arrays: buffers of up to 16 << (POOL_CLASSES - 1) bytes are kept by size
 * class and reused (each is still one tk_malloc block, freed by destroy). */
#define POOL_CLASSES 6

/* Pages read are given back to the kernel in steps of this many bytes. */
#define RELEASE_STEP ((size_t)64 << 20)

struct tk_pickle {
    size_t read;      /* bytes read, STOP included */
    tk_pval *nodes;   /* every node, newest first */
    tk_pval *root;
    size_t used;      /* bytes charged against max_bytes */
    tk_pval *spare;   /* streaming: freed nodes, reused before new ones are allocated */
    void *spare_buf[POOL_CLASSES]; /* streaming: freed strings and item arrays by size class */
};

typedef struct rd {
    const uint8_t *buf;
    size_t len, pos, op_pos;
    uint8_t op;
    const tk_pickle_opts *opts;
    const char *name;
    size_t max_bytes;
    tk_pickle *p;
    tk_pval **stack;  /* value stack */
    size_t sp, scap;
    size_t *marks;    /* stack heights at each MARK */
    size_t nmarks, mcap;
    tk_pval **memo;
    size_t memo_n;    /* slots */
    size_t memo_count; /* slots set: MEMOIZE's next index, as len(memo) in Python */
    tk_err *err;
    /* streaming: the memo indices the file fetches (a bitmap from the first
     * pass), and those entries in a hash table of index -> node */
    uint8_t *fetched;
    size_t fetched_bits;
    uint8_t *set_bits;     /* streaming: memo indices set so far (memo_count counts them) */
    size_t set_n;
    struct kept { size_t idx; tk_pval *v; } *kt;
    size_t kt_cap;
    int release;           /* buf is a file mapping: give read pages back */
    size_t released;
} rd;

static const struct { uint8_t op; const char *name; } OPNAMES[] = {
    {0x80, "PROTO"}, {0x95, "FRAME"}, {'.', "STOP"}, {'}', "EMPTY_DICT"}, {']', "EMPTY_LIST"},
    {')', "EMPTY_TUPLE"}, {'(', "MARK"}, {'s', "SETITEM"}, {'u', "SETITEMS"}, {'a', "APPEND"},
    {'e', "APPENDS"}, {0x8c, "SHORT_BINUNICODE"}, {'X', "BINUNICODE"}, {0x8d, "BINUNICODE8"},
    {'C', "SHORT_BINBYTES"}, {'B', "BINBYTES"}, {0x8e, "BINBYTES8"}, {'J', "BININT"}, {'K', "BININT1"},
    {'M', "BININT2"}, {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'G', "BINFLOAT"}, {'N', "NONE"}, {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"}, {'t', "TUPLE"}, {0x85, "TUPLE1"}, {0x86, "TUPLE2"}, {0x87, "TUPLE3"},
    {0x94, "MEMOIZE"}, {'q', "BINPUT"}, {'r', "LONG_BINPUT"}, {'h', "BINGET"}, {'j', "LONG_BINGET"},
    {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"}, {'c', "GLOBAL"}, {0x93, "STACK_GLOBAL"}, {'R', "REDUCE"},
    {'b', "BUILD"}, {'Q', "BINPERSID"}, {'P', "PERSID"}, {'i', "INST"}, {'o', "OBJ"}, {0x81, "NEWOBJ"},
    {0x92, "NEWOBJ_EX"}, {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}, {'S', "STRING"}, {'V', "UNICODE"}, {'I', "INT"},
    {'L', "LONG"}, {'F', "FLOAT"}, {'p', "PUT"}, {'g', "GET"}, {'l', "LIST"}, {'d', "DICT"},
    {0x82, "EXT1"}, {0x83, "EXT2"}, {0x84, "EXT4"},
};

static const char *op_name(uint8_t op) {
    for (size_t i = 0; i < sizeof OPNAMES / sizeof OPNAMES[0]; i++)
        if (OPNAMES[i].op == op) return OPNAMES[i].name;
    return "unknown opcode";
}

/* Fails with "NAME: byte N: OPNAME (0xXX): what". Always returns -1. */
static int fail(rd *r, const char *what) {
    tk_err_set(r->err, TK_EFORMAT, "%s: byte %zu: %s (0x%02x): %s", r->name, r->op_pos, op_name(r->op), r->op,
               what);
    return -1;
}

/* A host allocation failed: TK_ENOMEM, naming the file and where. -1. */
static int fail_nomem(rd *r) {
    tk_err_set(r->err, TK_ENOMEM, "%s: byte %zu: %s (0x%02x): out of host memory", r->name, r->op_pos,
               op_name(r->op), r->op);
    return -1;
}

static int pool_class(size_t n) {
    for (int c = 0; c < POOL_CLASSES; c++)
        if (n <= (size_t)16 << c) return c;
    return -1;
}

/* A buffer of at least n bytes: a spare of its class, else a new block of
 * the class's size (or of n past the largest class). */
static void *buf_get(rd *r, size_t n) {
    int c = pool_class(n);
    if (c < 0) return tk_malloc(n);
    void *b = r->p->spare_buf[c];
    if (b) {
        memcpy(&r->p->spare_buf[c], b, sizeof(void *));
        return b;
    }
    return tk_malloc((size_t)16 << c);
}

/* Gives back a buffer buf_get made for n bytes. */
static void buf_put(rd *r, void *b, size_t n) {
    int c = pool_class(n);
    if (!b) return;
    if (c < 0) {
        free(b);
        return;
    }
    memcpy(b, &r->p->spare_buf[c], sizeof(void *));
    r->p->spare_buf[c] = b;
}

static int charge(rd *r, size_t n) {
    if (n > r->max_bytes || r->p->used > r->max_bytes - n) return fail(r, "the values would exceed the reader's memory cap");
    r->p->used += n;
    return 0;
}

static tk_pval *node(rd *r, tk_pval_kind k) {
    if (charge(r, sizeof(tk_pval))) return NULL;
    tk_pval *v = r->p->spare;
    if (v) {
        r->p->spare = v->next_node;
        memset(v, 0, sizeof *v);
    } else if (!(v = tk_calloc(1, sizeof *v))) {
        fail_nomem(r);
        return NULL;
    }
    v->kind = k;
    v->next_node = r->p->nodes;
    if (r->p->nodes) r->p->nodes->prev_node = v;
    r->p->nodes = v;
    return v;
}

/* Frees a streamed item's nodes: not those the memo keeps (nor, through
 * them, their children), and not past a depth no real record reaches (a
 * deeper tree is left to destroy). */
static void free_item(rd *r, tk_pval *v, int depth) {
    if (!v || v->kept || depth > 32) return;
    v->kept = 1; /* visited: a node reached twice is freed once */
    for (size_t i = 0; i < v->n && v->kind != TK_PV_STR && v->kind != TK_PV_BYTES && v->kind != TK_PV_GLOBAL; i++)
        free_item(r, v->items[i], depth + 1);
    if (v->prev_node) v->prev_node->next_node = v->next_node;
    else r->p->nodes = v->next_node;
    if (v->next_node) v->next_node->prev_node = v->prev_node;
    size_t bytes = sizeof *v + v->cap * sizeof(tk_pval *) +
                   (v->kind == TK_PV_STR || v->kind == TK_PV_BYTES || v->kind == TK_PV_GLOBAL ? v->n + 1 : 0);
    r->p->used -= bytes < r->p->used ? bytes : r->p->used;
    buf_put(r, v->items, v->cap * sizeof(tk_pval *));
    if (v->kind == TK_PV_STR || v->kind == TK_PV_BYTES) buf_put(r, (char *)v->s, v->n + 1);
    else free((char *)v->s);
    v->next_node = r->p->spare; /* millions of records: reuse the node rather than free it */
    r->p->spare = v;
}

/* Appends x to v's items, growing by doubling (charged). */
static int add_item(rd *r, tk_pval *v, tk_pval *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        if (charge(r, (cap - v->cap) * sizeof(tk_pval *))) return -1;
        tk_pval **it = buf_get(r, cap * sizeof *it);
        if (!it) return fail_nomem(r);
        if (v->n) memcpy(it, v->items, v->n * sizeof *it);
        buf_put(r, v->items, v->cap * sizeof *it);
        v->items = it;
        v->cap = cap;
    }
    v->items[v->n++] = x;
    return 0;
}

static int need(rd *r, size_t n) {
    if (n > r->len - r->pos) return fail(r, "the file ends inside this opcode's argument (truncated?)");
    return 0;
}

static uint64_t le(const uint8_t *b, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | b[i];
    return x;
}

static int push(rd *r, tk_pval *v) {
    if (!v) return -1;
    if (r->sp == r->scap) {
        size_t cap = r->scap ? r->scap * 2 : 64;
        if (charge(r, (cap - r->scap) * sizeof(tk_pval *))) return -1;
        tk_pval **s = tk_realloc(r->stack, cap * sizeof *s);
        if (!s) return fail_nomem(r);
        r->stack = s;
        r->scap = cap;
    }
    r->stack[r->sp++] = v;
    return 0;
}

/* The lowest stack index this opcode may pop to (the last MARK's height). */
static size_t floor_sp(rd *r) { return r->nmarks ? r->marks[r->nmarks - 1] : 0; }

static tk_pval *pop(rd *r) {
    if (r->sp <= floor_sp(r)) {
        fail(r, "the stack is empty here");
        return NULL;
    }
    return r->stack[--r->sp];
}

static tk_pval *top(rd *r) {
    if (r->sp <= floor_sp(r)) {
        fail(r, "the stack is empty here");
        return NULL;
    }
    return r->stack[r->sp - 1];
}

/* Pops to the last MARK; *from is the first index above it. */
static int pop_mark(rd *r, size_t *from) {
    if (!r->nmarks) return fail(r, "no MARK before this opcode");
    *from = r->marks[--r->nmarks];
    return 0;
}

static int str_node(rd *r, tk_pval_kind k, size_t n) {
    if (need(r, n) || charge(r, n + 1)) return -1;
    tk_pval *v = node(r, k);
    char *s = v ? buf_get(r, n + 1) : NULL;
    if (v && !s) return fail_nomem(r);
    if (!v) return -1;
    memcpy(s, r->buf + r->pos, n);
    s[n] = 0;
    v->s = s;
    v->n = n;
    r->pos += n;
    return push(r, v);
}

static int int_node(rd *r, int64_t x) {
    tk_pval *v = node(r, TK_PV_INT);
    if (!v) return -1;
    v->i = x;
    return push(r, v);
}

static int global_node(rd *r, const char *module, size_t mn, const char *name, size_t nn) {
    char full[512];
    if (mn + nn + 2 > sizeof full) return fail(r, "global name too long");
    memcpy(full, module, mn);
    full[mn] = '.';
    memcpy(full + mn + 1, name, nn);
    full[mn + 1 + nn] = 0;
    int ok = 0;
    for (const char *const *g = r->opts ? r->opts->allowed_globals : NULL; g && *g && !ok; g++)
        ok = fnmatch(*g, full, 0) == 0;
    if (!ok || memchr(full, 0, mn + nn + 1)) {
        char msg[640];
        snprintf(msg, sizeof msg, "global '%.500s' is not allowed (nothing is imported or called)", full);
        return fail(r, msg);
    }
    if (charge(r, mn + nn + 2)) return -1;
    tk_pval *v = node(r, TK_PV_GLOBAL);
    char *s = v ? tk_strdup(full) : NULL;
    if (v && !s) return fail_nomem(r);
    if (!v) return -1;
    v->s = s;
    v->n = mn + nn + 1;
    return push(r, v);
}

static int bit(const uint8_t *b, size_t n, size_t i) { return i < n && (b[i >> 3] >> (i & 7)) & 1; }

static struct kept *kept_slot(rd *r, size_t idx) {
    size_t h = (idx * (size_t)0x9E3779B97F4A7C15ull) & (r->kt_cap - 1);
    while (r->kt[h].v && r->kt[h].idx != idx) h = (h + 1) & (r->kt_cap - 1);
    return &r->kt[h];
}

/* Streaming memo: only an index the file fetches is stored (its node kept
 * for good); MEMOIZE's index still counts every index set, as Python does. */
static int memo_put_streamed(rd *r, size_t idx) {
    tk_pval *v = top(r);
    if (!v) return -1;
    if (idx >= r->len) return fail(r, "memo index larger than the file");
    if (idx >= r->set_n * 8) {
        size_t n = r->set_n ? r->set_n * 2 : 1024;
        while (n * 8 <= idx) n *= 2;
        uint8_t *b = tk_realloc(r->set_bits, n);
        if (!b) return fail_nomem(r);
        memset(b + r->set_n, 0, n - r->set_n);
        r->set_bits = b;
        r->set_n = n;
    }
    if (!bit(r->set_bits, r->set_n * 8, idx)) r->memo_count++;
    r->set_bits[idx >> 3] |= (uint8_t)(1u << (idx & 7));
    if (!bit(r->fetched, r->fetched_bits, idx)) return 0;
    struct kept *k = kept_slot(r, idx);
    k->idx = idx;
    k->v = v;
    v->kept = 1;
    return 0;
}

static int memo_put(rd *r, size_t idx) {
    if (r->opts && r->opts->on_item) return memo_put_streamed(r, idx);
    tk_pval *v = top(r);
    if (!v) return -1;
    /* Each memo entry needs at least one opcode byte, so an index past the
     * input's size is a forged one: refusing it keeps the memo O(input). */
    if (idx >= r->len) return fail(r, "memo index larger than the file");
    if (idx >= r->memo_n) {
        size_t n = r->memo_n ? r->memo_n : 64;
        while (n <= idx) n *= 2;
        if (n > r->len) n = r->len;
        if (charge(r, (n - r->memo_n) * sizeof(tk_pval *))) return -1;
        tk_pval **m = tk_realloc(r->memo, n * sizeof *m);
        if (!m) return fail_nomem(r);
        memset(m + r->memo_n, 0, (n - r->memo_n) * sizeof *m);
        r->memo = m;
        r->memo_n = n;
    }
    if (!r->memo[idx]) r->memo_count++;
    r->memo[idx] = v;
    return 0;
}

static int memo_get(rd *r, size_t idx) {
    if (r->opts && r->opts->on_item) {
        struct kept *k = r->kt_cap ? kept_slot(r, idx) : NULL;
        if (!k || !k->v) return fail(r, "memo index not set");
        return push(r, k->v);
    }
    if (idx >= r->memo_n || !r->memo[idx]) return fail(r, "memo index not set");
    return push(r, r->memo[idx]);
}

/* Streaming: an appended dict holding the stream key goes to on_item and
 * is freed; 1 when it was, 0 when it is an ordinary item, -1 on error. */
static int streamed(rd *r, tk_pval *list, tk_pval *item) {
    const tk_pickle_opts *o = r->opts;
    if (!o || !o->on_item || item->kind != TK_PV_DICT || !tk_pval_get(item, o->stream_key)) return 0;
    if (o->on_item(o->item_ctx, list, item, r->err)) return -1;
    free_item(r, item, 0); /* a no-op when the memo keeps it */
    return 1;
}

/* First pass: which memo indices BINGET / LONG_BINGET fetch. Stops quietly
 * at anything it cannot step over; the second pass reports it. */
static int memo_scan(rd *r) {
    size_t pos = 0, n = 0;
    const uint8_t *b = r->buf;
    for (;;) {
        if (pos >= r->len) break;
        uint8_t op = b[pos++];
        size_t left = r->len - pos, arg = 0, idx = (size_t)-1;
        switch (op) {
        case 0x80: case 'K': case 'q': arg = 1; break;
        case 'M': arg = 2; break;
        case 'J': case 'r': arg = 4; break;
        case 0x95: case 'G': arg = 8; break;
        case 'h': if (left >= 1) idx = b[pos]; arg = 1; break;
        case 'j': if (left >= 4) idx = (size_t)le(b + pos, 4); arg = 4; break;
        case 0x8c: case 'C': case 0x8a: if (left >= 1) arg = 1 + (size_t)b[pos]; else arg = 1; break;
        case 'X': case 'B': if (left >= 4) arg = 4 + (size_t)le(b + pos, 4); else arg = 4; break;
        case 0x8d: case 0x8e: {
            uint64_t m = left >= 8 ? le(b + pos, 8) : 0;
            if (m > left) goto out;
            arg = 8 + (size_t)m;
            break;
        }
        case 'c': {
            const uint8_t *nl1 = memchr(b + pos, '\n', left);
            const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(b + r->len - nl1 - 1)) : NULL;
            if (!nl2) goto out;
            arg = (size_t)(nl2 + 1 - (b + pos));
            break;
        }
        case '.': goto out;
        case '}': case ']': case ')': case '(': case 's': case 'u': case 'a': case 'e': case 'N': case 0x88:
        case 0x89: case 't': case 0x85: case 0x86: case 0x87: case 0x94: case '0': case '1': case '2': case 0x93:
        case 'R': case 'b': case 'Q': break;
        default: goto out;
        }
        if (arg > left) goto out;
        pos += arg;
        if (idx != (size_t)-1 && idx < r->len) {
            if (idx >= r->fetched_bits) {
                size_t nb = r->fetched_bits ? r->fetched_bits * 2 : 8192;
                while (nb <= idx) nb *= 2;
                uint8_t *f = tk_realloc(r->fetched, nb / 8);
                if (!f) return fail_nomem(r);
                memset(f + r->fetched_bits / 8, 0, (nb - r->fetched_bits) / 8);
                r->fetched = f;
                r->fetched_bits = nb;
            }
            if (!bit(r->fetched, r->fetched_bits, idx)) n++;
            r->fetched[idx >> 3] |= (uint8_t)(1u << (idx & 7));
        }
        if (r->release && pos - r->released >= RELEASE_STEP) {
            size_t upto = pos & ~(RELEASE_STEP - 1);
            madvise((void *)(b + r->released), upto - r->released, MADV_DONTNEED);
            r->released = upto;
        }
    }
out:;
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    if (n && !(r->kt = tk_calloc(cap, sizeof *r->kt))) return fail_nomem(r);
    if (n) r->kt_cap = cap;
    return 0;
}

/* A container that SETITEM(S) may fill: a dict, or a REDUCE result (items
 * past the first three, as in OrderedDict's pickle). */
static int is_mapping(const tk_pval *v) { return v->kind == TK_PV_DICT || v->kind == TK_PV_REDUCE; }
static int is_sequence(const tk_pval *v) { return v->kind == TK_PV_LIST || v->kind == TK_PV_REDUCE; }

static int tuple_of(rd *r, size_t from) {
    tk_pval *t = node(r, TK_PV_TUPLE);
    if (!t) return -1;
    for (size_t i = from; i < r->sp; i++)
        if (add_item(r, t, r->stack[i])) return -1;
    r->sp = from;
    return push(r, t);
}

static int step(rd *r, int *done) {
    r->op_pos = r->pos;
    if (r->pos >= r->len) {
        r->op = 0;
        tk_err_set(r->err, TK_EFORMAT, "%s: byte %zu: the file ends before STOP (truncated?)", r->name, r->pos);
        return -1;
    }
    r->op = r->buf[r->pos++];
    const uint8_t *a = r->buf + r->pos;
    size_t from = 0;
    tk_pval *v, *c;
    switch (r->op) {
    case 0x80: /* PROTO */
        if (need(r, 1)) return -1;
        r->pos++;
        if (a[0] < 2 || a[0] > 5) return fail(r, "only pickle protocols 2 to 5 are read");
        return 0;
    case 0x95: /* FRAME: a length hint only */
        if (need(r, 8)) return -1;
        r->pos += 8;
        return 0;
    case '.':
        v = pop(r);
        if (!v) return -1;
        if (r->sp || r->nmarks) return fail(r, "values left on the stack at STOP");
        r->p->root = v;
        r->p->read = r->pos;
        *done = 1;
        return 0;
    case '}': return push(r, node(r, TK_PV_DICT));
    case ']': return push(r, node(r, TK_PV_LIST));
    case ')': return push(r, node(r, TK_PV_TUPLE));
    case 'N': return push(r, node(r, TK_PV_NONE));
    case 0x88: case 0x89:
        v = node(r, TK_PV_BOOL);
        if (!v) return -1;
        v->i = r->op == 0x88;
        return push(r, v);
    case '(':
        if (r->nmarks == r->mcap) {
            size_t cap = r->mcap ? r->mcap * 2 : 16;
            if (charge(r, (cap - r->mcap) * sizeof(size_t))) return -1;
            size_t *m = tk_realloc(r->marks, cap * sizeof *m);
            if (!m) return fail_nomem(r);
            r->marks = m;
            r->mcap = cap;
        }
        r->marks[r->nmarks++] = r->sp;
        return 0;
    case 's':
        if (r->sp < floor_sp(r) + 3) return fail(r, "SETITEM needs a mapping, a key and a value");
        c = r->stack[r->sp - 3];
        if (!is_mapping(c)) return fail(r, "SETITEM on something that is not a dict");
        if (add_item(r, c, r->stack[r->sp - 2]) || add_item(r, c, r->stack[r->sp - 1])) return -1;
        r->sp -= 2;
        return 0;
    case 'u':
        if (pop_mark(r, &from)) return -1;
        if (from <= floor_sp(r) || !is_mapping(r->stack[from - 1])) return fail(r, "SETITEMS without a dict below the MARK");
        if ((r->sp - from) % 2) return fail(r, "SETITEMS with an odd number of values");
        for (size_t i = from; i < r->sp; i++)
            if (add_item(r, r->stack[from - 1], r->stack[i])) return -1;
        r->sp = from;
        return 0;
    case 'a':
        if (r->sp < floor_sp(r) + 2) return fail(r, "APPEND needs a list and a value");
        c = r->stack[r->sp - 2];
        if (!is_sequence(c)) return fail(r, "APPEND to something that is not a list");
        int st = streamed(r, c, r->stack[r->sp - 1]);
        if (st < 0 || (!st && add_item(r, c, r->stack[r->sp - 1]))) return -1;
        r->sp--;
        return 0;
    case 'e':
        if (pop_mark(r, &from)) return -1;
        if (from <= floor_sp(r) || !is_sequence(r->stack[from - 1])) return fail(r, "APPENDS without a list below the MARK");
        for (size_t i = from; i < r->sp; i++) {
            int st = streamed(r, r->stack[from - 1], r->stack[i]);
            if (st < 0 || (!st && add_item(r, r->stack[from - 1], r->stack[i]))) return -1;
        }
        r->sp = from;
        return 0;
    case 0x8c: if (need(r, 1)) return -1; r->pos += 1; return str_node(r, TK_PV_STR, a[0]);
    case 'C': if (need(r, 1)) return -1; r->pos += 1; return str_node(r, TK_PV_BYTES, a[0]);
    case 'X': case 'B':
        if (need(r, 4)) return -1;
        r->pos += 4;
        return str_node(r, r->op == 'X' ? TK_PV_STR : TK_PV_BYTES, (size_t)le(a, 4));
    case 0x8d: case 0x8e: {
        if (need(r, 8)) return -1;
        uint64_t n = le(a, 8);
        r->pos += 8;
        if (n > r->len - r->pos) return fail(r, "length field larger than the rest of the file");
        return str_node(r, r->op == 0x8d ? TK_PV_STR : TK_PV_BYTES, (size_t)n);
    }
    case 'J': if (need(r, 4)) return -1; r->pos += 4; return int_node(r, (int32_t)(uint32_t)le(a, 4));
    case 'K': if (need(r, 1)) return -1; r->pos += 1; return int_node(r, a[0]);
    case 'M': if (need(r, 2)) return -1; r->pos += 2; return int_node(r, (int64_t)le(a, 2));
    case 0x8a: { /* LONG1: n bytes, little-endian two's complement */
        if (need(r, 1)) return -1;
        size_t n = a[0];
        r->pos++;
        if (need(r, n)) return -1;
        const uint8_t *b = r->buf + r->pos;
        r->pos += n;
        /* Wider than 8 bytes is fine when the extra bytes only extend the sign. */
        size_t keep = n > 8 ? 8 : n;
        for (size_t i = 8; i < n; i++)
            if (b[i] != ((b[7] & 0x80) ? 0xff : 0)) return fail(r, "integer wider than 64 bits");
        uint64_t x = le(b, (int)keep);
        if (keep && keep < 8 && (b[keep - 1] & 0x80)) x |= ~0ull << (8 * keep);
        return int_node(r, (int64_t)x);
    }
    case 'G': {
        if (need(r, 8)) return -1;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = (bits << 8) | a[i];
        r->pos += 8;
        v = node(r, TK_PV_FLOAT);
        if (!v) return -1;
        memcpy(&v->f, &bits, sizeof v->f);
        return push(r, v);
    }
    case 't':
        if (pop_mark(r, &from)) return -1;
        return tuple_of(r, from);
    case 0x85: case 0x86: case 0x87: {
        size_t k = (size_t)(r->op - 0x84);
        if (r->sp < floor_sp(r) + k) return fail(r, "not enough values on the stack for this tuple");
        return tuple_of(r, r->sp - k);
    }
    case 0x94: return memo_put(r, r->memo_count);
    case 'q': if (need(r, 1)) return -1; r->pos += 1; return memo_put(r, a[0]);
    case 'r': if (need(r, 4)) return -1; r->pos += 4; return memo_put(r, (size_t)le(a, 4));
    case 'h': if (need(r, 1)) return -1; r->pos += 1; return memo_get(r, a[0]);
    case 'j': if (need(r, 4)) return -1; r->pos += 4; return memo_get(r, (size_t)le(a, 4));
    case '0': return pop(r) ? 0 : -1;
    case '1':
        if (pop_mark(r, &from)) return -1;
        r->sp = from;
        return 0;
    case '2':
        v = top(r);
        if (v) v->kept = 1; /* two references now: never freed as a streamed item's */
        return v ? push(r, v) : -1;
    case 'c': { /* GLOBAL: "module\nname\n" */
        const uint8_t *nl1 = memchr(a, '\n', r->len - r->pos);
        const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(r->buf + r->len - nl1 - 1)) : NULL;
        if (!nl2) return fail(r, "the file ends inside the global's name (truncated?)");
        r->pos = (size_t)(nl2 + 1 - r->buf);
        return global_node(r, (const char *)a, (size_t)(nl1 - a), (const char *)nl1 + 1, (size_t)(nl2 - nl1 - 1));
    }
    case 0x93: { /* STACK_GLOBAL: module and name are the two strings on the stack */
        if (r->sp < floor_sp(r) + 2) return fail(r, "STACK_GLOBAL needs a module and a name");
        tk_pval *m = r->stack[r->sp - 2], *n = r->stack[r->sp - 1];
        if (m->kind != TK_PV_STR || n->kind != TK_PV_STR) return fail(r, "STACK_GLOBAL needs two strings");
        r->sp -= 2;
        return global_node(r, m->s, m->n, n->s, n->n);
    }
    case 'R': { /* REDUCE: only ever on an allowed global, and only recorded */
        if (r->sp < floor_sp(r) + 2) return fail(r, "REDUCE needs a callable and its arguments");
        tk_pval *f = r->stack[r->sp - 2], *args = r->stack[r->sp - 1];
        if (f->kind != TK_PV_GLOBAL) return fail(r, "REDUCE of something that is not an allowed global");
        if (args->kind != TK_PV_TUPLE) return fail(r, "REDUCE's arguments are not a tuple");
        r->sp -= 2;
        v = node(r, TK_PV_REDUCE);
        if (!v || add_item(r, v, f) || add_item(r, v, args) || add_item(r, v, NULL)) return -1;
        return push(r, v);
    }
    case 'b': { /* BUILD: the state is kept beside the object, never applied */
        if (r->sp < floor_sp(r) + 2) return fail(r, "BUILD needs an object and its state");
        tk_pval *o = r->stack[r->sp - 2], *st = r->stack[r->sp - 1];
        if (o->kind != TK_PV_REDUCE) return fail(r, "BUILD on something that is not the result of an allowed REDUCE");
        o->items[2] = st;
        r->sp--;
        return 0;
    }
    case 'Q': {
        if (!r->opts || !r->opts->allow_persid) return fail(r, "persistent ids are not allowed here");
        tk_pval *id = pop(r);
        v = id ? node(r, TK_PV_PERSID) : NULL;
        if (!v || add_item(r, v, id)) return -1;
        return push(r, v);
    }
    default: break;
    }
    return fail(r, "opcode not supported by this reader");
}

static tk_pickle *load(const uint8_t *buf, size_t len, const tk_pickle_opts *opts, int release, tk_err *err) {
    rd r = {0};
    r.release = release;
    r.buf = buf;
    r.len = len;
    r.opts = opts;
    r.name = opts && opts->name ? opts->name : "pickle";
    r.max_bytes = opts && opts->max_bytes ? opts->max_bytes : (size_t)1 << 30;
    r.err = err;
    r.p = tk_calloc(1, sizeof *r.p);
    if (!r.p) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", r.name);
        return NULL;
    }
    int done = 0;
    if (opts && opts->on_item) {
        if (memo_scan(&r)) done = -1;
        r.released = 0;
    }
    while (!done) {
        if (step(&r, &done)) break;
        if (r.release && r.pos - r.released >= RELEASE_STEP) {
            size_t upto = r.op_pos & ~(RELEASE_STEP - 1);
            if (upto > r.released) {
                madvise((void *)(r.buf + r.released), upto - r.released, MADV_DONTNEED);
                r.released = upto;
            }
        }
    }
    free(r.stack);
    free(r.marks);
    free(r.memo);
    free(r.fetched);
    free(r.set_bits);
    free(r.kt);
    if (done != 1) tk_pickle_destroy(&r.p);
    return r.p;
}

tk_pickle *tk_pickle_load(const uint8_t *buf, size_t len, const tk_pickle_opts *opts, tk_err *err) {
    return load(buf, len, opts, 0, err);
}

tk_pickle *tk_pickle_load_file(const char *path, const tk_pickle_opts *opts, tk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        tk_err_set(err, TK_EIO, "%s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *m = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && m == MAP_FAILED) {
        tk_err_set(err, TK_EIO, "%s: could not map the file: %s", path, strerror(errno));
        return NULL;
    }
    madvise(m, len, MADV_SEQUENTIAL);
    tk_pickle *p = load(len ? m : (const uint8_t *)"", len, opts, 1, err);
    if (len) munmap(m, len);
    return p;
}

void tk_pickle_destroy(tk_pickle **pp) {
    if (!pp || !*pp) return;
    for (tk_pval *v = (*pp)->spare, *next; v; v = next) {
        next = v->next_node;
        free(v);
    }
    for (int c = 0; c < POOL_CLASSES; c++)
        for (void *b = (*pp)->spare_buf[c], *next; b; b = next) {
            memcpy(&next, b, sizeof next);
            free(b);
        }
    for (tk_pval *v = (*pp)->nodes, *next; v; v = next) {
        next = v->next_node;
        free(v->items);
        free((char *)v->s);
        free(v);
    }
    free(*pp);
    *pp = NULL;
}

size_t tk_pickle_used(const tk_pickle *p) { return p ? p->read : 0; }

const tk_pval *tk_pickle_root(const tk_pickle *p) { return p ? p->root : NULL; }

const tk_pval *tk_pval_get(const tk_pval *d, const char *key) {
    if (!d || d->kind != TK_PV_DICT) return NULL;
    for (size_t i = 0; i + 1 < d->n; i += 2)
        if (d->items[i]->kind == TK_PV_STR && !strcmp(d->items[i]->s, key)) return d->items[i + 1];
    return NULL;
}

int tk_pval_is(const tk_pval *v, tk_pval_kind k) { return v && v->kind == k; }

int tk_pval_int(const tk_pval *v, int64_t *out) {
    if (!v || (v->kind != TK_PV_INT && v->kind != TK_PV_BOOL)) return -1;
    *out = v->i;
    return 0;
}

const char *tk_pval_str(const tk_pval *v) { return v && v->kind == TK_PV_STR ? v->s : NULL; }

const char *tk_pval_kind_name(tk_pval_kind k) {
    static const char *const N[] = {"None", "bool", "int", "float", "str", "bytes", "list",
                                    "tuple", "dict", "global", "reduce", "persistent id"};
    return (unsigned)k < sizeof N / sizeof N[0] ? N[k] : "?";
}

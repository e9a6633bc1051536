/* pickle.c — the restricted pickle reader of tk_pickle.h.
 *
 * A stack machine like Python's Unpickler, but its only effects are building
 * value nodes: no opcode looks anything up or calls anything. Every length
 * is checked against the bytes left before it is used, every node is
 * charged against the memory cap, and every node sits on one list so
 * destroy frees shared and cyclic trees in one pass.
 */
#include "tk_pickle.h"
#include "tk_host_mem.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tk_pickle {
    size_t read;      /* bytes read, STOP included */
    tk_pval *nodes;   /* every node, newest first */
    tk_pval *root;
    size_t used;      /* bytes charged against max_bytes */
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

static int charge(rd *r, size_t n) {
    if (n > r->max_bytes || r->p->used > r->max_bytes - n) return fail(r, "the values would exceed the reader's memory cap");
    r->p->used += n;
    return 0;
}

static tk_pval *node(rd *r, tk_pval_kind k) {
    if (charge(r, sizeof(tk_pval))) return NULL;
    tk_pval *v = tk_calloc(1, sizeof *v);
    if (!v) {
        fail_nomem(r);
        return NULL;
    }
    v->kind = k;
    v->next_node = r->p->nodes;
    r->p->nodes = v;
    return v;
}

/* Appends x to v's items, growing by doubling (charged). */
static int add_item(rd *r, tk_pval *v, tk_pval *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        if (charge(r, (cap - v->cap) * sizeof(tk_pval *))) return -1;
        tk_pval **it = tk_realloc(v->items, cap * sizeof *it);
        if (!it) return fail_nomem(r);
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
    char *s = v ? tk_malloc(n + 1) : NULL;
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

static int memo_put(rd *r, size_t idx) {
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
    if (idx >= r->memo_n || !r->memo[idx]) return fail(r, "memo index not set");
    return push(r, r->memo[idx]);
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
        if (add_item(r, c, r->stack[r->sp - 1])) return -1;
        r->sp--;
        return 0;
    case 'e':
        if (pop_mark(r, &from)) return -1;
        if (from <= floor_sp(r) || !is_sequence(r->stack[from - 1])) return fail(r, "APPENDS without a list below the MARK");
        for (size_t i = from; i < r->sp; i++)
            if (add_item(r, r->stack[from - 1], r->stack[i])) return -1;
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

tk_pickle *tk_pickle_load(const uint8_t *buf, size_t len, const tk_pickle_opts *opts, tk_err *err) {
    rd r = {0};
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
    while (!done)
        if (step(&r, &done)) break;
    free(r.stack);
    free(r.marks);
    free(r.memo);
    if (!done) tk_pickle_destroy(&r.p);
    return r.p;
}

void tk_pickle_destroy(tk_pickle **pp) {
    if (!pp || !*pp) return;
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

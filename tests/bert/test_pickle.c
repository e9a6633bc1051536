/* test_pickle.c — the restricted pickle reader: builtin values, the memo and
 * cycles, an allow-listed state-dict shape (OrderedDict, _rebuild_tensor_v2,
 * a persistent id naming torch.FloatStorage) recorded but never called,
 * refusals that name the byte and the opcode or global, the memory cap,
 * forged lengths and memo indices, every truncation of a valid pickle, and
 * streamed items (a trace's events) handed over and freed around the memo. */
#include "tk_pickle.h"
#include "tk_test.h"

#define P(s) (const uint8_t *)(s), sizeof(s) - 1

static tk_pickle *load(const uint8_t *b, size_t n, const tk_pickle_opts *o, tk_err *e) {
    return tk_pickle_load(b, n, o, e);
}

/* {'a': 1, 'b': [-1, -32768, 1.5, True, None, False, 'é']} as protocol 2 writes it. */
static const char BUILTIN[] = "\x80\x02}q\x00(X\x01\x00\x00\x00" "aK\x01X\x01\x00\x00\x00" "b]q\x01(J\xff\xff\xff\xff"
                              "\x8a\x02\x00\x80G?\xf8\x00\x00\x00\x00\x00\x00\x88N\x89\x8c\x02\xc3\xa9" "eu.";

static void test_builtin_values(void) {
    tk_err e = {0};
    tk_pickle *p = load(P(BUILTIN), NULL, &e);
    TK_CHECK_MSG(p != NULL, "%s", e.msg);
    const tk_pval *r = tk_pickle_root(p);
    int64_t x = 0;
    TK_CHECK(tk_pval_is(r, TK_PV_DICT) && r->n == 4);
    TK_CHECK(tk_pval_int(tk_pval_get(r, "a"), &x) == 0 && x == 1);
    const tk_pval *b = tk_pval_get(r, "b");
    TK_CHECK(tk_pval_is(b, TK_PV_LIST) && b && b->n == 7);
    if (b && b->n == 7) {
        TK_CHECK(tk_pval_int(b->items[0], &x) == 0 && x == -1);
        TK_CHECK(tk_pval_int(b->items[1], &x) == 0 && x == -32768);
        TK_CHECK(b->items[2]->kind == TK_PV_FLOAT && b->items[2]->f == 1.5);
        TK_CHECK(b->items[3]->kind == TK_PV_BOOL && b->items[3]->i == 1);
        TK_CHECK(b->items[4]->kind == TK_PV_NONE);
        TK_CHECK(b->items[5]->kind == TK_PV_BOOL && b->items[5]->i == 0);
        TK_CHECK_STR(tk_pval_str(b->items[6]), "\xc3\xa9");
    }
    TK_CHECK(tk_pval_get(r, "missing") == NULL);
    tk_pickle_destroy(&p);
    TK_CHECK(p == NULL);
    tk_pickle_destroy(&p);
}

static void test_memo_shares_and_cycles_free(void) {
    tk_err e = {0};
    /* [d, d] with d = {} memoized; then a list that holds itself */
    tk_pickle *p = load(P("\x80\x04](}\x94h\x00" "e."), NULL, &e);
    TK_CHECK_MSG(p != NULL, "%s", e.msg);
    const tk_pval *r = tk_pickle_root(p);
    TK_CHECK(r && r->n == 2 && r->items[0] == r->items[1]);
    tk_pickle_destroy(&p);
    p = load(P("\x80\x02]q\x00h\x00" "a."), NULL, &e); /* LeakSanitizer checks the cycle is freed */
    r = tk_pickle_root(p);
    TK_CHECK(r && r->n == 1 && r->items[0] == r);
    tk_pickle_destroy(&p);
}

/* OrderedDict({'w': _rebuild_tensor_v2(persid('storage', FloatStorage, '0', 'cpu', 6), 0, (2, 3), (3, 1), False,
 * OrderedDict())}) in the shape torch.save's data.pkl has. */
static const char STATE[] =
    "\x80\x02" "ccollections\nOrderedDict\nq\x00)R" "(X\x01\x00\x00\x00w"
    "ctorch._utils\n_rebuild_tensor_v2\n"
    "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x06tQ"
    "K\x00K\x02K\x03\x86K\x03K\x01\x86\x89h\x00)RtR" "u.";

static void test_allowed_globals_are_recorded_not_called(void) {
    static const char *const allowed[] = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                                          "torch.*Storage", NULL};
    tk_pickle_opts o = {.name = "data.pkl", .allowed_globals = allowed, .allow_persid = 1};
    tk_err e = {0};
    tk_pickle *p = load(P(STATE), &o, &e);
    TK_CHECK_MSG(p != NULL, "%s", e.msg);
    const tk_pval *r = tk_pickle_root(p);
    TK_CHECK(tk_pval_is(r, TK_PV_REDUCE) && r->n == 5);
    if (r && r->n == 5) {
        TK_CHECK_STR(r->items[0]->s, "collections.OrderedDict");
        TK_CHECK_STR(tk_pval_str(r->items[3]), "w");
        const tk_pval *t = r->items[4];
        TK_CHECK(t->kind == TK_PV_REDUCE && !strcmp(t->items[0]->s, "torch._utils._rebuild_tensor_v2"));
        const tk_pval *args = t->items[1];
        TK_CHECK(args->kind == TK_PV_TUPLE && args->n == 6 && args->items[0]->kind == TK_PV_PERSID);
        const tk_pval *id = args->items[0]->items[0];
        TK_CHECK(id->kind == TK_PV_TUPLE && id->n == 5 && id->items[1]->kind == TK_PV_GLOBAL);
        TK_CHECK_STR(id->items[1]->s, "torch.FloatStorage");
        TK_CHECK(args->items[2]->kind == TK_PV_TUPLE && args->items[2]->n == 2);
    }
    tk_pickle_destroy(&p);

    /* the same bytes with no allow-list, and without persistent ids */
    o.allowed_globals = NULL;
    TK_CHECK(load(P(STATE), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "data.pkl: byte 2: GLOBAL (0x63): global 'collections.OrderedDict' is not allowed"),
                 "%s", e.msg);
    o.allowed_globals = allowed;
    o.allow_persid = 0;
    TK_CHECK(load(P(STATE), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "BINPERSID (0x51): persistent ids are not allowed"), "%s", e.msg);
}

static void test_refusals_name_byte_and_opcode(void) {
    tk_pickle_opts o = {.name = "snap.pickle"};
    tk_err e = {0};
    TK_CHECK(load(P("\x80\x04\x8c\x02os\x8c\x06system\x93N\x85R."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "snap.pickle: byte 14: STACK_GLOBAL (0x93): global 'os.system'"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x02N)R."), &o, &e) == NULL); /* REDUCE of a non-global: nothing to call */
    TK_CHECK_MSG(strstr(e.msg, "byte 4: REDUCE"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x02\x81."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "byte 2: NEWOBJ (0x81): opcode not supported"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x06N."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "protocols 2 to 5"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x02NN."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "left on the stack"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x02" "a."), &o, &e) == NULL);
    TK_CHECK(load(P("\x80\x02(u."), &o, &e) == NULL);
    TK_CHECK(load(P("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "wider than 64 bits"), "%s", e.msg);
}

static void test_lengths_and_memo_are_bounded(void) {
    tk_pickle_opts o = {.name = "x.pickle"};
    tk_err e = {0};
    /* 2 GiB lengths in a 20-byte file: refused before any allocation */
    TK_CHECK(load(P("\x80\x04\x8d\x00\x00\x00\x80\x00\x00\x00\x00" "abc."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "byte 2: BINUNICODE8 (0x8d): length field larger than the rest"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x04X\x00\x00\x00\x80" "abc."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "byte 2: BINUNICODE (0x58)"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x04Nr\xff\xff\xff\x7f."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "memo index larger than the file"), "%s", e.msg);
    TK_CHECK(load(P("\x80\x04h\x05."), &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "memo index not set"), "%s", e.msg);
    /* the cap: 300 Nones in a list need more than 4 KiB of nodes */
    char big[400];
    size_t n = 0;
    memcpy(big, "\x80\x04](", 4);
    n = 4;
    for (int i = 0; i < 300; i++) big[n++] = 'N';
    big[n++] = 'e';
    big[n++] = '.';
    o.max_bytes = 4096;
    TK_CHECK(load((const uint8_t *)big, n, &o, &e) == NULL);
    TK_CHECK_MSG(strstr(e.msg, "memory cap"), "%s", e.msg);
    o.max_bytes = 0;
    tk_pickle *p = load((const uint8_t *)big, n, &o, &e);
    TK_CHECK(p && tk_pickle_root(p)->n == 300);
    tk_pickle_destroy(&p);
}

static void test_every_truncation_fails_cleanly(void) {
    tk_err e = {0};
    const uint8_t *b = (const uint8_t *)BUILTIN;
    for (size_t n = 0; n + 1 < sizeof BUILTIN - 1; n++) {
        tk_pickle_opts o = {.name = "cut.pickle"};
        tk_pickle *p = load(b, n, &o, &e);
        TK_CHECK_MSG(p == NULL && strstr(e.msg, "cut.pickle: byte "), "prefix %zu: %s", n, e.msg);
        tk_pickle_destroy(&p);
    }
}

/* {'segments': [], 'device_traces': [[e1, e2], []]} with e1 and e2 trace
 * events sharing one memoized frames list, as Python writes it (protocol 4). */
static const char TRACE[] =
    "\x80\x04\x95\x80\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94(]"
    "\x94(}\x94(\x8c\x06" "action\x94\x8c\x05" "alloc\x94\x8c\x04size\x94K\x01\x8c\x06" "frames\x94]\x94}\x94\x8c\x08"
    "filename\x94\x8c\x04" "a.py\x94sau}\x94(h\x07\x8c\x04" "free\x94h\tK\x02h\nh\x0bue]\x94" "eu.";

typedef struct seen { int n; const tk_pval *list, *frames[2]; int64_t size[2]; } seen;

static int on_item(void *ctx, const tk_pval *list, const tk_pval *item, tk_err *err) {
    seen *s = ctx;
    if (s->n < 2) {
        s->list = list;
        s->frames[s->n] = tk_pval_get(item, "frames");
        tk_pval_int(tk_pval_get(item, "size"), &s->size[s->n]);
    }
    s->n++;
    return 0;
}

static void test_streamed_items_are_handed_over_and_freed(void) {
    tk_err e = {0};
    seen sn = {0};
    tk_pickle_opts o = {.name = "trace.pickle", .stream_key = "action", .on_item = on_item, .item_ctx = &sn};
    tk_pickle *p = load(P(TRACE), &o, &e);
    TK_CHECK_MSG(p != NULL, "%s", e.msg);
    const tk_pval *tr = tk_pval_get(tk_pickle_root(p), "device_traces");
    /* both events seen in order; the memo's shared frames list kept for the second */
    TK_CHECK(sn.n == 2 && sn.size[0] == 1 && sn.size[1] == 2);
    TK_CHECK(sn.frames[0] && sn.frames[0] == sn.frames[1] && sn.frames[0]->n == 1);
    /* the lists stay, without the streamed events */
    TK_CHECK(tr && tr->n == 2 && tr->items[0] == sn.list && tr->items[0]->n == 0 && tr->items[1]->n == 0);
    tk_pickle_destroy(&p);
    /* every truncation of it fails cleanly while streaming too (ASan: nothing freed twice or leaked) */
    for (size_t n = 0; n + 1 < sizeof TRACE - 1; n++) {
        seen s2 = {0};
        o.item_ctx = &s2;
        tk_err e2 = {0};
        tk_pickle *q = load((const uint8_t *)TRACE, n, &o, &e2);
        TK_CHECK_MSG(q == NULL && e2.msg[0], "prefix %zu", n);
        tk_pickle_destroy(&q);
    }
}

int main(void) {
    TK_RUN(test_builtin_values);
    TK_RUN(test_memo_shares_and_cycles_free);
    TK_RUN(test_allowed_globals_are_recorded_not_called);
    TK_RUN(test_refusals_name_byte_and_opcode);
    TK_RUN(test_lengths_and_memo_are_bounded);
    TK_RUN(test_every_truncation_fails_cleanly);
    TK_RUN(test_streamed_items_are_handed_over_and_freed);
    return tk_test_done();
}

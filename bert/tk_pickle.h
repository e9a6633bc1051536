/* tk_pickle.h — a restricted pickle reader (protocols 2-5 as PyTorch and
 * Python write them) that builds a tree of plain values and never executes
 * anything.
 *
 * What it reads: None, bools, ints (up to 64 bits), floats, str, bytes,
 * lists, tuples, dicts, the memo, MARK-based opcodes and FRAME. Globals
 * (GLOBAL, STACK_GLOBAL) are refused unless the caller names them in
 * tk_pickle_opts.allowed_globals; an allowed global is a TK_PV_GLOBAL node
 * holding its name, REDUCE on it a TK_PV_REDUCE node holding the callable
 * and its argument tuple, BUILD stores the state in that node, and
 * BINPERSID (when allow_persid) a TK_PV_PERSID node: the caller interprets
 * them, nothing is called. Any other opcode is refused.
 *
 * Guarantees: every error names the input (opts.name), the byte offset of the
 * opcode and the opcode (or the global); a length field is checked against
 * the bytes that remain before anything is allocated, memo indices are
 * bounded by the input size, and the whole tree's memory is capped by
 * opts.max_bytes (default 1 GiB), so a small file never makes a large
 * allocation. Values may be shared (the memo) and even cyclic (a list that
 * holds itself): consumers walk a known shape, never recurse blindly.
 *
 * Streaming (opts.on_item): a dict holding the key opts.stream_key that is
 * appended to a list is handed to on_item as soon as it is complete, then
 * freed instead of kept (the list does not hold it), so a file of millions
 * of such records (a memory snapshot's trace events) is read in memory that
 * follows what is kept, not the file. A first pass over the opcodes finds
 * which memo entries the file ever fetches; only those are kept (and never
 * freed), so records may share values through the memo as Python writes
 * them. tk_pickle_load_file reads a file through a read-only mapping and
 * gives back the pages it has read, so the file's size does not add to the
 * resident memory either.
 *
 * Ownership: tk_pickle_load returns a new tk_pickle (free with
 * tk_pickle_destroy, which frees every value without recursion); values are
 * borrowed from it and live as long as it does (an item given to on_item
 * only for that call). The input is borrowed for the call.
 */
#ifndef TK_PICKLE_H
#define TK_PICKLE_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TK_PV_NONE = 0,
    TK_PV_BOOL,
    TK_PV_INT,
    TK_PV_FLOAT,
    TK_PV_STR,     /* UTF-8 bytes, NUL-terminated */
    TK_PV_BYTES,
    TK_PV_LIST,
    TK_PV_TUPLE,
    TK_PV_DICT,    /* items: key, value, key, value, ... in insertion order */
    TK_PV_GLOBAL,  /* str: "module.name" */
    TK_PV_REDUCE,  /* items[0] the callable (a GLOBAL), items[1] the args tuple, items[2] BUILD's state
                      or NULL; items[3..]: what SETITEM(S) (key, value pairs) or APPEND(S) added */
    TK_PV_PERSID   /* items[0] the persistent id */
} tk_pval_kind;

typedef struct tk_pval tk_pval;
struct tk_pval {
    tk_pval_kind kind;
    int64_t i;          /* BOOL (0/1), INT */
    double f;           /* FLOAT */
    const char *s;      /* STR, BYTES, GLOBAL: n bytes plus a NUL */
    size_t n;           /* STR/BYTES length; LIST/TUPLE/DICT/REDUCE/PERSID: number of items */
    tk_pval **items;    /* containers (a DICT's n items are key, value, key, value, ...) */
    size_t cap;         /* allocated slots of items */
    tk_pval *next_node; /* the reader's list of every node, for freeing */
    tk_pval *prev_node;
    int kept;           /* streaming: held by the memo (or DUP), never freed with a streamed item */
};

/* Called with each streamed item (a dict holding opts.stream_key) and the
 * list it was appended to; both borrowed for the call. Nonzero stops the
 * reading with that error (the callback fills err). */
typedef int (*tk_pickle_item_fn)(void *ctx, const tk_pval *list, const tk_pval *item, tk_err *err);

typedef struct tk_pickle_opts {
    const char *name;                     /* for messages ("snap.pickle"); NULL: "pickle" */
    const char *const *allowed_globals;   /* NULL-terminated fnmatch patterns ("collections.OrderedDict",
                                             "torch.*Storage"); NULL: none */
    int allow_persid;                     /* 1: BINPERSID gives a TK_PV_PERSID node */
    size_t max_bytes;                     /* cap on the tree's memory; 0: 1 GiB */
    const char *stream_key;               /* with on_item: the key that makes a dict a streamed item */
    tk_pickle_item_fn on_item;            /* NULL: nothing streamed */
    void *item_ctx;
} tk_pickle_opts;

typedef struct tk_pickle tk_pickle;

/* Reads one pickle from buf[0..len). Returns a new tk_pickle, or NULL with
 * err (TK_EFORMAT for bad or refused input, for a tree past max_bytes and
 * when host memory runs out, the message saying which). Bytes after STOP are ignored, as Python's pickle does. */
tk_pickle *tk_pickle_load(const uint8_t *buf, size_t len, const tk_pickle_opts *opts, tk_err *err);
void tk_pickle_destroy(tk_pickle **pp);
/* The same from a file, read through a read-only mapping whose pages are
 * given back behind the reader. NULL with err (TK_EIO naming the file, or
 * as tk_pickle_load). */
tk_pickle *tk_pickle_load_file(const char *path, const tk_pickle_opts *opts, tk_err *err);

const tk_pval *tk_pickle_root(const tk_pickle *p); /* borrowed */
/* Bytes the pickle took, STOP included: where the next one in a stream of
 * pickles starts (torch.save's legacy format). */
size_t tk_pickle_used(const tk_pickle *p);

/* Helpers for walking a known shape; all tolerate NULL. */
const tk_pval *tk_pval_get(const tk_pval *dict, const char *key); /* value of a str key, or NULL */
int tk_pval_is(const tk_pval *v, tk_pval_kind k);
int tk_pval_int(const tk_pval *v, int64_t *out);                  /* 0 for INT/BOOL, -1 otherwise */
const char *tk_pval_str(const tk_pval *v);                        /* STR's text, or NULL */
const char *tk_pval_kind_name(tk_pval_kind k);

/* ---- writing ---------------------------------------------------------------
 * A streaming writer of protocol-4 pickles that uses only the opcodes
 * PyTorch's web memory viewer decodes (PROTO, EMPTY_DICT, EMPTY_LIST, MARK,
 * SETITEMS, APPENDS, SHORT_BINUNICODE, BINUNICODE, BININT1, BININT2, BININT,
 * LONG1, BINFLOAT, NONE, NEWTRUE, NEWFALSE, TUPLE2, MEMOIZE, BINGET,
 * LONG_BINGET, STOP), so Python's pickle loads it with builtin types only.
 * Repeated strings are written once and fetched from the memo after.
 *
 * Use: dict_begin, then key/value pairs, dict_end; list_begin, items,
 * list_end; a tuple2 is two values then tuple2. An error (out of memory) is
 * sticky and reported by tk_pickle_w_finish. Ownership: the writer owns its
 * buffer until finish hands it to the caller (free()). */
typedef struct tk_pickle_w tk_pickle_w;
tk_pickle_w *tk_pickle_w_new(void);
void tk_pickle_w_dict_begin(tk_pickle_w *w);
void tk_pickle_w_dict_end(tk_pickle_w *w);
void tk_pickle_w_list_begin(tk_pickle_w *w);
void tk_pickle_w_list_end(tk_pickle_w *w);
void tk_pickle_w_str(tk_pickle_w *w, const char *s);
void tk_pickle_w_int(tk_pickle_w *w, int64_t x);
void tk_pickle_w_bool(tk_pickle_w *w, int b);
void tk_pickle_w_none(tk_pickle_w *w);
void tk_pickle_w_tuple2(tk_pickle_w *w);
/* Ends the pickle (STOP) and returns its bytes (new, free()) and length, or
 * NULL when memory ran out; the writer is destroyed either way. */
uint8_t *tk_pickle_w_finish(tk_pickle_w **pw, size_t *len);
void tk_pickle_w_destroy(tk_pickle_w **pw);

#ifdef __cplusplus
}
#endif
#endif

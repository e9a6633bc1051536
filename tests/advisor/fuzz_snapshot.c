/* fuzz_snapshot.c — libFuzzer target over the restricted pickle reader and
 * the PyTorch snapshot reader that walks its tree (and the JSON form).
 *
 * Each input goes through three doors: the snapshot reader (no global
 * allowed), the reader's report and JSON (so every figure and owner string a
 * file can produce is formatted), and tk_pickle_load with the state-dict
 * allow-list and persistent ids on, so GLOBAL, STACK_GLOBAL, REDUCE, BUILD
 * and BINPERSID are explored too; and the pytorch_model.bin reader (zip
 * and legacy forms) over the same bytes. A small tree cap makes the memory cap's
 * path reachable. Built from bert/pickle.c, advisor/snapshot.c and the
 * gpu/ files they use (advisor/module.mk). */
#include <stdlib.h>

#include "tk_pickle.h"
#include "tk_snapshot.h"
#include "tk_torchbin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tk_err err = {0};
    tk_snapshot *s = tk_snap_read_buf(data, size, "fuzz.pickle", size & 1 ? ((size_t)16 << 30) : 0, &err);
    if (s) {
        free(tk_snap_text(s, 5));
        json_decref(tk_snap_json(s, 5));
    }
    tk_snap_destroy(&s);
    static const char *const allowed[] = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                                          "torch.*Storage", NULL};
    tk_pickle_opts o = {.name = "fuzz.pkl", .allowed_globals = allowed, .allow_persid = 1,
                        .max_bytes = (size_t)64 << 20};
    tk_pickle *p = tk_pickle_load(data, size, &o, &err);
    tk_pickle_destroy(&p);
    /* and as a pytorch_model.bin: zip or legacy, the same reader under it */
    tk_st_file *f = tk_torch_bin_parse(data, size, "fuzz.bin", &err);
    tk_st_close(&f);
    return 0;
}

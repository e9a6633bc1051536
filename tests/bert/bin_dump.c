/* bin_dump — the C side of tests/bert/test_torchbin.py: reads a torch.save
 * state dict with tk_torch_bin_open and writes its tensors, as read, to a
 * safetensors file the test compares with torch's own tensors bit for bit.
 *
 *   bin_dump IN.bin OUT.safetensors      exit 0, or 1 with the error on stderr
 */
#include <stdio.h>
#include "tk_torchbin.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: bin_dump IN.bin OUT.safetensors\n");
        return 2;
    }
    tk_err e = {0};
    tk_st_file *f = tk_torch_bin_open(argv[1], &e);
    if (!f) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    tk_st_writer *w = tk_st_writer_new();
    tk_status st = w ? TK_OK : TK_EINVAL;
    for (int i = 0; st == TK_OK && i < tk_st_count(f); i++) {
        const tk_st_entry *x = tk_st_at(f, i);
        st = tk_st_writer_add(w, x->name, x->dtype, x->ndim, x->shape, tk_st_data(f, x), &e);
    }
    if (st == TK_OK) st = tk_st_writer_write(w, argv[2], &e);
    tk_st_writer_destroy(&w);
    tk_st_close(&f);
    if (st != TK_OK) fprintf(stderr, "%s\n", e.msg);
    return st == TK_OK ? 0 : 1;
}

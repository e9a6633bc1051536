/* txmem.c — `%txmem`: live device memory of the session, by category, owner
 * or layer; the memory timeline of the last run; the allocator snapshot
 * saved (--save); a PyTorch memory snapshot read and diagnosed (--snapshot).
 *
 * The cell's syntax only: the words are read by the option table and the
 * report is app/mem.c's tk_app_mem, the function `txk mem` calls too.
 *
 * Guarantees: reading memory never allocates on the device; before any run
 * it says so instead of opening a device; reading a PyTorch snapshot needs
 * no device and executes nothing from the file.
 */
#include "tk_app.h"
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_txmagics.h"

static int run_txmem(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_MEM, &argv, &argc, &a)) return -1;
    tk_mem_reply r;
    tk_err err = {0};
    int json = tk_app_has(&a, "--json");
    if (tk_app_mem(m->session, &a, TK_DOOR_CELL, &r, &err) != TK_OK) rc = tk_magic_error(m, r.ename, "%s", err.msg);
    if (!rc && r.bundle) tk_txemit(m, r.bundle, json);
    if (!rc && r.timeline) tk_txemit_as(m, r.timeline, json, "timeline");
    if (!rc && r.failed) rc = tk_magic_error(m, r.ename, "%s", r.said);
    else if (!rc && r.said[0]) tk_magic_printf(m, "stdout", "%s", r.said);
    json_decref(r.bundle);
    json_decref(r.timeline);
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXMEM[] = {
    {"txmem", TK_MAGIC_LINE, run_txmem, "live device memory: by category, owner or layer; timeline; a PyTorch snapshot diagnosed",
     "%txmem {flags}\n"
     "(the session's memory: --by, --top, --timeline, --save; --record alone; --snapshot FILE with --gpu or\n"
     "--capacity, --model, --data, --text, --batch, --seq, --top)\n\n"
     "Capacity, free, allocated, reserved and peaks of the session's device (exact bytes\n"
     "from the caching allocator), the live bytes per category, and the top owners (HF\n"
     "module names) or layers. --timeline charts allocated/reserved at each step of the\n"
     "last run. --json prints the same as JSON. --save FILE.pickle writes a PyTorch memory\n"
     "snapshot (the allocator now, and as its trace the allocations and frees recorded\n"
     "since --record: the allocator's history is off unless asked, as in PyTorch's\n"
     "torch.cuda.memory._record_memory_history; --record keeps the last N events, 262144\n"
     "by default, 48 bytes each; --record off stops);\n"
     "--save FILE (another name) writes txkernel's segments, blocks\n"
     "and owners to FILE (JSON).\n\n"
     "--snapshot FILE reads a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's\n"
     "pickle, or its JSON form; nothing in it is executed) and shows reserved, allocated,\n"
     "requested, the largest free block, segments by pool and stream, who holds the live\n"
     "memory (innermost frame of your code: \"cell, line N\"; C++ frames are never shown as\n"
     "code), each device when there are several, the memory over the trace, what ran at\n"
     "the peak and at the OOM (external_annotations, else the frames), the diagnosis (a\n"
     "leak: memory kept from one loop iteration to the next; growth inside one step is\n"
     "not one) and fixes as PyTorch code. --gpu/--capacity give the card's size to judge\n"
     "it against. The model is named with its evidence (bert, llama, qwen, mistral, gpt2,\n"
     "opt, decoder or unknown); only a BERT (from its blocks' sizes, or --model NAME|DIR)\n"
     "is planned, at the batch x seq the activations show (or --batch/--seq), and its plan\n"
     "shown only when it agrees with the file; --data FILE gives the token lengths and\n"
     "the max_length fix."},
};

int tk_magics_register_txmem(tk_magics *m) { return tk_magics_add_table(m, TXMEM, 1); }

/* tk_embed.h — the magics interpreter as a library for a host process that is
 * not our kernel (the Python companion's `%load_ext txkernel`, through ctypes).
 *
 * A host creates one tk_embed (a registry with every magic module and its own
 * notebook session), hands it one cell's text at a time, and receives each
 * output as one JSON object (a Jupyter output, flattened):
 *
 *   {"msg_type":"stream","name":"stdout"|"stderr","text":...}
 *   {"msg_type":"display_data","data":{mime:...},"metadata":{...},"display_id":ID|null}
 *   {"msg_type":"update_display_data", ... same keys, display_id set}
 *   {"msg_type":"execute_result","data":{...},"metadata":{...}}
 *   {"msg_type":"clear_output","wait":bool}
 *   {"msg_type":"error","ename":...,"evalue":...,"traceback":[...]}
 *   {"msg_type":"page","data":{mime:...}}
 *
 * Guarantees: outputs reach emit in the order the magics sent them, on the
 * thread that called tk_embed_execute (a magic that sends from a worker thread
 * is serialised under a lock); the JSON text is borrowed for the call. An
 * execute ends with exactly the outcome the txkernel kernel would have: 0, or
 * -1 after one "error" output. tk_embed_cancel may be called from any thread
 * or a signal handler. Nothing here exits or aborts.
 */
#ifndef TK_EMBED_H
#define TK_EMBED_H

#include <stddef.h>

typedef struct tk_embed tk_embed;

/* Called once per output; json is borrowed for the call. */
typedef void (*tk_embed_emit_fn)(void *user, const char *json);

/* While this execute runs, SIGINT sets the cancel flag (the run stops at its
 * next step) instead of reaching the host's own handler, which is restored
 * before tk_embed_execute returns. For hosts whose SIGINT handler cannot run
 * during a foreign call (Python's runs only between bytecodes). */
#define TK_EMBED_CATCH_SIGINT 1

tk_embed *tk_embed_new(void);                 /* new; NULL on OOM */
void tk_embed_destroy(tk_embed **pe);         /* releases the session's device too */

/* Runs one cell (code borrowed; the same grammar as a txkernel cell). Clears
 * the cancel flag first. Returns 0 when the cell succeeded, -1 after an error
 * output, -2 when another execute of e is still running (nothing ran). */
int tk_embed_execute(tk_embed *e, const char *code, int flags, tk_embed_emit_fn emit, void *user);

/* Sets the cancel flag of the running execute (if any). Async-signal-safe. */
void tk_embed_cancel(tk_embed *e);

/* Releases everything the session holds (device memory, config, plan, run,
 * OOM record), as %txreset does, without output. */
void tk_embed_reset(tk_embed *e);

/* What other code in this process holds on the GPU, as the host sees it
 * before a cell: the user's PyTorch caching allocator. state: 0 unknown (not
 * reported), 1 torch not imported, 2 torch without CUDA, 3 CUDA not yet
 * initialised by torch, 4 holds `reserved` bytes (torch.cuda.memory_reserved())
 * of which `allocated` (memory_allocated()). Counted by %txdevice, %txmem,
 * the plans' free and the advisor's release fix. 0, or -1 on a bad value. */
int tk_embed_set_holder(tk_embed *e, int state, unsigned long long reserved, unsigned long long allocated);

/* The companion's traced model (issue 41): after `%txplan --torch-model X`
 * traced X, the session's config becomes config_yaml (X's: engine: pytorch,
 * its dimensions, batch, max_len, precision, recompute, freeze, gpu), and
 * %txadvise, %txfix and %%txadvise --from-error on it plan the config and
 * every candidate by calling trace (app/tk_embed_trace.h's tk_trace_fn,
 * user borrowed: it must outlive the session or the next call) with the
 * candidate's settings. trace_path (may be NULL) is the trace of the config
 * as given, kept so it is not traced again. label names the model; note its
 * own calls (where its checkpointing and embeddings are); budget_s the
 * seconds of tracing one advice may spend; platform (may be NULL) the one
 * `--gpus PLATFORM` planned on, which advice on a config naming no card is
 * for (its smallest card, as after %txplan --gpus). 0, or -1 with errbuf
 * holding the config's error. */
int tk_embed_set_traced(tk_embed *e, const char *config_yaml, const char *label, const char *note,
                        const char *trace_path, int (*trace)(void *user, const char *request, const char *out_path,
                                                             char *errbuf, size_t errlen),
                        void *user, double budget_s, const char *platform, char *errbuf, size_t errlen);

/* Every registered magic as a JSON array of {"name","kind":"line"|"cell"|"both",
 * "summary","help"}: a new string, release it with tk_embed_free. */
char *tk_embed_magics_json(tk_embed *e);
/* The option table of every front door (app/tk_app.h, tk_app_options_json):
 * the companion's own flags are read by it, so a flag means the same in a
 * shell, a cell and the companion. New string (tk_embed_free). */
char *tk_embed_options_json(void);

/* Completion matches for code at byte offset cursor, as JSON
 * {"matches":[...],"start":N,"end":N}; new string (tk_embed_free). */
char *tk_embed_complete_json(tk_embed *e, const char *code, int cursor);

void tk_embed_free(void *p);
const char *tk_embed_version(void);            /* static string */

#endif

/* txdevice.c — `%txdevice` (the device report of app/device.c's
 * tk_app_device; its one flag, --json, read by the option table) and
 * `%txreset` (release everything the session holds).
 */
#include <stdio.h>

#include "tk_app.h"
#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

static int run_txdevice(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_DEVICE, &argv, &argc, &a)) return -1;
    if (a.n_plain || a.n_kv)
        rc = tk_magic_error(m, "UsageError", "%%txdevice: unexpected '%s' (usage: %%txdevice [--json])",
                            a.n_plain ? a.plain[0] : a.kv[0]);
    if (!rc) {
        json_t *b = tk_app_device(m->session);
        tk_txemit(m, b, tk_app_has(&a, "--json"));
        json_decref(b);
    }
    tk_txargs_free(argv, argc);
    return rc;
}

static int run_txreset(tk_magic_ctx *m) {
    tk_session *s = m->session;
    tk_dev *d = tk_session_current_device(s);
    char a[32], r[32];
    if (d) {
        tk_alloc_stats st;
        tk_alloc_stats_get(tk_dev_alloc(d), &st);
        tk_magic_printf(m, "stdout", "Released the device (%s allocated, %s reserved) and the session's config, plan, "
                                     "last run and OOM record.\n",
                        tk_format_bytes(st.allocated, a, sizeof a), tk_format_bytes(st.reserved, r, sizeof r));
    } else {
        tk_magic_printf(m, "stdout", "Nothing on a device; cleared the session's config, plan and records.\n");
    }
    tk_session_reset(s);
    return 0;
}

static const tk_magic_def TXDEVICE[] = {
    {"txdevice", TK_MAGIC_LINE, run_txdevice, "the device: capacity, free, other processes, driver and CUDA versions",
     "%txdevice {flags}\n\n"
     "The session's device (cuda, cpu or meta), its capacity and free memory, what this\n"
     "session holds, what other processes hold (NVML, when the NVIDIA driver is there),\n"
     "and the driver and CUDA versions. On cpu and meta the capacity is simulated.\n"
     "For a cuda card (and the config's gpu: profile) it says which kernel runs fused\n"
     "attention at the config's precision: tensor cores (mma.sync) or the reference\n"
     "kernel, and why (TXK_ATTN_KERNEL=reference|sm75 overrides the card's choice)."},
    {"txreset", TK_MAGIC_LINE, run_txreset, "release everything the session holds",
     "%txreset\n\nReleases the session's device (all its memory) and forgets the last config,\n"
     "plan, run and OOM record. The next %%txtrain opens a fresh device. A model\n"
     "named with the companion's %txplan --torch-model stays: it describes your model."},
};

int tk_magics_register_txdevice(tk_magics *m) { return tk_magics_add_table(m, TXDEVICE, 2); }

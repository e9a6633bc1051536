/* snapshot.c — reading a PyTorch memory snapshot (see tk_snapshot.h): the
 * entry points, which run the reader's layers in their one direction —
 * decode (snapshot_decode.c), the trace replayed (snapshot_trace.c), owners
 * and frames (snapshot_frames.c), the peak (snapshot_peak.c), the leak
 * (snapshot_leak.c), the diagnosis (snapshot_diagnose.c) — and free what
 * they kept once the tk_snapshot holds its figures.
 *
 * Guarantees: any error is one line naming the file and the field, and
 * leaves nothing allocated; every pointer in the tk_snapshot is its own.
 */
#include "snapshot_diagnose.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tk_snapshot *snap_new(const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = tk_calloc(1, sizeof *s);
    if (!s) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", name);
    s->capacity = capacity;
    s->oom_time_us = s->peak_time_us = -1;
    return s;
}

/* Everything after decoding, in order. */
static tk_snapshot *finish(tk_snapshot *s, snap_dec *d, int rc) {
    snap_replay r = {0};
    snap_frames f = {0};
    if (!rc) rc = snap_replay_trace(d, &r);
    if (!rc) rc = snap_read_frames(d, &r, &f);
    if (!rc) rc = snap_read_peak(d, &r, &f);
    if (!rc) rc = snap_find_leak(d, &r, &f);
    if (!rc) snap_diagnose(s);
    snap_frames_clear(&f);
    snap_replay_clear(&r);
    snap_dec_clear(d);
    if (rc) tk_snap_destroy(&s);
    return s;
}

tk_snapshot *tk_snap_read_buf(const uint8_t *buf, size_t len, const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = snap_new(name, capacity, err);
    if (!s) return NULL;
    snap_dec d = {.s = s, .name = name, .err = err};
    return finish(s, &d, snap_decode_buf(&d, buf, len));
}

tk_snapshot *tk_snap_read(const char *path, size_t capacity, tk_err *err) {
    tk_snapshot *s = snap_new(path, capacity, err);
    if (!s) return NULL;
    snap_dec d = {.s = s, .name = path, .err = err};
    return finish(s, &d, snap_decode_file(&d, path));
}

void tk_snap_destroy(tk_snapshot **ps) {
    if (!ps || !*ps) return;
    free((*ps)->owners);
    free((*ps)->points);
    free((*ps)->live_sizes);
    free((*ps)->peak.layers);
    free((*ps)->peak.state_sizes);
    free((*ps)->peak.act_sizes);
    free(*ps);
    *ps = NULL;
}

int tk_snap_capacity(const char *gpu, const char *size, size_t *out, tk_err *err) {
    *out = 0;
    if (gpu) {
        const tk_gpu_profile *p = tk_gpu_profile_find(gpu);
        if (!p) {
            tk_err_set(err, TK_EINVAL, "--gpu %s: unknown GPU profile (t4, p4, a100-40, ...)", gpu);
            return -1;
        }
        *out = p->capacity;
    }
    if (size && tk_parse_bytes(size, out)) {
        tk_err_set(err, TK_EINVAL, "--capacity %s: not a size (e.g. 14.75GiB)", size);
        return -1;
    }
    return 0;
}

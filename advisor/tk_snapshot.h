/* tk_snapshot.h — a PyTorch CUDA memory snapshot read and diagnosed: the
 * figures PyTorch's own counters give, who holds the live memory, the
 * memory over time from the trace, and the same diagnoses the advisor makes
 * for a plan, with fixes written as the PyTorch/transformers code to change.
 *
 * Forms read: the pickle of `torch.cuda.memory._snapshot()` as
 * `_dump_snapshot` writes it (a dict with `segments` and `device_traces`),
 * the older pickle of the segment list alone, and the same data as JSON.
 * The pickle goes through tk_pickle with no global allowed: nothing in the
 * file is executed.
 *
 * Figures are exact sums over the file: reserved = segments' total_size;
 * allocated = sizes of 'active_allocated' blocks (memory_allocated());
 * requested = their requested_size; largest_free_block = the largest
 * 'inactive' block.
 *
 * Ownership: tk_snap_read returns a new tk_snapshot (tk_snap_destroy);
 * every pointer inside is owned by it.
 */
#ifndef TK_SNAPSHOT_H
#define TK_SNAPSHOT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_snap_pool {
    char pool[16];        /* "small" / "large" (segment_type) */
    int64_t stream;
    int segments;
    size_t reserved, allocated, free, largest_free;
} tk_snap_pool;

typedef struct tk_snap_owner {
    char owner[192];      /* "cell, line 12", "train.py, line 40 (step) · linear", "no Python frame" */
    size_t bytes;         /* live (active_allocated) bytes */
    int blocks;
} tk_snap_owner;

typedef struct tk_snap_point {
    int64_t event;        /* index of the trace event */
    int64_t time_us;      /* its time_us, or -1 when the file has none */
    size_t allocated, reserved;
} tk_snap_point;

typedef struct tk_snap_diag {
    char id[24];          /* the advisor's names: "fragmentation", "capacity", "headroom", "dominant_layer" */
    char text[640];
} tk_snap_diag;

typedef struct tk_snap_fix {
    char id[24];          /* "expandable_segments", "empty_cache", "del", "batch", "precision", "checkpointing", "max_length" */
    char text[512];       /* what to change and what the snapshot says it saves */
    char code[512];       /* the PyTorch/transformers code */
    int64_t saves;        /* bytes the snapshot shows it frees, or -1 when the snapshot cannot tell */
} tk_snap_fix;

#define TK_SNAP_MAX_POOLS 32
#define TK_SNAP_MAX_DIAG 6
#define TK_SNAP_MAX_FIXES 10

typedef struct tk_snapshot {
    char path[512];
    const char *form;     /* "pickle (dict)", "pickle (list of segments)", "json" */
    int n_segments, n_blocks, n_live_blocks, n_free_blocks, n_devices;
    size_t reserved, allocated, requested, pending_free;
    size_t free_in_cache;        /* inactive blocks summed */
    size_t largest_free_block;
    size_t empty_segments;       /* bytes of segments with no active block: what empty_cache() returns */
    int n_pools;
    tk_snap_pool pools[TK_SNAP_MAX_POOLS];
    int n_owners;
    tk_snap_owner *owners;       /* sorted by bytes, largest first */
    int has_oom;
    size_t oom_size, oom_device_free;
    int n_trace;                 /* trace events read */
    int n_points;
    tk_snap_point *points;       /* memory over time, one per alloc/free/segment event */
    size_t trace_peak_allocated; /* the highest allocated the trace reaches */
    size_t capacity;             /* the device's, from the caller; 0: unknown */
    int n_diag;
    tk_snap_diag diag[TK_SNAP_MAX_DIAG];   /* ranked, the cause first */
    int n_fixes;
    tk_snap_fix fixes[TK_SNAP_MAX_FIXES];  /* ranked, best first */
} tk_snapshot;

/* Reads and diagnoses the snapshot at path. capacity: the device's total
 * bytes (a GPU profile's or --capacity), 0 when unknown. NULL with err
 * (one line naming the file) on any error. */
tk_snapshot *tk_snap_read(const char *path, size_t capacity, tk_err *err);
/* The same from memory; name is used in messages. */
tk_snapshot *tk_snap_read_buf(const uint8_t *buf, size_t len, const char *name, size_t capacity, tk_err *err);
void tk_snap_destroy(tk_snapshot **ps);

/* The capacity to judge a snapshot against: a GPU profile's (gpu, "t4") or
 * a size ("14.75GiB"); both NULL gives 0 (unknown). -1 with err if unknown. */
int tk_snap_capacity(const char *gpu, const char *size, size_t *out, tk_err *err);

/* Text report (new string, free()). */
char *tk_snap_text(const tk_snapshot *s, int top);
/* JSON object: reserved, allocated, requested, largest_free_block, segments
 * (by pool/stream), top [{owner, bytes, blocks}], oom, timeline, diagnoses
 * [{id, text}], fixes [{id, text, code, saves}] (new reference). */
json_t *tk_snap_json(const tk_snapshot *s, int top);

/* Writes the allocator's state as a PyTorch snapshot (the dict form, pickle
 * protocol 4 with only the opcodes PyTorch's web viewer decodes):
 * `segments` with their blocks from the allocator's real state, and
 * `device_traces` from its recorded history (tk_alloc_record_history; empty
 * when it was off), then an `oom` event when oom is given. Every block and
 * event carries one frame {filename "txkernel", line 0, name "OWNER · CAT · PHASE"}
 * (the phase when the trainer set one).
 * 0, or -1 with err naming the file. */
int tk_snap_write(const tk_alloc *a, const tk_oom *oom, const char *path, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

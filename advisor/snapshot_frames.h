/* snapshot_frames.h — the snapshot reader's third layer (after decode and
 * trace): owners and frames. What a stack of frames shows (the owner of a
 * block, the model module, an inference engine's pool, the user's outermost
 * line, the phase), the phase each event ran in (external_annotations, the
 * frames, and the autograd thread's frameless allocations inside backward),
 * the forward's layer each activation was made in, the steps, the library
 * workspaces (cuBLAS's, named from size, lifetime and frames), and the
 * owners of the blocks live at the end (s->owners).
 *
 * Guarantees: frames are only read, never trusted for sizes; a Python frame
 * is a .py file or a notebook cell, everything else (C, C++, CPython, "??")
 * is native and never shown as code; Windows paths are read with '/'. A
 * library workspace is named only from what the file shows.
 */
#ifndef TK_SNAPSHOT_FRAMES_H
#define TK_SNAPSHOT_FRAMES_H

#include "snapshot_trace.h"

/* The phase an event ran in. */
enum { PH_NONE, PH_LOAD, PH_CODE, PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER, PH_ZERO_GRAD, PH_DATA, PH_N };

/* A library workspace: cuBLAS's (one per thread's handle), and a 1 MiB
 * block the same call allocated right after it. */
enum { WS_NONE, WS_CUBLAS, WS_BESIDE };

/* The owner of a block with no frames at all: PyTorch records frames only
 * while the history is on. */
#define SNAP_BEFORE_HISTORY "no frames (allocated before the history was recorded)"

/* A forward allocation's layer: >= 0 the index of the model's repeated
 * layer (the loop's call), or one of these. */
enum { LAYER_NONE = -1, LAYER_BEFORE = -2, LAYER_AFTER = -3 };

typedef struct snap_frames {
    /* per stack, read once */
    int32_t *owner;        /* the owner's name (interned), -2 not read yet */
    uint8_t *kind;         /* the phase its frames show */
    int32_t *kind_text;    /* that phase as text ("forward (linear.py, line 116)"), -1 none */
    uint64_t *uline;       /* the user's outermost line hashed, 0 none */
    int8_t *cat;           /* txkernel's own frames name the category: a tk_cat, -1 none */
    /* per event */
    uint8_t *phase;        /* PH_* */
    int32_t *ann;          /* the innermost annotation open then (interned name), -1 none */
    int16_t *layer;        /* LAYER_* or the layer's index (forward allocs) */
    int16_t *step;         /* 1 + the optimizer steps that ended before it */
    uint8_t *ws;           /* WS_* of an alloc */
    uint8_t *pre_ws;       /* WS_* of each block live before the recording */
    int layers_seen;       /* calls of the model's repeated layer in each forward pass, 0 unknown */
    int steps;             /* optimizer steps the trace shows */
} snap_frames;

/* Reads the phases, layers, steps and workspaces of d's trace, and the
 * owners of the blocks live at the end (s->owners, the model module,
 * vLLM's pool, by_txkernel). 0, or -1 with d->err. */
int snap_read_frames(snap_dec *d, const snap_replay *r, snap_frames *f);
void snap_frames_clear(snap_frames *f);

/* The owner of stack st ("train.py, line 40 (step) · torch/nn/modules/linear.py"). */
const char *snap_owner(snap_dec *d, snap_frames *f, int32_t st);
/* The owner of alloc event ev: its stack's, or for an alloc with no frames
 * in a trace that records them, the autograd engine's inside backward. */
const char *snap_event_owner(const snap_dec *d, const snap_frames *f, int64_t ev);
/* Owners that name no code of the user's: native only, no frames, a library, the autograd engine. */
int snap_names_no_code(const char *owner);
/* An event's phase as text (the annotation's range, else what the frames show), "" none. */
void snap_phase_text(const snap_dec *d, const snap_frames *f, int64_t ev, char *out, size_t n);
/* A workspace's name as an owner ("library: cuBLAS workspace (...)"). */
void snap_ws_name(int ws, int phase, int pre, char *out, size_t n);
/* "forward", "backward", "optimizer step", ... ("" for PH_NONE). */
const char *snap_phase_name(int ph);

#endif

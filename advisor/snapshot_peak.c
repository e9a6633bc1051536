/* snapshot_peak.c — the trace's peak read whole (see snapshot_peak.h).
 *
 * A block live at the peak is, by when it was made and when it went:
 * made by a library workspace rule (snapshot_frames.c): workspace; made in
 * the forward: an activation (by its layer); made in backward and kept past
 * it (freed by zero_grad or the next step, or never): a gradient, freed
 * inside backward: a backward temporary; made in the optimizer step and
 * kept: optimizer state, freed inside it: its temporary; made while the
 * model was loaded or moved (module._apply): parameters and buffers; made by
 * the user's own code outside the model (the batch): input; live before the
 * recording: said so, with no guess at what it is.
 */
#include "snapshot_peak.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C_WORKSPACE, C_PARAM, C_GRAD, C_OPTIM, C_ACT, C_TEMP_BWD, C_TEMP_OPT, C_INPUT, C_BEFORE, C_OTHER, C_N };

static const struct { const char *id, *text; } CAT[C_N] = {
    {"workspace", "library workspaces (cuBLAS)"},
    {"param", "parameters and buffers (made when the model was loaded or moved)"},
    {"grad", "gradients (made in backward, kept for the optimizer)"},
    {"optim", "optimizer state (made in the optimizer step, kept)"},
    {"act", "activations (made in the forward)"},
    {"temp_backward", "backward's temporaries (freed inside backward)"},
    {"temp_optimizer", "the optimizer step's temporaries (freed inside it)"},
    {"input", "your code's tensors outside the model (the batch)"},
    {"before_recording", "held from before the recording began (what they are, the file does not say)"},
    {"other", "made elsewhere (no phase the file shows)"},
};

static int category_of(const snap_dec *d, const snap_replay *r, const snap_frames *f, size_t i) {
    if (f->ws[i]) return C_WORKSPACE;
    int64_t j = r->pair[i];
    int freed_in = j >= 0 ? f->phase[j] : PH_NONE, tag = d->ev[i].stack > 0 ? f->cat[d->ev[i].stack] : -1;
    switch (tag) { /* txkernel's own snapshot names the category */
    case TK_CAT_PARAM: return C_PARAM;
    case TK_CAT_GRAD: return C_GRAD;
    case TK_CAT_OPTIM: return C_OPTIM;
    case TK_CAT_ACT: return C_ACT;
    case TK_CAT_TEMP: return f->phase[i] == PH_OPTIMIZER ? C_TEMP_OPT : f->phase[i] == PH_BACKWARD ? C_TEMP_BWD : C_OTHER;
    case TK_CAT_WORKSPACE: return C_WORKSPACE;
    case TK_CAT_INPUT: return C_INPUT;
    default: break;
    }
    switch (f->phase[i]) {
    case PH_FORWARD: return C_ACT;
    case PH_BACKWARD: return j >= 0 && freed_in == PH_BACKWARD ? C_TEMP_BWD : C_GRAD;
    case PH_OPTIMIZER: return j >= 0 && freed_in == PH_OPTIMIZER && f->step[j] == f->step[i] ? C_TEMP_OPT : C_OPTIM;
    case PH_LOAD: return C_PARAM;
    case PH_CODE:
    case PH_DATA: return C_INPUT;
    default: return C_OTHER;
    }
}

static void part_add(tk_snap_part *p, size_t bytes) {
    p->bytes += bytes;
    p->blocks++;
}

static int cmp_part(const void *a, const void *b) {
    const tk_snap_part *x = a, *y = b;
    return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* The batch: int64 blocks the user's code made, live at the peak. Token
 * blocks (input_ids, attention_mask, token_type_ids: B x T) are the largest
 * size that comes at least twice; label blocks (B) the largest smaller size
 * that divides it (twice for a span task's start and end positions). */
static void read_batch(tk_snap_peak *pk, const size_t *code, int n) {
    size_t tok = 0, lab = 0;
    int c_lab = 0;
    for (int i = 0; i < n;) {
        int c = 1;
        while (i + c < n && code[i + c] == code[i]) c++;
        if (c >= 2 && code[i] % 8 == 0 && code[i] > tok) tok = code[i];
        i += c;
    }
    for (int i = 0; tok && i < n;) {
        int c = 1;
        while (i + c < n && code[i + c] == code[i]) c++;
        if (code[i] < tok && code[i] % 8 == 0 && (tok / 8) % (code[i] / 8) == 0 && code[i] > lab) lab = code[i], c_lab = c;
        i += c;
    }
    if (!tok || !lab) return;
    pk->tokens = (int)(tok / 8);
    pk->batch = (int)(lab / 8);
    pk->label_blocks = c_lab;
}

static void name_layer(tk_snap_part *p, int layer) {
    if (layer == LAYER_BEFORE) {
        snprintf(p->id, sizeof p->id, "before_layers");
        snprintf(p->text, sizeof p->text, "before the layers (embeddings, masks)");
    } else if (layer == LAYER_AFTER) {
        snprintf(p->id, sizeof p->id, "after_layers");
        snprintf(p->text, sizeof p->text, "after the layers (pooler, head, loss)");
    } else if (layer == LAYER_NONE) {
        snprintf(p->id, sizeof p->id, "forward");
        snprintf(p->text, sizeof p->text, "the forward, no layer the frames show");
    } else {
        snprintf(p->id, sizeof p->id, "layer_%d", layer);
        snprintf(p->text, sizeof p->text, "layer %d", layer);
    }
}

/* The workspaces the file shows, as owners, with whether each was live at the peak. */
static void read_ws(snap_dec *d, const snap_replay *r, const snap_frames *f, int64_t peak) {
    tk_snapshot *s = d->s;
    for (size_t i = 0; i < d->n_ev && s->n_ws < TK_SNAP_MAX_WS; i++) {
        if (!f->ws[i]) continue;
        tk_snap_ws *w = &s->ws[s->n_ws++];
        snap_ws_name(f->ws[i], f->phase[i], 0, w->name, sizeof w->name);
        w->bytes = (size_t)r->bsize[i];
        w->at_peak = peak >= 0 && snap_live_at(r, (int64_t)i, peak);
    }
    for (int k = 0; k < r->n_pre && s->n_ws < TK_SNAP_MAX_WS; k++) {
        if (!f->pre_ws[k]) continue;
        tk_snap_ws *w = &s->ws[s->n_ws++];
        snap_ws_name(f->pre_ws[k], PH_NONE, 1, w->name, sizeof w->name);
        w->bytes = (size_t)r->pre[k].size;
        w->at_peak = peak < 0 || snap_pre_live_at(r, k, peak);
    }
}

/* The forward's and backward's high point: the alloc in either with the
 * most allocated (the peak itself when it falls there). The activations and
 * the batch are read there: at a peak in the optimizer step they are gone. */
static int64_t activations_high(const snap_dec *d, const snap_frames *f) {
    const tk_snapshot *s = d->s;
    int64_t best = -1;
    size_t top = 0;
    for (int i = 0; i < s->n_points; i++) {
        int64_t e = s->points[i].event;
        if (d->ev[e].action != EV_ALLOC || (f->phase[e] != PH_FORWARD && f->phase[e] != PH_BACKWARD)) continue;
        if (best < 0 || s->points[i].allocated > top) best = e, top = s->points[i].allocated;
    }
    return best;
}

/* The requested sizes, ascending, of the forward's activations and of the
 * batch (your code's blocks) live right after event A; the batch read from
 * the latter. */
static int read_activations(snap_dec *d, const snap_replay *r, const snap_frames *f, int64_t A) {
    tk_snap_peak *pk = &d->s->peak;
    size_t n = 0;
    for (size_t i = 0; A >= 0 && i <= (size_t)A; i++) n += d->ev[i].action == EV_ALLOC && snap_live_at(r, (int64_t)i, A);
    size_t *act = tk_malloc((n ? n : 1) * sizeof *act), *code = tk_malloc((n ? n : 1) * sizeof *code);
    if (!act || !code) {
        free(act);
        free(code);
        return snap_bad_nomem(d, "device_traces");
    }
    int n_act = 0, n_code = 0;
    for (size_t i = 0; A >= 0 && i <= (size_t)A; i++) {
        if (d->ev[i].action != EV_ALLOC || !snap_live_at(r, (int64_t)i, A)) continue;
        int c = category_of(d, r, f, i);
        if (c == C_ACT) act[n_act++] = (size_t)d->ev[i].size;
        if (c == C_INPUT) code[n_code++] = (size_t)d->ev[i].size;
    }
    qsort(act, (size_t)n_act, sizeof *act, cmp_size);
    qsort(code, (size_t)n_code, sizeof *code, cmp_size);
    pk->act_sizes = act;
    pk->n_act_sizes = n_act;
    if (!d->by_txkernel) read_batch(pk, code, n_code); /* PyTorch's int64 ids and labels (txkernel's are int32) */
    free(code);
    return 0;
}

int snap_read_peak(snap_dec *d, const snap_replay *r, const snap_frames *f) {
    tk_snapshot *s = d->s;
    tk_snap_peak *pk = &s->peak;
    int64_t P = r->peak_ev;
    for (size_t i = d->n_ev; s->has_oom && i-- > 0;)
        if (d->ev[i].action == EV_OOM) {
            snap_phase_text(d, f, (int64_t)i, s->phase_at_oom, sizeof s->phase_at_oom);
            break;
        }
    read_ws(d, r, f, P);
    if (P < 0) return 0;
    pk->have = 1;
    pk->event = P;
    pk->time_us = d->ev[P].time_us;
    pk->allocated = s->trace_peak_allocated;
    snap_phase_text(d, f, P, s->phase_at_peak, sizeof s->phase_at_peak);
    snprintf(pk->phase, sizeof pk->phase, "%s", snap_phase_name(f->phase[P]));
    snprintf(pk->where, sizeof pk->where, "%s", s->phase_at_peak);
    pk->steps = f->steps;
    pk->step = f->steps ? f->step[P] : 0;
    pk->layers_seen = f->layers_seen;

    tk_snap_part cats[C_N];
    memset(cats, 0, sizeof cats);
    int max_layer = -1, n_live = 0;
    for (size_t i = 0; i <= (size_t)P; i++)
        if (d->ev[i].action == EV_ALLOC && snap_live_at(r, (int64_t)i, P)) {
            n_live++;
            if (f->layer[i] > max_layer) max_layer = f->layer[i];
        }
    for (int k = 0; k < r->n_pre; k++) n_live += snap_pre_live_at(r, k, P);
    /* the layers: before, 0 .. max, after, no layer */
    int n_slots = max_layer + 4;
    tk_snap_part *lay = tk_calloc((size_t)n_slots, sizeof *lay);
    size_t *state = tk_malloc((size_t)(n_live ? n_live : 1) * sizeof *state);
    if (!lay || !state) {
        free(lay);
        free(state);
        return snap_bad_nomem(d, "device_traces");
    }
    int n_state = 0;
    for (size_t i = 0; i <= (size_t)P; i++) {
        if (d->ev[i].action != EV_ALLOC || !snap_live_at(r, (int64_t)i, P)) continue;
        int c = category_of(d, r, f, i);
        part_add(&cats[c], (size_t)r->bsize[i]);
        if (c == C_PARAM || c == C_GRAD || c == C_OPTIM) state[n_state++] = (size_t)d->ev[i].size;
        if (c == C_ACT) {
            int l = f->layer[i], slot = l == LAYER_BEFORE ? 0 : l >= 0 ? l + 1 : l == LAYER_AFTER ? max_layer + 2 : max_layer + 3;
            part_add(&lay[slot], (size_t)r->bsize[i]);
        }
    }
    for (int k = 0; k < r->n_pre; k++) {
        if (!snap_pre_live_at(r, k, P)) continue;
        part_add(&cats[f->pre_ws[k] ? C_WORKSPACE : C_BEFORE], (size_t)r->pre[k].size);
        int b = r->pre[k].blk;
        if (!f->pre_ws[k]) state[n_state++] = (size_t)(b >= 0 && d->blks[b].requested ? d->blks[b].requested : r->pre[k].size);
    }
    for (int c = 0; c < C_N; c++) {
        if (!cats[c].blocks) continue;
        tk_snap_part *p = &pk->parts[pk->n_parts++];
        *p = cats[c];
        snprintf(p->id, sizeof p->id, "%s", CAT[c].id);
        snprintf(p->text, sizeof p->text, "%s", CAT[c].text);
    }
    qsort(pk->parts, (size_t)pk->n_parts, sizeof *pk->parts, cmp_part);
    /* layers in forward order, the empty slots dropped */
    for (int k = 0; k < n_slots; k++) {
        if (!lay[k].blocks) continue;
        int layer = k == 0 ? LAYER_BEFORE : k <= max_layer + 1 ? k - 1 : k == max_layer + 2 ? LAYER_AFTER : LAYER_NONE;
        lay[pk->n_layers] = lay[k];
        name_layer(&lay[pk->n_layers++], layer);
    }
    pk->layers = lay;
    qsort(state, (size_t)n_state, sizeof *state, cmp_size);
    pk->state_sizes = state;
    pk->n_state_sizes = n_state;
    return read_activations(d, r, f, activations_high(d, f));
}

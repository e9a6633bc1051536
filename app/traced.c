/* traced.c — the companion's named model as the planner of its advice
 * (issue 41, point 6): once `%txplan --torch-model X` traced X, the
 * session's config is X's (tk_session_set_traced), and %txadvise, %txfix
 * and a pasted message plan that config and every candidate fix by tracing
 * X's own step with the candidate's settings (batch, length, precision,
 * checkpointing, frozen embeddings or layers, optimizer) through the
 * companion's tracer (a callback into python/txkernel/trace.py), then
 * replaying the trace on the candidate's card (torchplan/torchtrace.c).
 * Nothing is scaled from another plan.
 *
 * Guarantees: a candidate the tracer cannot run (8-bit AdamW, another
 * attention, the eval batch, several GPUs, empty_cache) is refused with
 * TK_EINVAL naming the key, so the advisor does not offer it; each distinct
 * step is traced once per model (the traces are kept, at most TRACE_CACHE of
 * them), and once the advice's trace budget (seconds) is spent a step not yet
 * traced is refused too, and counted, so the advice says how many it left
 * out. The costs (FLOPs, the time per sample the advisor ranks by) are
 * txkernel's plan of a BERT of the config's dimensions, as engine: pytorch's
 * are (tk_plan_from_torchplan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tk_advisor.h"
#include "tk_embed_trace.h"
#include "tk_host_mem.h"
#include "tk_plan.h"

#define TRACE_CACHE 16

struct tk_traced_model {
    tk_config base;               /* the config the model was registered with */
    char label[160];              /* "clf (SentimentClassifier)" */
    char note[1024];              /* the model's own calls (its checkpointing, embeddings, layers) */
    tk_trace_fn fn;
    void *user;
    double budget_s;              /* seconds of tracing one advice may spend */
    struct { char *request; json_t *trace; } cache[TRACE_CACHE];
    int n_cache, next_evict;
    /* since tk_traced_begin */
    int n_traces, n_replays, n_budget, n_refused;
    double trace_s;
    char refused[512];            /* the first refusal's reason */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tk_traced_model *tk_traced_new(const tk_config *base, const char *label, const char *note, tk_trace_fn fn, void *user,
                               double budget_s) {
    if (!base || !fn) return NULL;
    tk_traced_model *t = tk_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->base = *base;
    snprintf(t->label, sizeof t->label, "%s", label ? label : "the model");
    snprintf(t->note, sizeof t->note, "%s", note ? note : "");
    t->fn = fn, t->user = user;
    t->budget_s = budget_s > 0 ? budget_s : 20.0;
    return t;
}

void tk_traced_destroy(tk_traced_model **pt) {
    if (!pt || !*pt) return;
    for (int i = 0; i < (*pt)->n_cache; i++) {
        free((*pt)->cache[i].request);
        json_decref((*pt)->cache[i].trace);
    }
    free(*pt);
    *pt = NULL;
}

const tk_config *tk_traced_config(const tk_traced_model *t) { return &t->base; }

/* c with every key the traced planner varies set back to the base's. */
static void normalise(const tk_traced_model *t, tk_config *c) {
    const tk_config *b = &t->base;
    c->batch_size = b->batch_size, c->accumulate = b->accumulate, c->max_len = b->max_len;
    c->batching = b->batching, c->buckets = b->buckets, c->precision = b->precision, c->recompute = b->recompute;
    c->freeze_embeddings = b->freeze_embeddings, c->freeze_layers = b->freeze_layers, c->optimizer = b->optimizer;
    c->adamw8_fp32_embeddings = b->adamw8_fp32_embeddings;
    memcpy(c->gpu, b->gpu, sizeof c->gpu);
    c->capacity = b->capacity, c->api = b->api, c->device = b->device, c->tf32 = b->tf32;
    c->eval_batch_size = b->eval_batch_size, c->empty_cache = b->empty_cache, c->empty_cache_every = b->empty_cache_every;
    c->attention = b->attention, c->attn_implementation = b->attn_implementation;
    c->world_size = b->world_size, c->zero = b->zero, c->parallel = b->parallel, c->bucket_cap_mb = b->bucket_cap_mb;
    memcpy(c->output_dir, b->output_dir, sizeof c->output_dir);
}

int tk_traced_describes(const tk_traced_model *t, const tk_config *c) {
    if (!t || !c) return 0;
    tk_config n = *c;
    normalise(t, &n);
    return !memcmp(&n, &t->base, sizeof n);
}

/* What the tracer cannot vary, named by the key (NULL: it can trace c). */
static const char *untraceable(const tk_traced_model *t, const tk_config *c) {
    const tk_config *b = &t->base;
    if (c->optimizer == TK_OPTIM_ADAMW8) return "optimizer: adamw8bit (the tracer runs torch's own optimizers)";
    if (c->recompute == TK_RECOMPUTE_ATTENTION) return "recompute: attention (the tracer checkpoints whole layers)";
    if (c->attention != b->attention || c->attn_implementation != b->attn_implementation)
        return "attention (the model's own attention is what is traced)";
    if (c->eval_batch_size != b->eval_batch_size) return "eval_batch_size (the traced step is a training step)";
    if (c->empty_cache != b->empty_cache || c->empty_cache_every != b->empty_cache_every)
        return "empty_cache (the replay keeps PyTorch's cache)";
    if (tk_config_world_size(c) > 1) return "world_size (the traced step is one GPU's)";
    return NULL;
}

/* The tracer's request for c: the trace's key. */
static void request_of(const tk_config *c, const int *lengths, int n, char *buf, size_t bn) {
    int seq = tk_plan_worst_len(c, lengths, n);
    const char *prec = c->precision == TK_PREC_BF16 ? "bf16" : c->precision == TK_PREC_FP16 ? "fp16" : "fp32";
    snprintf(buf, bn,
             "{\"batch\": %d, \"seq\": %d, \"precision\": \"%s\", \"checkpointing\": %s, \"freeze_embeddings\": %s, "
             "\"freeze_layers\": %d, \"optimizer\": \"%s\", \"target\": \"%s\"}",
             c->batch_size, seq, prec, c->recompute != TK_RECOMPUTE_NONE ? "true" : "false",
             c->freeze_embeddings ? "true" : "false", c->freeze_layers,
             c->optimizer == TK_OPTIM_ADAMW_FUSED ? "adamw_torch_fused" : "adamw", c->gpu[0] ? "cuda" : "cpu");
}

static tk_status keep(tk_traced_model *t, const char *request, json_t *trace, tk_err *err) {
    char *r = tk_strdup(request);
    if (!r) {
        json_decref(trace);
        return tk_err_nomem(err, "the traced model's traces");
    }
    int i = t->n_cache < TRACE_CACHE ? t->n_cache++ : t->next_evict++ % TRACE_CACHE;
    if (i < t->n_cache && t->cache[i].request) {
        free(t->cache[i].request);
        json_decref(t->cache[i].trace);
    }
    t->cache[i].request = r, t->cache[i].trace = trace;
    return TK_OK;
}

tk_status tk_traced_seed(tk_traced_model *t, const char *trace_path, tk_err *err) {
    json_error_t je;
    json_t *tr = json_load_file(trace_path, 0, &je);
    if (!tr) {
        tk_err_set(err, TK_EINVAL, "%s:%d: %s", trace_path, je.line, je.text);
        return TK_EINVAL;
    }
    char req[512];
    request_of(&t->base, NULL, 0, req, sizeof req);
    return keep(t, req, tr, err);
}

/* The trace of c's step: kept, or traced now (within the budget). */
static tk_status trace_of(tk_traced_model *t, const tk_config *c, const int *lengths, int n, json_t **out, tk_err *err) {
    char req[512];
    request_of(c, lengths, n, req, sizeof req);
    for (int i = 0; i < t->n_cache; i++)
        if (!strcmp(t->cache[i].request, req)) {
            *out = t->cache[i].trace;
            return TK_OK;
        }
    if (t->trace_s >= t->budget_s) {
        t->n_budget++;
        tk_err_set(err, TK_EINVAL, "the trace budget of %.0f s is spent", t->budget_s);
        return TK_EINVAL;
    }
    char path[] = "/tmp/txk-candidate-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "a temporary file for a candidate's trace: mkstemp failed");
        return TK_EIO;
    }
    close(fd);
    char why[512] = "";
    double t0 = now_s();
    int rc = t->fn(t->user, req, path, why, sizeof why);
    t->trace_s += now_s() - t0;
    json_t *tr = NULL;
    json_error_t je;
    if (rc == 0 && !(tr = json_load_file(path, 0, &je)))
        snprintf(why, sizeof why, "%s:%d: %s", path, je.line, je.text);
    unlink(path);
    if (!tr) {
        t->n_refused++;
        if (!t->refused[0]) snprintf(t->refused, sizeof t->refused, "%s", why[0] ? why : "the tracer failed");
        tk_err_set(err, TK_EINVAL, "%s: %s", t->label, why[0] ? why : "the tracer failed");
        return TK_EINVAL;
    }
    t->n_traces++;
    tk_status st = keep(t, req, tr, err);
    if (st == TK_OK) *out = tr;
    return st;
}

tk_status tk_traced_plan(void *ctx, const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err) {
    tk_traced_model *t = ctx;
    const char *no = untraceable(t, c);
    if (no) {
        t->n_refused++;
        if (!t->refused[0]) snprintf(t->refused, sizeof t->refused, "%s", no);
        tk_err_set(err, TK_EINVAL, "%s: not traced: %s", t->label, no);
        return TK_EINVAL;
    }
    json_t *tr = NULL;
    tk_status st = trace_of(t, c, lengths, n, &tr, err);
    if (st != TK_OK) return st;
    tk_torchtrace_result *r = tk_calloc(1, sizeof *r);
    if (!r) return tk_err_nomem(err, "a traced candidate's plan");
    st = tk_torchtrace_plan(tr, c->gpu[0] ? c->gpu : NULL, c->torch_version, r, err);
    if (st == TK_OK) {
        t->n_replays++;
        st = tk_plan_from_torchplan(c, lengths, n, &r->plan, out, err);
    }
    if (st == TK_OK && !c->gpu[0] && c->capacity) { /* a capacity without a card: the step as the CPU runs it, in it */
        out->capacity = c->capacity;
        out->fits = out->peak_reserved <= out->capacity;
        out->margin = (int64_t)out->capacity - (int64_t)out->peak_reserved;
    }
    free(r);
    return st;
}

void tk_traced_begin(tk_traced_model *t) {
    if (!t) return;
    t->n_traces = t->n_replays = t->n_budget = t->n_refused = 0;
    t->trace_s = 0;
    t->refused[0] = 0;
}

void tk_traced_summary(const tk_traced_model *t, char *buf, size_t n) {
    size_t w = (size_t)snprintf(buf, n, "Planned by tracing %s: its own training step, and each candidate's step traced "
                                        "with the candidate's settings (%d traced in %.1f s, %d replays on the cards)",
                                t->label, t->n_traces, t->trace_s, t->n_replays);
    if (w < n && t->n_budget)
        w += (size_t)snprintf(buf + w, n - w, "; %d candidates not planned: past the trace budget of %.0f s",
                              t->n_budget, t->budget_s);
    if (w < n && t->n_refused)
        w += (size_t)snprintf(buf + w, n - w, "; %d not traceable (first: %s)", t->n_refused, t->refused);
    if (w < n) w += (size_t)snprintf(buf + w, n - w, ".%s%s", t->note[0] ? " " : "", t->note);
}

const char *tk_traced_label(const tk_traced_model *t) { return t->label; }

/* tk_embed_trace.h — the companion's way to a traced plan (issue 41): the
 * trace python/txkernel/trace.py wrote, planned by torchplan/torchtrace.c
 * and rendered as engine: pytorch's report (app/report_torchtrace.c); and
 * the traced model as the planner of the session's advice (app/traced.c). */
#ifndef TK_EMBED_TRACE_H
#define TK_EMBED_TRACE_H

#include <stddef.h>
#include <jansson.h>
#include "tk_torchtrace.h"
#include "tk_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bundle (text/plain, text/html, application/json) as a JSON string
 * (new; free with tk_embed_free), or NULL with errbuf holding the error
 * (the trace file and line, the key, the card). gpu: a profile name, or
 * NULL/"" for the step as the CPU runs it; gpus: a platform (each of its
 * cards) instead; torch_version: "2" (2.x), "2.0" .. "2.15", "1.13", "1.10". */
char *tk_embed_plan_trace(const char *trace_path, const char *gpu, const char *gpus, const char *torch_version,
                          char *errbuf, size_t errlen);

/* A traced plan's bundle (new reference; NULL when out of host memory). */
json_t *tk_report_torchtrace(const tk_torchtrace_result *r);
/* The trace planned on each one-GPU card of `platform`, as a table bundle. */
tk_status tk_torchtrace_gpus_report(const json_t *trace, tk_torch_version v, const char *platform, json_t **out,
                                    tk_err *err);

/* ---- the traced model as the advice's planner (app/traced.c) ---------- */

/* The companion's tracer: traces the registered model's training step for
 * `request`, a JSON object {"batch", "seq", "precision": "fp32"|"fp16"|
 * "bf16", "checkpointing": bool, "freeze_embeddings": bool,
 * "freeze_layers": N, "optimizer": "adamw"|"adamw_torch_fused", "target":
 * "cuda"|"cpu"} (borrowed), writing trace.py's JSON to `out_path`. 0, or
 * -1 with errbuf holding why (the module and op, or what it cannot vary). */
typedef int (*tk_trace_fn)(void *user, const char *request, const char *out_path, char *errbuf, size_t errlen);

typedef struct tk_traced_model tk_traced_model;

/* A traced model (new; NULL when out of host memory or without base/fn):
 * `base` (copied) is its config as planned (engine: pytorch, its shape from
 * its own config, batch, max_len, precision, recompute, frozen embeddings,
 * card); label names it ("clf (SentimentClassifier)"); note (may be NULL)
 * names its own calls for the fixes; fn/user its tracer (user borrowed: it
 * must outlive the model); budget_s the seconds of tracing one advice may
 * spend (<= 0: 20). */
tk_traced_model *tk_traced_new(const tk_config *base, const char *label, const char *note, tk_trace_fn fn, void *user,
                               double budget_s);
void tk_traced_destroy(tk_traced_model **pt);
/* Keeps the trace at trace_path as the base config's step (the trace
 * %txplan already made), so the advice does not trace it again. */
tk_status tk_traced_seed(tk_traced_model *t, const char *trace_path, tk_err *err);
const tk_config *tk_traced_config(const tk_traced_model *t);
const char *tk_traced_label(const tk_traced_model *t);
/* 1 when `c` is the model's config with only what the planner varies
 * changed (batch, accumulation, length, padding, precision, checkpointing,
 * frozen weights, optimizer, card, api, and what it refuses): the config a
 * %txfix of its advice leaves. */
int tk_traced_describes(const tk_traced_model *t, const tk_config *c);
/* tk_plan_fn (advisor/tk_advisor.h) with ctx a tk_traced_model: c's step
 * traced (or kept from an earlier trace of the same settings) and replayed
 * on c's card. */
tk_status tk_traced_plan(void *ctx, const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err);
/* Zeroes the counts tk_traced_summary reports: call before an advice. */
void tk_traced_begin(tk_traced_model *t);
/* One line for the advice: planned by tracing LABEL, how many steps were
 * traced in how many seconds, what the budget or the tracer left out, and
 * the model's own calls. */
void tk_traced_summary(const tk_traced_model *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif

/* tk_embed_trace.h — the companion's way to a traced plan (issue 41): the
 * trace python/txkernel/trace.py wrote, planned by torchplan/torchtrace.c
 * and rendered as engine: pytorch's report (app/report_torchtrace.c). */
#ifndef TK_EMBED_TRACE_H
#define TK_EMBED_TRACE_H

#include <stddef.h>
#include <jansson.h>
#include "tk_torchtrace.h"

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

#ifdef __cplusplus
}
#endif
#endif

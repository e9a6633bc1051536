/* dtype.c — status and error text, dtypes, allocation categories, and the
 * fp16/bf16 <-> fp32 conversions every backend and reader shares.
 *
 * Guarantees: conversions round to nearest even and keep NaN a NaN (quiet)
 * and infinities infinite; names are stable strings used in JSON and in
 * messages, so other modules may compare against them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "tk_gpu.h"
#include "tk_ops_spec.h"

void tk_err_set(tk_err *err, tk_status st, const char *fmt, ...) {
    if (!err) return;
    err->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

tk_status tk_err_nomem(tk_err *err, const char *what) {
    if (what && *what) tk_err_set(err, TK_ENOMEM, "%s: out of host memory", what);
    else tk_err_set(err, TK_ENOMEM, "out of host memory");
    return TK_ENOMEM;
}

const char *tk_status_name(tk_status st) {
    switch (st) {
    case TK_OK: return "ok";
    case TK_EOOM: return "out of memory";
    case TK_EINVAL: return "invalid argument";
    case TK_EIO: return "i/o error";
    case TK_ECANCEL: return "cancelled";
    case TK_EDEVICE: return "device error";
    case TK_EFORMAT: return "malformed input";
    case TK_ENOMEM: return "out of host memory";
    }
    return "unknown status";
}

static const struct { const char *name; size_t size; } dtypes[TK_DTYPE_COUNT] = {
    [TK_F32] = {"f32", 4}, [TK_F16] = {"f16", 2}, [TK_BF16] = {"bf16", 2},
    [TK_I8] = {"i8", 1},   [TK_U8] = {"u8", 1},   [TK_I32] = {"i32", 4},
    [TK_I64] = {"i64", 8},
};

size_t tk_dtype_size(tk_dtype dt) {
    return (unsigned)dt < TK_DTYPE_COUNT ? dtypes[dt].size : 0;
}

const char *tk_dtype_name(tk_dtype dt) {
    return (unsigned)dt < TK_DTYPE_COUNT ? dtypes[dt].name : "?";
}

/* Accepts our short names and the spellings users bring from PyTorch and
 * safetensors ("float32", "F16", "bfloat16", "int32"). */
int tk_dtype_parse(const char *s, tk_dtype *out) {
    static const struct { const char *s; tk_dtype dt; } alias[] = {
        {"float32", TK_F32}, {"float", TK_F32}, {"fp32", TK_F32},
        {"float16", TK_F16}, {"half", TK_F16}, {"fp16", TK_F16},
        {"bfloat16", TK_BF16}, {"int8", TK_I8}, {"uint8", TK_U8},
        {"int32", TK_I32}, {"int64", TK_I64},
    };
    if (!s || !out) return -1;
    for (int i = 0; i < TK_DTYPE_COUNT; i++)
        if (strcasecmp(s, dtypes[i].name) == 0) { *out = (tk_dtype)i; return 0; }
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcasecmp(s, alias[i].s) == 0) { *out = alias[i].dt; return 0; }
    return -1;
}

const char *tk_cat_name(tk_cat c) {
    static const char *names[TK_CAT_COUNT] = {
        [TK_CAT_PARAM] = "param", [TK_CAT_GRAD] = "grad", [TK_CAT_OPTIM] = "optim",
        [TK_CAT_ACT] = "act", [TK_CAT_TEMP] = "temp", [TK_CAT_WORKSPACE] = "workspace",
        [TK_CAT_INPUT] = "input",
    };
    return (unsigned)c < TK_CAT_COUNT ? names[c] : "?";
}

/* The rules are tk_ops_spec.h's, shared with both backends' kernels. */
uint16_t tk_f32_to_f16(float f) { return tk_spec_f32_to_f16(f); }
float tk_f16_to_f32(uint16_t h) { return tk_spec_f16_to_f32(h); }
uint16_t tk_f32_to_bf16(float f) { return tk_spec_f32_to_bf16(f); }
float tk_bf16_to_f32(uint16_t h) { return tk_spec_bf16_to_f32(h); }

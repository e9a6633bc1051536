/* tk_fix_code.h — the pieces of fix code that the pasted-message reader
 * (oom_message.c, which builds alone for its fuzz target) and the advice's
 * fix code (fix_code.c) both write; not part of the advisor's interface. */
#ifndef TK_FIX_CODE_H
#define TK_FIX_CODE_H

#include <stdio.h>
#include "tk_config.h"

/* The opening of a TrainingArguments line that constructs as written in the
 * user's transformers: "TrainingArguments(output_dir=\"out\", " with the
 * config's output_dir; without one, transformers 5.x defaults it
 * ("TrainingArguments("), while 4.x requires it, so a named placeholder
 * stands there. Returns buf. */
static inline const char *tk_ta_open(char *buf, size_t n, const char *output_dir, tk_torch_version v) {
    if (output_dir && *output_dir) snprintf(buf, n, "TrainingArguments(output_dir=\"%s\", ", output_dir);
    else if (v == TK_TORCH_2) snprintf(buf, n, "TrainingArguments(");
    else snprintf(buf, n, "TrainingArguments(output_dir=\"YOUR_OUTPUT_DIR\", ");
    return buf;
}

#endif

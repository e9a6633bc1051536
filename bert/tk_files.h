/* tk_files.h — folder creation shared by everything in bert/ that writes:
 * the model folder (model.c), checkpoints (checkpoint.c), the HF cache
 * (hub.c) and the learned-vocabulary cache (pipeline.c).
 *
 * One helper so every writer creates parents the same way (`mkdir -p`) and
 * names the same thing when it cannot: the path asked for and the part of it
 * that failed. Also the JSON files those writers leave (config.json,
 * tokenizer files): dumped and written atomically in one place.
 */
#ifndef TK_FILES_H
#define TK_FILES_H

#include "tk_gpu.h"

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates folder `path` and any missing parents, as `mkdir -p` does (mode
 * 0755, less the umask); an existing folder is fine. Returns TK_OK, or
 * TK_EIO with err naming `path`, the component that could not be made and
 * why ("out/a: cannot create folder out: Not a directory (it is a file)"). */
tk_status tk_mkdirs(const char *path, tk_err *err);

/* Writes j as JSON (json_dumps with `flags`) and a newline to path,
 * atomically (tk_write_file_atomic). TK_ENOMEM naming path when the text
 * cannot be made; else tk_write_file_atomic's status. j is borrowed. */
tk_status tk_write_json_atomic(const char *path, const json_t *j, size_t flags, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

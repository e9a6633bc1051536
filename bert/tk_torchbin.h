/* tk_torchbin.h — a model folder's weights in each form HF ships them, and
 * reading pytorch_model.bin (torch.save of a state dict,
 * zip or legacy format) without Python, through the restricted pickle
 * reader: the tensors come back as an in-memory safetensors image, so the
 * model loads them as it loads model.safetensors. See torchbin.c. */
#ifndef TK_TORCHBIN_H
#define TK_TORCHBIN_H

#include <stdint.h>
#include "tk_gpu.h"
#include "tk_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* New reference, or NULL with err naming the file (and the tensor, the
 * refused global or the byte offset where it applies). */
tk_st_file *tk_torch_bin_open(const char *path, tk_err *err);
/* The same from memory (buf borrowed for the call; `name` for messages). */
tk_st_file *tk_torch_bin_parse(const uint8_t *buf, size_t len, const char *name, tk_err *err);

/* The weights file of `path` (a folder: model.safetensors, then
 * model.safetensors.index.json, pytorch_model.bin,
 * pytorch_model.bin.index.json; or such a file itself) into file (n bytes).
 * 1 when there is one, 0 when not. */
int tk_checkpoint_find(const char *path, char *file, size_t n);
/* Opens it: one file directly, shards merged into one image. `file` gets
 * the file opened (for messages). New reference, or NULL with err. */
tk_st_file *tk_checkpoint_open(const char *path, char *file, size_t n, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

/* tk_safetensors.h — reading and writing the safetensors format.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON (an object
 * of name -> {"dtype","shape","data_offsets":[begin,end)} plus an optional
 * "__metadata__" string map, padded with spaces), then the data buffer.
 *
 * Guarantees of the reader: a file is accepted only if the header is at most
 * 100 MB, starts with '{', is valid JSON without duplicate keys, every entry
 * has a known dtype, a shape of non-negative dims and offsets whose length is
 * numel * dtype size, and the entries tile the data buffer exactly (no gap,
 * no overlap, no trailing byte). Errors name the file and the tensor.
 * The writer pads the header to a multiple of 8 and writes atomically
 * (temp file in the same folder, fsync, rename), so a crash never leaves a
 * half-written file under the final name.
 */
#ifndef TK_SAFETENSORS_H
#define TK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TK_ST_MAX_HEADER 100000000ull
#define TK_ST_MAX_DIMS 8

/* The dtypes of the format, with their element sizes. */
typedef enum {
    TK_ST_F64 = 0, TK_ST_F32, TK_ST_F16, TK_ST_BF16, TK_ST_I64, TK_ST_I32, TK_ST_I16,
    TK_ST_I8, TK_ST_U8, TK_ST_BOOL, TK_ST_DTYPE_COUNT
} tk_st_dtype;
const char *tk_st_dtype_name(tk_st_dtype dt); /* "F32" */
size_t tk_st_dtype_size(tk_st_dtype dt);

typedef struct tk_st_entry {
    char *name;                       /* owned by the file */
    tk_st_dtype dtype;
    int ndim;
    int64_t shape[TK_ST_MAX_DIMS];
    uint64_t begin, end;              /* within the data buffer */
} tk_st_entry;

typedef struct tk_st_file tk_st_file;

/* Opens and validates a file (the data is memory-mapped, read-only).
 * New reference; NULL with err filled on any violation. */
tk_st_file *tk_st_open(const char *path, tk_err *err);
/* Opens a sharded checkpoint through its model.safetensors.index.json: each
 * shard the "weight_map" names (a file beside the index) is opened and
 * checked as tk_st_open does, and the result reads as one file (the shards
 * are mapped side by side in one address range). Every tensor the index
 * names must be in its shard, and no name may be in two shards. New
 * reference; NULL with err naming the index, shard or tensor. */
tk_st_file *tk_st_open_index(const char *index_path, tk_err *err);
/* Parses an in-memory image (borrowed; must outlive the result). `what`
 * names it in errors. */
tk_st_file *tk_st_parse(const void *buf, size_t len, const char *what, tk_err *err);
void tk_st_close(tk_st_file **pf);
/* The same, taking ownership of buf (malloc'd): freed on close, or at once
 * when parsing fails. */
tk_st_file *tk_st_parse_owned(void *buf, size_t len, const char *what, tk_err *err);

/* One tensor for tk_st_image: its bytes at `data` (borrowed), or written by
 * fill(ud, dst) when fill is set (a strided view copied out, say). */
typedef struct tk_st_part {
    const char *name;
    tk_st_dtype dtype;
    int ndim;
    int64_t shape[TK_ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    void (*fill)(void *ud, uint8_t *dst);
    void *ud;
} tk_st_part;
/* An in-memory safetensors image of n tensors (copied), so other checkpoint
 * formats (pytorch_model.bin, shards) load through the one reader. New
 * reference, or NULL with err. */
tk_st_file *tk_st_image(const tk_st_part *parts, int n, const char *what, tk_err *err);

int tk_st_count(const tk_st_file *f);
const tk_st_entry *tk_st_at(const tk_st_file *f, int i);          /* borrowed, sorted by offset */
const tk_st_entry *tk_st_find(const tk_st_file *f, const char *name); /* NULL if absent */
const void *tk_st_data(const tk_st_file *f, const tk_st_entry *e); /* borrowed bytes */
int64_t tk_st_numel(const tk_st_entry *e);
/* "__metadata__" value for key (borrowed), NULL if absent. */
const char *tk_st_metadata(const tk_st_file *f, const char *key);
/* Converts an F32, F16 or BF16 entry into n = numel floats. */
tk_status tk_st_read_f32(const tk_st_file *f, const tk_st_entry *e, float *out, tk_err *err);

/* ---- writer ---- */
typedef struct tk_st_writer tk_st_writer;
tk_st_writer *tk_st_writer_new(void);
void tk_st_writer_destroy(tk_st_writer **pw);
/* Adds a tensor. `data` (nbytes = numel * size) is borrowed until
 * tk_st_writer_write returns. Duplicate names are rejected. */
tk_status tk_st_writer_add(tk_st_writer *w, const char *name, tk_st_dtype dt, int ndim,
                           const int64_t *shape, const void *data, tk_err *err);
tk_status tk_st_writer_metadata(tk_st_writer *w, const char *key, const char *value, tk_err *err);
/* Writes the file atomically. */
tk_status tk_st_writer_write(tk_st_writer *w, const char *path, tk_err *err);

/* Writes n bytes to path atomically: path.tmp.<pid> in the same folder,
 * fsync, rename over path, fsync of the folder. */
tk_status tk_write_file_atomic(const char *path, const void *const *parts, const size_t *sizes,
                               int nparts, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

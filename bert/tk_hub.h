/* tk_hub.h — `model:` to a local folder: a folder on disk, the HF cache, or
 * the HF hub.
 *
 * tk_hub_resolve turns what a config's `model:` says into a folder holding
 * config.json, the tokenizer files and the weights:
 *   1. an existing path (folder or file) is used as it is;
 *   2. a hub id ("org/name"; a preset such as bert-base-cased is an alias of
 *      the id Google or HF publish it under, tk_hub_alias) whose snapshot in
 *      the HF cache holds the files needed is used with no network request;
 *   3. otherwise the missing files are downloaded from the hub's resolve
 *      API ($HF_ENDPOINT/{repo}/resolve/{revision}/{file}) into the cache.
 *
 * The cache is huggingface_hub's own layout and variables, so either side
 * uses what the other fetched: $HF_HUB_CACHE (else $HF_HOME/hub, else
 * ~/.cache/huggingface/hub) / models--ORG--NAME / {blobs/<etag>,
 * snapshots/<commit>/<file> (a relative link to ../../blobs/<etag>),
 * refs/<revision> (the commit)}. HF_ENDPOINT, HF_TOKEN (else the token file
 * huggingface_hub writes, $HF_TOKEN_PATH or $HF_HOME/token) and
 * HF_HUB_OFFLINE=1 are honoured.
 *
 * Guarantees: only the files a run needs are fetched, and only those the
 * repo has (its file list, the "siblings" of GET
 * $HF_ENDPOINT/api/models/{repo}/revision/{commit}, as huggingface_hub's
 * snapshot_download reads it; a hub that does not serve it is asked file by
 * file): config.json, the tokenizer (vocab.txt and/or tokenizer.json: a
 * transformers 5 repo has only the latter), tokenizer_config.json and
 * special_tokens_map.json, and the weights: model.safetensors, else the
 * shards a model.safetensors.index.json names, else pytorch_model.bin. A
 * snapshot is whole with config.json and either tokenizer file. A download
 * goes to blobs/<etag>.incomplete and resumes from its length with an HTTP
 * Range request; an LFS file's sha256 must equal its etag, in the cache as
 * after a download; a blob appears only whole, by rename, written under
 * the flock huggingface_hub takes on .locks/<repo>/<etag>.lock. Every error says
 * what to do: which token variable to set (401/403), the repo, revision and
 * file (404), HF_HUB_OFFLINE or a local folder (no network), the cache path
 * (disk full). Nothing here exits.
 */
#ifndef TK_HUB_H
#define TK_HUB_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Progress of one file: `done` of `total` bytes (total 0 = unknown). Called
 * during a download, and once when the file is complete. Nonzero cancels
 * (TK_ECANCEL; the partial file stays for the next run to resume). */
typedef int (*tk_hub_progress_fn)(void *ud, const char *file, int64_t done, int64_t total);

typedef struct tk_hub_opts {
    int weights;        /* 1: the weights too; 0: config and tokenizer files only */
    int offline;        /* 1: the cache only (as HF_HUB_OFFLINE=1) */
    tk_hub_progress_fn progress; /* may be NULL */
    void *ud;
} tk_hub_opts;

/* What resolution did, for the user. */
typedef struct tk_hub_info {
    int local;          /* 1: model was a path on disk */
    char repo[256];     /* hub id ("google-bert/bert-base-cased"); "" when local */
    char commit[64];    /* the snapshot's commit */
    int n_downloaded;   /* files fetched now (0: all from the cache) */
    int64_t bytes_downloaded;
    char weights[64];   /* the weights file found: "model.safetensors", ... ("" without weights) */
} tk_hub_info;

/* `model` (a path, hub id or preset) at `revision` (branch, tag or 40-hex
 * commit; NULL or "" = main) to a local folder written to dir (n bytes).
 * `o` may be NULL (weights, online, no progress); `info` may be NULL. */
tk_status tk_hub_resolve(const char *model, const char *revision, const tk_hub_opts *o, char *dir, size_t n,
                         tk_hub_info *info, tk_err *err);

/* The hub id a preset name stands for ("bert-base-cased" ->
 * "google-bert/bert-base-cased", "bert-tiny" -> "prajjwal1/bert-tiny");
 * NULL when the name is not a preset. Borrowed. */
const char *tk_hub_alias(const char *name);

/* 1 when s has the shape of a hub id ("org/name", the characters the hub
 * allows), whether or not such a repo exists. */
int tk_hub_is_repo_id(const char *s);

/* The cache folder in use (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub). */
void tk_hub_cache_dir(char *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif

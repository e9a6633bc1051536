/* tk_checkpoint.h — checkpoint-STEP folders: everything a run needs to go on
 * exactly where it stopped.
 *
 * A checkpoint folder is an HF model folder (model.safetensors, config.json,
 * vocab.txt) plus optimizer.safetensors (AdamW moments; 8-bit AdamW's
 * quantised moments and their per-block scales) and trainer_state.json
 * (step, epoch, position in the epoch's order, the dropout step counter, the
 * fp16 loss scaler, the schedule, the config that made it, the metrics so
 * far, and the size and checksum of every other file).
 *
 * Guarantees:
 *  - A save writes into output_dir/.checkpoint-STEP.tmp, each file fsync'd,
 *    then fsyncs that folder, renames it to checkpoint-STEP and fsyncs
 *    output_dir; only then are checkpoints beyond keep_checkpoints removed.
 *    A kill at any moment leaves every earlier checkpoint complete and at
 *    most a .tmp folder, which the next save removes.
 *  - A failed save (ENOSPC, EFBIG, ...) removes its .tmp folder and returns
 *    the error; earlier checkpoints are untouched.
 *  - Loading verifies every file's size and checksum first and compares the
 *    settings that decide the arithmetic with the run's; a mismatch or a
 *    damaged file is an error naming the setting or the file, before any
 *    weight or moment is changed.
 *  - Saving reads tensors to host memory; it allocates nothing on the device,
 *    so the planner has nothing to count for it.
 *
 * Ownership: models, optimizers and configs are borrowed. A loaded
 * tk_train_state owns its history (tk_train_state_clear).
 */
#ifndef TK_CHECKPOINT_H
#define TK_CHECKPOINT_H

#include <stdint.h>
#include "tk_train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a run stands between two optimizer steps. */
typedef struct tk_train_state {
    int64_t step;               /* loop steps done (fp16 skipped steps included) */
    int epoch;                  /* 0-based epoch the next step belongs to */
    int position;               /* micro-batches of that epoch's order already used */
    uint64_t micro;             /* micro-steps so far (seeds dropout) */
    double ep_loss, log_loss;   /* loss sums of the epoch and of the progress window */
    int64_t ep_rows, log_rows;
    double ep_seconds, run_seconds;
    int oom_retried;            /* empty_cache on_oom already used its one retry */
    tk_loss_scaler scaler;
    tk_sched sched;
    int n_train;                /* training micro-batches per epoch */
    uint64_t data_digest;       /* of the training batches (tk_ckpt_data_digest) */
    int n_history;
    tk_epoch_stats *history;    /* save: borrowed; load: owned */
    /* save, sharded state (ZeRO 1/2): per optimizer slot i, optim_full[4i+j]
     * is moment j of the whole parameter in host memory, gathered from
     * every rank (tk_dp_gather_state); NULL: the optimizer's own tensors */
    void *const *optim_full;
} tk_train_state;

void tk_train_state_clear(tk_train_state *s);

/* FNV-1a over every training batch's shape, ids, types, mask and labels:
 * a resumed run must see the batches the saved one saw. */
uint64_t tk_ckpt_data_digest(const tk_batch *train, int n_train);

/* Writes out_dir/checkpoint-<s->step> as above (vocab may be NULL or "":
 * no vocab.txt), then prunes to c->keep_checkpoints. `path` (pn bytes, may
 * be NULL) gets the folder written. TK_EIO with err naming the file and the
 * system's reason when the disk is full. */
tk_status tk_ckpt_save(const char *out_dir, tk_model *m, tk_adamw *o, const tk_config *c,
                       const char *vocab, const tk_train_state *s, char *path, size_t pn,
                       tk_err *err);

/* Steps of the checkpoint-STEP folders in dir, newest first (new array,
 * free(); *steps NULL when there are none). Returns the count (0 also when
 * dir does not exist). */
int tk_ckpt_list(const char *dir, int64_t **steps);

/* 1: dir holds a trainer_state.json (a checkpoint, not a bare HF folder). */
int tk_ckpt_is_checkpoint(const char *dir);

/* 1: checkpoint folder dir was written by txkernel (its trainer_state.json
 * carries txkernel's format); else 0 with why (wn bytes, may be NULL) saying
 * whose it is as far as the file shows (a transformers Trainer's, ...).
 * Rotation removes, and resume_from: auto takes, only txkernel's. */
int tk_ckpt_is_ours(const char *dir, char *why, size_t wn);

/* The file that marks an output_dir as txkernel's (written by
 * tk_ckpt_claim_output_dir). */
#define TK_OUTPUT_MANIFEST "txkernel_output.json"

/* Before a run writes into c->output_dir (made now, as mkdir -p): an
 * output_dir that holds a model or checkpoints txkernel did not write (HF
 * weights or config, a Trainer's state, another tool's checkpoint-STEP) and
 * no TK_OUTPUT_MANIFEST nor txkernel checkpoint is refused, TK_EINVAL with
 * err naming the files, nothing in it touched, unless c->overwrite; an
 * output_dir of txkernel's (its earlier run, to resume) is taken as it is.
 * Then the manifest is written if missing. TK_EIO when the folder cannot
 * be made or marked. "" output_dir: TK_OK, nothing done. */
tk_status tk_ckpt_claim_output_dir(const tk_config *c, tk_err *err);

/* Checks that every file the state records has its size and checksum, and
 * that the state itself parses. TK_EIO naming the file otherwise. */
tk_status tk_ckpt_verify(const char *dir, tk_err *err);

/* Verifies dir, refuses it when it was made by a different model, config or
 * data (err names the setting, its value there and here), then loads the
 * weights into m and the moments into o (allocated now) and fills s. On an
 * error m and o are unchanged unless err says a tensor failed mid-load. */
tk_status tk_ckpt_load(const char *dir, tk_model *m, tk_adamw *o, const tk_config *c,
                       int n_train, uint64_t data_digest, tk_train_state *s, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

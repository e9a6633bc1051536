/* checkpoint.c — writing, finding, verifying and loading checkpoint-STEP
 * folders (see tk_checkpoint.h for the layout and the guarantees).
 *
 * Why a folder rename: each file is already written atomically, but a run
 * killed between two files would leave a folder whose weights and moments
 * come from different steps. Building the whole folder under a .tmp name and
 * renaming it makes the folder appear complete or not at all.
 *
 * Numbers in trainer_state.json round-trip exactly: doubles are printed
 * with 17 significant digits, and non-finite values (a NaN dev loss when
 * there is no dev set) are written as null.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tk_checkpoint.h"
#include "tk_files.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h"

#define STATE_FILE "trainer_state.json"
#define OPTIM_FILE "optimizer.safetensors"
#define FORMAT_NAME "txkernel-checkpoint-1"
#define MANIFEST_FORMAT "txkernel-output-1"

void tk_train_state_clear(tk_train_state *s) {
    if (!s)
        return;
    free(s->history);
    memset(s, 0, sizeof *s);
}

/* ---- hashing ------------------------------------------------------------ */

#define FNV_OFF 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

/* FNV-1a over 8-byte words (then the tail bytes): eight times fewer
 * multiplies than byte-wise FNV, which matters for a 1.3 GB bert-base
 * checkpoint read back after every save. */
static uint64_t fnv_words(uint64_t h, const unsigned char *p, size_t n) {
    size_t w = n / 8;
    for (size_t i = 0; i < w; i++) {
        uint64_t x;
        memcpy(&x, p + 8 * i, 8);
        h = (h ^ x) * FNV_PRIME;
    }
    return fnv(h, p + 8 * w, n - 8 * w);
}

uint64_t tk_ckpt_data_digest(const tk_batch *train, int n_train) {
    uint64_t h = FNV_OFF;
    for (int i = 0; i < n_train; i++) {
        const tk_batch *b = &train[i];
        size_t bt = (size_t)b->B * (size_t)b->T;
        h = fnv(h, &b->B, sizeof b->B);
        h = fnv(h, &b->T, sizeof b->T);
        if (b->input_ids) h = fnv_words(h, (const unsigned char *)b->input_ids, bt * 4);
        if (b->attention_mask) h = fnv_words(h, (const unsigned char *)b->attention_mask, bt * 4);
        if (b->labels) h = fnv(h, b->labels, (size_t)b->B * 4);
        if (b->start_positions) h = fnv(h, b->start_positions, (size_t)b->B * 4);
        if (b->end_positions) h = fnv(h, b->end_positions, (size_t)b->B * 4);
    }
    return h;
}

/* Size and checksum of a file as it is on disk. */
static tk_status file_digest(const char *path, uint64_t *size, uint64_t *hash, tk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "%s: cannot open: %s", path, strerror(errno));
        return TK_EIO;
    }
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = tk_malloc(CHUNK);
    if (!buf) {
        close(fd);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        return TK_ENOMEM;
    }
    uint64_t h = FNV_OFF, total = 0;
    size_t have = 0;
    tk_status st = TK_OK;
    for (;;) {
        ssize_t k = read(fd, buf + have, CHUNK - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            tk_err_set(err, TK_EIO, "%s: read failed: %s", path, strerror(errno));
            st = TK_EIO;
            break;
        }
        have += (size_t)k;
        total += (uint64_t)k;
        /* hash whole chunks only, so word boundaries do not depend on how
         * read() splits the file */
        if (have == CHUNK || k == 0) {
            h = fnv_words(h, buf, have);
            have = 0;
        }
        if (k == 0)
            break;
    }
    free(buf);
    close(fd);
    *size = total;
    *hash = h;
    return st;
}

/* ---- small file helpers -------------------------------------------------- */

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[TK_PATH_MAX * 2];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static tk_status fsync_dir(const char *dir, tk_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        tk_err_set(err, TK_EIO, "%s: cannot fsync the folder: %s", dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return TK_EIO;
    }
    close(fd);
    return TK_OK;
}

static tk_status copy_file(const char *from, const char *to, tk_err *err) {
    FILE *f = fopen(from, "rb");
    if (!f) {
        tk_err_set(err, TK_EIO, "%s: cannot read: %s", from, strerror(errno));
        return TK_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = tk_malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = tk_realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        tk_err_set(err, TK_EIO, "%s: cannot read", from);
        return TK_EIO;
    }
    const void *parts[1] = {buf};
    size_t sizes[1] = {n};
    tk_status st = tk_write_file_atomic(to, parts, sizes, 1, err);
    free(buf);
    return st;
}

/* The kill campaign's way into the middle of a save: TXK_TEST_SAVE_DELAY_MS
 * sleeps between the files of a checkpoint so a SIGKILL lands inside one. */
static void test_delay(void) {
    const char *v = getenv("TXK_TEST_SAVE_DELAY_MS");
    long ms = v ? strtol(v, NULL, 10) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- JSON helpers ---------------------------------------------------------- */

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static double jget_num(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int64_t jget_int(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)jget_num(o, k);
}

/* The settings that decide a run's arithmetic: a checkpoint made under
 * other values is not this run's. output_dir, resume_from, log_every,
 * save_every, keep_checkpoints, save_error, device, threads and the
 * simulated capacity may change between the two; so may world_size, zero
 * and accumulate while a step takes as many micro-batches as before
 * (accumulate x world_size: the global batch; AdamW's state is saved whole,
 * each rank takes its piece). Only the same world_size and zero resume bit
 * for bit. */
static json_t *run_settings(const tk_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(c->model));
    json_object_set_new(o, "train_file", json_string(c->train_file));
#define I(f) json_object_set_new(o, #f, json_integer(c->f))
#define F(f) json_object_set_new(o, #f, json_real((double)c->f))
    I(hidden); I(layers); I(heads); I(intermediate); I(vocab_size); I(max_position);
    I(type_vocab); I(lowercase); F(dropout); I(task); I(head); I(head_units); I(towers);
    I(num_labels); I(max_len); I(doc_stride); I(batch_size); I(epochs); I(max_steps);
    F(lr); F(weight_decay); F(warmup_ratio); F(max_grad_norm); F(adam_beta1); F(adam_beta2);
    F(adam_eps); I(precision); I(recompute); I(freeze_embeddings);
    I(freeze_layers); I(optimizer); I(adamw8_fp32_embeddings); I(attention); I(batching);
    I(buckets);
#undef I
    json_object_set_new(o, "micro_batches_per_step",
                        json_integer((c->accumulate > 1 ? c->accumulate : 1) * tk_config_world_size(c)));
#undef F
    json_object_set_new(o, "schedule", json_string(c->schedule));
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    json_object_set_new(o, "seed", json_string(seed));
    return o;
}

static json_t *history_json(const tk_epoch_stats *h, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "epoch", json_integer(h[i].epoch));
        json_object_set_new(e, "train_loss", jnum(h[i].train_loss));
        json_object_set_new(e, "eval_loss", jnum(h[i].dev_loss));
        json_object_set_new(e, "eval_accuracy", jnum(h[i].dev_acc));
        json_object_set_new(e, "eval_f1", jnum(h[i].dev_f1));
        json_object_set_new(e, "eval_exact_match", jnum(h[i].dev_em));
        json_object_set_new(e, "eval_span_f1", jnum(h[i].dev_span_f1));
        json_object_set_new(e, "samples_per_second", jnum(h[i].samples_per_s));
        json_object_set_new(e, "seconds", jnum(h[i].seconds));
        json_object_set_new(e, "peak_allocated", json_integer((json_int_t)h[i].peak_allocated));
        json_object_set_new(e, "peak_reserved", json_integer((json_int_t)h[i].peak_reserved));
        json_array_append_new(a, e);
    }
    return a;
}

static tk_epoch_stats *history_from_json(const json_t *a, int *n) {
    size_t k = json_array_size(a);
    tk_epoch_stats *h = tk_calloc(k ? k : 1, sizeof *h);
    if (!h)
        return NULL;
    for (size_t i = 0; i < k; i++) {
        const json_t *e = json_array_get(a, i);
        h[i].epoch = (int)jget_int(e, "epoch");
        h[i].train_loss = (float)jget_num(e, "train_loss");
        h[i].dev_loss = (float)jget_num(e, "eval_loss");
        h[i].dev_acc = (float)jget_num(e, "eval_accuracy");
        h[i].dev_f1 = (float)jget_num(e, "eval_f1");
        h[i].dev_em = (float)jget_num(e, "eval_exact_match");
        h[i].dev_span_f1 = (float)jget_num(e, "eval_span_f1");
        h[i].samples_per_s = jget_num(e, "samples_per_second");
        h[i].seconds = jget_num(e, "seconds");
        h[i].peak_allocated = (size_t)jget_int(e, "peak_allocated");
        h[i].peak_reserved = (size_t)jget_int(e, "peak_reserved");
    }
    *n = (int)k;
    return h;
}

/* ---- the optimizer's tensors ------------------------------------------------ */

static tk_st_dtype st_dtype(tk_dtype dt) {
    return dt == TK_I8 ? TK_ST_I8 : dt == TK_U8 ? TK_ST_U8 : TK_ST_F32;
}

static const char *const MOMENT_SUFFIX[4] = {"exp_avg", "exp_avg_sq", "exp_avg.scale", "exp_avg_sq.scale"};

static void moments(const tk_adamw_state_view *v, tk_tensor *t[4]) {
    t[0] = v->m;
    t[1] = v->v;
    t[2] = v->q8 ? v->mscale : NULL;
    t[3] = v->q8 ? v->vscale : NULL;
}

static tk_status save_optimizer(tk_adamw *o, tk_dev *d, const char *path, void *const *full, tk_err *err) {
    tk_st_writer *w = tk_st_writer_new();
    int n = tk_adamw_n_slots(o);
    void **bufs = tk_calloc((size_t)(4 * (n > 0 ? n : 1)), sizeof *bufs);
    tk_status st = w && bufs ? TK_OK : TK_EIO;
    if (st != TK_OK)
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
    char steps[32];
    snprintf(steps, sizeof steps, "%lld", (long long)tk_adamw_steps(o));
    if (st == TK_OK)
        st = tk_st_writer_metadata(w, "step", steps, err);
    for (int i = 0; i < n && st == TK_OK && tk_adamw_has_state(o); i++) {
        tk_adamw_state_view v;
        tk_adamw_state_at(o, i, &v);
        if (v.frozen)
            continue;
        tk_tensor *t[4];
        moments(&v, t);
        for (int j = 0; j < 4 && st == TK_OK; j++) {
            char name[512];
            snprintf(name, sizeof name, "%s.%s", v.name, MOMENT_SUFFIX[j]);
            tk_adamw_moment mo;
            tk_adamw_moment_layout(&v, j, &mo);
            if (full && mo.present) { /* ZeRO 1/2: the state gathered from every rank */
                st = tk_st_writer_add(w, name, st_dtype(mo.dtype), mo.ndim, mo.shape, full[4 * i + j], err);
                continue;
            }
            if (!t[j] || !t[j]->data)
                continue;
            size_t nb = tk_tensor_nbytes(t[j]);
            if (!(bufs[4 * i + j] = tk_malloc(nb ? nb : 1))) {
                tk_err_set(err, TK_ENOMEM, "%s: out of host memory (%zu bytes)", path, nb);
                st = TK_ENOMEM;
                break;
            }
            if ((st = tk_tensor_read(d, t[j], bufs[4 * i + j], err)) == TK_OK)
                st = tk_st_writer_add(w, name, st_dtype(t[j]->dtype), t[j]->ndim, t[j]->shape,
                                      bufs[4 * i + j], err);
        }
    }
    if (st == TK_OK)
        st = tk_st_writer_write(w, path, err);
    for (int i = 0; bufs && i < 4 * n; i++)
        free(bufs[i]);
    free(bufs);
    tk_st_writer_destroy(&w);
    return st;
}

static tk_status load_optimizer(tk_adamw *o, tk_dev *d, const char *path, int64_t *steps,
                                tk_err *err) {
    tk_st_file *f = tk_st_open(path, err);
    if (!f)
        return TK_EIO;
    const char *sv = tk_st_metadata(f, "step");
    *steps = sv ? strtoll(sv, NULL, 10) : 0;
    tk_status st = TK_OK;
    if (tk_st_count(f) > 0)
        st = tk_adamw_alloc_state(o, err);
    for (int i = 0; i < tk_adamw_n_slots(o) && st == TK_OK && tk_st_count(f) > 0; i++) {
        tk_adamw_state_view v;
        tk_adamw_state_at(o, i, &v);
        if (v.frozen)
            continue;
        tk_tensor *t[4];
        moments(&v, t);
        for (int j = 0; j < 4 && st == TK_OK; j++) {
            if (!t[j])
                continue;
            char name[512];
            snprintf(name, sizeof name, "%s.%s", v.name, MOMENT_SUFFIX[j]);
            const tk_st_entry *e = tk_st_find(f, name);
            /* the file holds the whole parameter's state (consolidated);
             * a ZeRO 1/2 rank takes its piece of it */
            tk_adamw_moment mo;
            tk_adamw_moment_layout(&v, j, &mo);
            size_t es = tk_dtype_size(mo.dtype), whole = (size_t)mo.numel * es;
            if (!e || e->dtype != st_dtype(mo.dtype) || (uint64_t)(e->end - e->begin) != (uint64_t)whole) {
                tk_err_set(err, TK_EINVAL, "%s: %s is %s; this run's optimizer (%s) needs %s of %zu bytes",
                           path, name, e ? "of another dtype or size" : "missing",
                           v.q8 ? "8-bit state" : "32-bit state", tk_st_dtype_name(st_dtype(mo.dtype)), whole);
                st = TK_EINVAL;
                break;
            }
            if (tk_dev_kind_of(d) != TK_DEV_META && mo.count > 0)
                st = tk_tensor_write(d, t[j], (const char *)tk_st_data(f, e) + (size_t)mo.off * es, err);
        }
    }
    tk_st_close(&f);
    return st;
}

/* ---- save -------------------------------------------------------------------- */

static int step_of(const char *name, int64_t *step) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11])
        return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(name + 11, &end, 10);
    if (*end || errno || v < 0 || name[11] < '0' || name[11] > '9')
        return 0;
    *step = v;
    return 1;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int tk_ckpt_list(const char *dir, int64_t **steps) {
    *steps = NULL;
    DIR *d = dir && dir[0] ? opendir(dir) : NULL;
    if (!d)
        return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    char p[TK_PATH_MAX * 2];
    struct stat sb;
    while ((e = readdir(d))) {
        int64_t s;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!step_of(e->d_name, &s) || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (n == cap) {
            int64_t *ns = tk_realloc(*steps, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *ns);
            if (!ns)
                break;
            *steps = ns;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n > 1)
        qsort(*steps, (size_t)n, sizeof **steps, cmp_desc);
    return n;
}

int tk_ckpt_is_ours(const char *dir, char *why, size_t wn) {
    char p[TK_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, STATE_FILE);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    const char *fmt = j ? json_string_value(json_object_get(j, "format")) : NULL;
    int ours = fmt && !strcmp(fmt, FORMAT_NAME);
    if (!ours && why) {
        if (!j && access(p, F_OK) != 0) snprintf(why, wn, "no %s: not a checkpoint txkernel wrote", STATE_FILE);
        else if (!j) snprintf(why, wn, "its %s does not parse (%s)", STATE_FILE, je.text);
        else if (json_object_get(j, "best_model_checkpoint") || json_object_get(j, "log_history"))
            snprintf(why, wn, "another trainer's checkpoint (its %s is a transformers Trainer's, not txkernel's)",
                     STATE_FILE);
        else snprintf(why, wn, "another tool's checkpoint (its %s has no \"format\": \"%s\")", STATE_FILE, FORMAT_NAME);
    }
    json_decref(j);
    return ours;
}

/* Files of a model, its training or its adapter that a save would write
 * over or sit beside: HF's and PEFT's names, sharded weights, a Trainer's
 * own state. */
static int model_file(const char *name) {
    static const char *const N[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                                    "pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
                                    "flax_model.msgpack", "adapter_model.safetensors", "adapter_model.bin",
                                    "adapter_config.json", STATE_FILE, "training_args.bin", "optimizer.pt",
                                    "scheduler.pt", OPTIM_FILE, NULL};
    for (int i = 0; N[i]; i++)
        if (!strcmp(name, N[i])) return 1;
    size_t l = strlen(name);
    return (!strncmp(name, "model-", 6) && l > 12 && !strcmp(name + l - 12, ".safetensors")) ||
           (!strncmp(name, "pytorch_model-", 14) && l > 4 && !strcmp(name + l - 4, ".bin"));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

tk_status tk_ckpt_claim_output_dir(const tk_config *c, tk_err *err) {
    const char *out = c->output_dir;
    if (!out[0]) return TK_OK;
    tk_err me = {0};
    if (tk_mkdirs(out, &me) != TK_OK) {
        tk_err_set(err, TK_EIO, "output_dir %s; nothing was trained", me.msg);
        return TK_EIO;
    }
    char p[TK_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", out, TK_OUTPUT_MANIFEST);
    int ours = access(p, F_OK) == 0, n = 0, cap = 0;
    char **foreign = NULL;
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));) {
        int64_t step;
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", out, e->d_name);
        int ckpt = step_of(e->d_name, &step) && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
        if (ckpt && tk_ckpt_is_ours(p, NULL, 0)) {
            ours = 1; /* an earlier txkernel run's folder (before the manifest) */
            continue;
        }
        if (!ckpt && !model_file(e->d_name)) continue;
        if (n == cap) {
            char **v = tk_realloc(foreign, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!v) break;
            foreign = v;
        }
        if (!(foreign[n] = tk_strdup(e->d_name))) break;
        n++;
    }
    if (d) closedir(d);
    tk_status st = TK_OK;
    if (!ours && n && !c->overwrite) {
        qsort(foreign, (size_t)n, sizeof *foreign, cmp_str);
        char list[640] = "";
        size_t k = 0;
        for (int i = 0; i < n && k + 1 < sizeof list; i++) {
            int w = i < 12 ? snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", foreign[i])
                           : snprintf(list + k, sizeof list - k, " and %d more", n - i);
            if (w < 0) break;
            k += (size_t)w;
            if (i >= 12) break;
        }
        tk_err_set(err, TK_EINVAL,
                   "output_dir %s holds a model or checkpoints txkernel did not write: %s. Nothing was trained "
                   "and they are left as they are. Give another output_dir, or overwrite: true to write this run "
                   "there (its checkpoint-STEP rotation still removes only txkernel's own)",
                   out, list);
        st = TK_EINVAL;
    }
    for (int i = 0; i < n; i++) free(foreign[i]);
    free(foreign);
    if (st != TK_OK) return st;
    /* mark the folder as this run's: a later run and its resume go on in it */
    snprintf(p, sizeof p, "%s/%s", out, TK_OUTPUT_MANIFEST);
    if (access(p, F_OK) == 0) return TK_OK;
    json_t *j = json_pack("{s:s, s:s}", "format", MANIFEST_FORMAT, "what",
                          "txkernel wrote this folder's model files and its checkpoint-STEP folders; a txkernel run "
                          "writes into it again (a folder without this file that holds a model is refused unless "
                          "overwrite: true)");
    if (!j) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", p);
        return TK_ENOMEM;
    }
    st = tk_write_json_atomic(p, j, JSON_INDENT(1), err);
    json_decref(j);
    return st;
}

int tk_ckpt_is_checkpoint(const char *dir) {
    char p[TK_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, STATE_FILE);
    return access(p, F_OK) == 0;
}

/* Removes the oldest checkpoints beyond `keep`, never the one just written
 * (`mine`): a new run in a folder that holds an older run's higher steps
 * must not delete its own checkpoint. */
static void prune(const char *out_dir, int keep, int64_t mine) {
    int64_t *steps = NULL;
    int n = tk_ckpt_list(out_dir, &steps), m = 0;
    char p[TK_PATH_MAX * 2];
    /* only txkernel's own: another trainer's checkpoint-500 is neither counted nor removed */
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/checkpoint-%lld", out_dir, (long long)steps[i]);
        if (tk_ckpt_is_ours(p, NULL, 0)) steps[m++] = steps[i];
    }
    n = m;
    for (int i = 0; i < n; i++)
        if (steps[i] == mine) {
            memmove(steps + 1, steps, (size_t)i * sizeof *steps);
            steps[0] = mine;
        }
    for (int i = keep; keep > 0 && i < n; i++) {
        snprintf(p, sizeof p, "%s/checkpoint-%lld", out_dir, (long long)steps[i]);
        rm_tree(p);
    }
    free(steps);
}

static json_t *state_json(const tk_config *c, tk_adamw *o, const tk_train_state *s) {
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string(FORMAT_NAME));
    json_object_set_new(j, "global_step", json_integer(s->step));
    json_object_set_new(j, "epoch", json_integer(s->epoch));
    json_object_set_new(j, "position", json_integer(s->position));
    char micro[32];
    snprintf(micro, sizeof micro, "%llu", (unsigned long long)s->micro);
    json_object_set_new(j, "micro_step", json_string(micro));
    json_object_set_new(j, "optimizer_steps", json_integer(tk_adamw_steps(o)));
    json_object_set_new(j, "epoch_loss_sum", jnum(s->ep_loss));
    json_object_set_new(j, "epoch_rows", json_integer(s->ep_rows));
    json_object_set_new(j, "log_loss_sum", jnum(s->log_loss));
    json_object_set_new(j, "log_rows", json_integer(s->log_rows));
    json_object_set_new(j, "epoch_seconds", jnum(s->ep_seconds));
    json_object_set_new(j, "run_seconds", jnum(s->run_seconds));
    json_object_set_new(j, "oom_retried", json_integer(s->oom_retried));
    json_t *ls = json_object();
    json_object_set_new(ls, "enabled", json_integer(s->scaler.enabled));
    json_object_set_new(ls, "scale", json_real(s->scaler.scale));
    json_object_set_new(ls, "good_steps", json_integer(s->scaler.good_steps));
    json_object_set_new(ls, "growth_interval", json_integer(s->scaler.growth_interval));
    json_object_set_new(ls, "skipped", json_integer(s->scaler.skipped));
    json_object_set_new(j, "loss_scaler", ls);
    json_t *sc = json_object();
    json_object_set_new(sc, "lr", json_real(s->sched.lr));
    json_object_set_new(sc, "warmup_steps", json_integer(s->sched.warmup_steps));
    json_object_set_new(sc, "total_steps", json_integer(s->sched.total_steps));
    json_object_set_new(sc, "constant", json_integer(s->sched.constant));
    json_object_set_new(j, "schedule", sc);
    json_t *data = json_object();
    char dg[32];
    snprintf(dg, sizeof dg, "%016llx", (unsigned long long)s->data_digest);
    json_object_set_new(data, "batches", json_integer(s->n_train));
    json_object_set_new(data, "digest", json_string(dg));
    json_object_set_new(j, "data", data);
    json_object_set_new(j, "run", run_settings(c));
    char *yaml = tk_config_to_yaml(c);
    json_object_set_new(j, "config", json_string(yaml ? yaml : ""));
    free(yaml);
    json_object_set_new(j, "log_history", history_json(s->history, s->n_history));
    return j;
}

tk_status tk_ckpt_save(const char *out_dir, tk_model *m, tk_adamw *o, const tk_config *c,
                       const char *vocab, const tk_train_state *s, char *path, size_t pn,
                       tk_err *err) {
    char tmp[TK_PATH_MAX + 64], fin[TK_PATH_MAX + 64], p[TK_PATH_MAX * 2];
    snprintf(tmp, sizeof tmp, "%s/.checkpoint-%lld.tmp", out_dir, (long long)s->step);
    snprintf(fin, sizeof fin, "%s/checkpoint-%lld", out_dir, (long long)s->step);
    tk_err me = {0};
    if (tk_mkdirs(out_dir, &me) != TK_OK) {
        tk_err_set(err, TK_EIO, "output_dir %s", me.msg);
        return TK_EIO;
    }
    /* a .tmp left by a run killed inside a save */
    DIR *d = opendir(out_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, ".checkpoint-", 12) && l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) {
            snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
            rm_tree(p);
        }
    }
    if (d)
        closedir(d);
    if (mkdir(tmp, 0755) != 0) {
        tk_err_set(err, TK_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        return TK_EIO;
    }
    static const char *const files[] = {"model.safetensors", "config.json", OPTIM_FILE, "vocab.txt"};
    int nfiles = 3;
    json_t *j = NULL;
    tk_status st = tk_model_save_hf(m, tmp, err);
    test_delay();
    if (st == TK_OK) {
        snprintf(p, sizeof p, "%s/%s", tmp, OPTIM_FILE);
        st = save_optimizer(o, tk_model_dev(m), p, s->optim_full, err);
        test_delay();
    }
    /* the model's card (tk_model_set_card) already wrote the tokenizer files
     * beside the weights; a model without one gets the vocabulary copied */
    struct stat sv;
    snprintf(p, sizeof p, "%s/vocab.txt", tmp);
    if (st == TK_OK && stat(p, &sv) == 0) nfiles = 4;
    else if (st == TK_OK && vocab && vocab[0] && !strstr(vocab, ".json") && (st = copy_file(vocab, p, err)) == TK_OK)
        nfiles = 4; /* a tokenizer.json is no vocab.txt: only the card writes one from it */
    if (st == TK_OK && !(j = state_json(c, o, s))) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", tmp);
        st = TK_ENOMEM;
    }
    json_t *fj = json_object();
    for (int i = 0; i < nfiles && st == TK_OK; i++) {
        uint64_t size, h;
        snprintf(p, sizeof p, "%s/%s", tmp, files[i]);
        if ((st = file_digest(p, &size, &h, err)) != TK_OK)
            break;
        char hx[32];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
        json_t *e = json_object();
        json_object_set_new(e, "bytes", json_integer((json_int_t)size));
        json_object_set_new(e, "fnv1a64w", json_string(hx));
        json_object_set_new(fj, files[i], e);
    }
    if (st == TK_OK) {
        json_object_set_new(j, "files", fj);
        fj = NULL;
        char *txt = json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
        if (!txt) {
            tk_err_set(err, TK_EIO, "%s: cannot encode the state", tmp);
            st = TK_EIO;
        } else {
            snprintf(p, sizeof p, "%s/%s", tmp, STATE_FILE);
            const void *parts[1] = {txt};
            size_t sizes[1] = {strlen(txt)};
            st = tk_write_file_atomic(p, parts, sizes, 1, err);
            free(txt);
        }
    }
    json_decref(fj);
    json_decref(j);
    if (st == TK_OK)
        st = fsync_dir(tmp, err);
    test_delay();
    if (st == TK_OK) {
        /* the same step saved again (a run resumed from an older checkpoint
         * that had already passed this one): the new folder replaces it */
        struct stat sb;
        if (stat(fin, &sb) == 0)
            rm_tree(fin);
        if (rename(tmp, fin) != 0) {
            tk_err_set(err, TK_EIO, "%s: cannot rename into place: %s", fin, strerror(errno));
            st = TK_EIO;
        }
    }
    if (st == TK_OK)
        st = fsync_dir(out_dir, err);
    if (st != TK_OK) {
        rm_tree(tmp);
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        tk_err_set(err, TK_EIO, "checkpoint-%lld not saved (earlier checkpoints kept): %s",
                   (long long)s->step, why);
        return TK_EIO;
    }
    prune(out_dir, c->keep_checkpoints, s->step);
    if (path)
        snprintf(path, pn, "%s", fin);
    return TK_OK;
}

/* ---- verify and load ------------------------------------------------------------ */

static json_t *read_state(const char *dir, tk_err *err) {
    char p[TK_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, STATE_FILE);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) {
        tk_err_set(err, TK_EIO, "%s: unreadable (truncated or corrupted?): %s at line %d", p, je.text,
                   je.line);
        return NULL;
    }
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0 || !json_is_object(json_object_get(j, "files"))) {
        tk_err_set(err, TK_EIO, "%s: not a %s state (format %s, files %s)", p, FORMAT_NAME,
                   fmt ? fmt : "missing", json_object_get(j, "files") ? "present" : "missing");
        json_decref(j);
        return NULL;
    }
    return j;
}

static tk_status verify_files(const char *dir, const json_t *j, tk_err *err) {
    const char *name;
    json_t *e;
    char p[TK_PATH_MAX * 2];
    json_object_foreach(json_object_get(j, "files"), name, e) {
        snprintf(p, sizeof p, "%s/%s", dir, name);
        uint64_t size, h;
        if (file_digest(p, &size, &h, err) != TK_OK)
            return TK_EIO;
        uint64_t want = (uint64_t)jget_int(e, "bytes");
        if (size != want) {
            tk_err_set(err, TK_EIO, "%s: %llu bytes, the checkpoint recorded %llu (truncated)", p,
                       (unsigned long long)size, (unsigned long long)want);
            return TK_EIO;
        }
        char hx[32];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
        const char *wh = json_string_value(json_object_get(e, "fnv1a64w"));
        if (!wh || strcmp(wh, hx) != 0) {
            tk_err_set(err, TK_EIO, "%s: checksum %s, the checkpoint recorded %s (corrupted)", p, hx,
                       wh ? wh : "none");
            return TK_EIO;
        }
    }
    return TK_OK;
}

tk_status tk_ckpt_verify(const char *dir, tk_err *err) {
    json_t *j = read_state(dir, err);
    if (!j)
        return TK_EIO;
    tk_status st = verify_files(dir, j, err);
    json_decref(j);
    return st;
}

static tk_status check_settings(const char *dir, const json_t *j, const tk_config *c, int n_train,
                                uint64_t digest, tk_err *err) {
    json_t *mine = run_settings(c);
    const json_t *theirs = json_object_get(j, "run");
    const char *k;
    json_t *v;
    tk_status st = TK_OK;
    json_object_foreach(mine, k, v) {
        json_t *t = json_object_get(theirs, k);
        if (t && json_equal(t, v))
            continue;
        char *a = t ? json_dumps(t, JSON_ENCODE_ANY | JSON_REAL_PRECISION(9)) : NULL;
        char *b = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(9));
        if (!strcmp(k, "micro_batches_per_step") && t)
            tk_err_set(err, TK_EINVAL,
                       "%s was made with %s micro-batches of batch_size %d per step (accumulate x world_size) and "
                       "this run takes %s: a resume keeps the global batch, so on world_size %d set accumulate so "
                       "that accumulate x world_size = %s%s", dir, a ? a : "?", c->batch_size, b ? b : "?",
                       tk_config_world_size(c), a ? a : "?",
                       json_integer_value(t) % tk_config_world_size(c) ? " (which this world_size does not divide)"
                                                                       : "");
        else
        tk_err_set(err, TK_EINVAL,
                   "%s was made by another run: %s is %s there and %s here (an exact resume needs the same "
                   "model, data and training settings)",
                   dir, k, a ? a : "missing", b ? b : "?");
        free(a);
        free(b);
        st = TK_EINVAL;
        break;
    }
    json_decref(mine);
    const json_t *data = json_object_get(j, "data");
    char dg[32];
    snprintf(dg, sizeof dg, "%016llx", (unsigned long long)digest);
    const char *their_dg = json_string_value(json_object_get(data, "digest"));
    if (st == TK_OK && (jget_int(data, "batches") != n_train || !their_dg || strcmp(their_dg, dg))) {
        tk_err_set(err, TK_EINVAL,
                   "%s was made on other training data: %lld batches, digest %s there; %d batches, digest %s here",
                   dir, (long long)jget_int(data, "batches"), their_dg ? their_dg : "missing", n_train, dg);
        st = TK_EINVAL;
    }
    return st;
}

tk_status tk_ckpt_load(const char *dir, tk_model *m, tk_adamw *o, const tk_config *c, int n_train,
                       uint64_t data_digest, tk_train_state *s, tk_err *err) {
    memset(s, 0, sizeof *s);
    json_t *j = read_state(dir, err);
    if (!j)
        return TK_EIO;
    tk_status st = verify_files(dir, j, err);
    if (st == TK_OK)
        st = check_settings(dir, j, c, n_train, data_digest, err);
    if (st == TK_OK)
        st = tk_model_load_hf(m, dir, NULL, err);
    int64_t osteps = 0;
    char p[TK_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, OPTIM_FILE);
    if (st == TK_OK)
        st = load_optimizer(o, tk_model_dev(m), p, &osteps, err);
    if (st == TK_OK) {
        tk_adamw_set_steps(o, osteps);
        s->step = jget_int(j, "global_step");
        s->epoch = (int)jget_int(j, "epoch");
        s->position = (int)jget_int(j, "position");
        const char *micro = json_string_value(json_object_get(j, "micro_step"));
        s->micro = micro ? strtoull(micro, NULL, 10) : 0;
        s->ep_loss = jget_num(j, "epoch_loss_sum");
        s->ep_rows = jget_int(j, "epoch_rows");
        s->log_loss = jget_num(j, "log_loss_sum");
        s->log_rows = jget_int(j, "log_rows");
        s->ep_seconds = jget_num(j, "epoch_seconds");
        s->run_seconds = jget_num(j, "run_seconds");
        s->oom_retried = (int)jget_int(j, "oom_retried");
        const json_t *ls = json_object_get(j, "loss_scaler");
        s->scaler.enabled = (int)jget_int(ls, "enabled");
        s->scaler.scale = (float)jget_num(ls, "scale");
        s->scaler.good_steps = jget_int(ls, "good_steps");
        s->scaler.growth_interval = jget_int(ls, "growth_interval");
        s->scaler.skipped = jget_int(ls, "skipped");
        const json_t *sc = json_object_get(j, "schedule");
        s->sched.lr = (float)jget_num(sc, "lr");
        s->sched.warmup_steps = jget_int(sc, "warmup_steps");
        s->sched.total_steps = jget_int(sc, "total_steps");
        s->sched.constant = (int)jget_int(sc, "constant");
        s->n_train = n_train;
        s->data_digest = data_digest;
        if (!(s->history = history_from_json(json_object_get(j, "log_history"), &s->n_history))) {
            tk_err_set(err, TK_ENOMEM, "%s: out of host memory", dir);
            st = TK_ENOMEM;
        }
    }
    json_decref(j);
    return st;
}

/* session.c — the notebook session and the run pipeline (implements the
 * session part of tk_session.h; the data step lives in txdata.c, the
 * reports in report.c).
 *
 * Guarantees:
 *  - A run whose plan does not fit in what the device has free returns
 *    TK_RUN_PLANNED_OOM without a single allocation on the device.
 *  - After every run end (done, OOM, cancel, error) the model is destroyed and
 *    the allocator's cache emptied, so allocated is back at the baseline and
 *    reserved holds no segment of the run.
 *  - The device survives between runs as long as the config asks for the
 *    same kind and capacity.
 */
#define _GNU_SOURCE /* vasprintf */
#include "tk_session.h"
#include "tk_host_mem.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_app.h"
#include "tk_advisor.h"
#include "tk_checkpoint.h"
#include "tk_embed_trace.h"
#include "tk_files.h"
#include "tk_hub.h"
#include "tk_model.h"
#include "tk_pipeline.h"
#include "tk_predict.h"
#include "tk_torchbin.h"
#include "tk_train.h"

struct tk_session {
    tk_dev *dev;
    tk_dev_kind kind;
    size_t capacity;
    int threads;
    int card_buffers;          /* the device took a card's buffers (tk_config_on_card) */
    int have_config, have_plan, have_oom, have_run;
    tk_run_report last_run;    /* history always NULL: the copy owns nothing */
    tk_config config;
    tk_plan_result plan;
    tk_oom oom;
    int *lengths;
    int n_lengths;
    tk_mem_sample *tl;
    int ntl, captl;
    struct tk_advice *advice;  /* the last %txadvise (malloc'd, owned) */
    tk_config advice_config;   /* what that advice was asked for, as given */
    tk_holder holder;          /* the host's report; survives a reset */
    size_t record_events;      /* the allocator's history asked for (events; 0: off); survives a reset */
    char platform[16];         /* the platform the last %txplan --gpus planned on; "" none */
    tk_traced_model *traced;   /* the companion's traced model (owned); NULL none */
};

tk_session *tk_session_new(void) { return tk_calloc(1, sizeof(tk_session)); }

void tk_session_destroy(tk_session **ps) {
    if (!ps || !*ps) return;
    tk_session_reset(*ps);
    tk_traced_destroy(&(*ps)->traced);
    free(*ps);
    *ps = NULL;
}

void tk_session_reset(tk_session *s) {
    tk_dev_destroy(&s->dev);
    free(s->lengths);
    free(s->tl);
    free(s->advice);
    /* the traced model describes the user's model, not the engine's run: a
     * reset (a release %txfix, %txreset) keeps it, so the next advice on its
     * config still plans by tracing; tk_session_set_traced replaces it */
    tk_traced_model *traced = s->traced;
    tk_holder h = s->holder;
    int record = s->record_events;
    memset(s, 0, sizeof *s);
    s->holder = h;
    s->record_events = record;
    s->traced = traced;
    tk_host_trim(); /* what the session held, back to the system */
}

void tk_session_set_traced(tk_session *s, tk_traced_model *t) {
    if (!s) return;
    tk_traced_destroy(&s->traced);
    s->traced = t;
    if (t) tk_session_set_config(s, tk_traced_config(t));
}

tk_traced_model *tk_session_traced(const tk_session *s, const tk_config *c) {
    return s && s->traced && tk_traced_describes(s->traced, c) ? s->traced : NULL;
}

void tk_session_set_holder(tk_session *s, const tk_holder *h) {
    if (s) s->holder = h ? *h : (tk_holder){0};
}

const tk_holder *tk_session_holder(const tk_session *s) { return s ? &s->holder : NULL; }

size_t tk_session_held_in_process(const tk_session *s) {
    return s && s->holder.state == TK_HOLDER_HOLDS ? s->holder.reserved : 0;
}

void tk_holder_line(const tk_holder *h, char *buf, size_t n) {
    char r[32], a[32];
    switch (h ? h->state : TK_HOLDER_UNKNOWN) {
    case TK_HOLDER_ABSENT:
        snprintf(buf, n, "PyTorch is not imported in this process: it holds no device memory");
        break;
    case TK_HOLDER_NO_CUDA:
        snprintf(buf, n, "PyTorch in this process sees no CUDA device (torch.cuda.is_available() is False): "
                         "it holds no GPU memory");
        break;
    case TK_HOLDER_IDLE:
        snprintf(buf, n, "PyTorch in this process has not initialised CUDA: it holds no GPU memory yet");
        break;
    case TK_HOLDER_HOLDS:
        snprintf(buf, n, "PyTorch caching allocator in this process: %s reserved, %s allocated",
                 tk_format_bytes(h->reserved, r, sizeof r), tk_format_bytes(h->allocated, a, sizeof a));
        break;
    default:
        if (n) buf[0] = 0;
    }
}

size_t tk_session_free(const tk_session *s, tk_dev *d) {
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    size_t held = info.simulated ? tk_session_held_in_process(s) : 0;
    /* the card's own buffers are in every plan for it: not taken from what a run has */
    size_t card;
    tk_dev_card_buffers(d, NULL, &card);
    size_t free_b = info.free_bytes + card;
    return free_b > held ? free_b - held : 0;
}

void tk_session_device_now(tk_session *s, const tk_config *c, size_t *free_now, size_t *held) {
    *free_now = 0;
    *held = 0;
    tk_dev *d = tk_session_current_device(s);
    size_t cap = tk_session_capacity_of(c);
    size_t torch_held = tk_session_held_in_process(s);
    if (!d) {
        /* no device of ours yet: the capacity less what PyTorch in this process keeps */
        if (cap && torch_held) *free_now = cap > torch_held ? cap - torch_held : 1;
        return;
    }
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    int cuda = tk_dev_kind_of(d) == TK_DEV_CUDA;
    if (!cuda && cap && info.total != cap) return; /* another simulated device: it would be replaced */
    tk_alloc_stats st;
    tk_alloc_stats_get(tk_dev_alloc(d), &st);
    size_t card_alloc, card_res;
    tk_dev_card_buffers(d, &card_alloc, &card_res);
    *held = st.allocated - card_alloc; /* an earlier run's; the card's buffers are the plan's */
    if (cuda || cap) {
        /* plus the cache an earlier run left, not the card's segments (their
         * room is the plan's, counted in tk_session_free) */
        *free_now = tk_session_free(s, d) + (st.reserved - card_res) - (st.allocated - card_alloc);
        if (!*free_now) *free_now = 1; /* nothing free is not "no limit" */
    }
}

size_t tk_session_capacity_of(const tk_config *c) {
    /* a GPU profile on cuda describes another card: the real one decides */
    if (!c->capacity && c->device == TK_DEVICE_CUDA) return 0;
    return tk_config_capacity(c);
}

static tk_dev *open_dev(tk_dev_kind kind, size_t cap, int threads, int card_buffers, tk_err *err) {
    tk_dev_opts o = {.kind = kind, .capacity = cap, .threads = threads, .card_buffers = card_buffers};
    return tk_dev_new(&o, err);
}

tk_dev *tk_session_device(tk_session *s, const tk_config *c, char *note, tk_err *err) {
    size_t cap = tk_session_capacity_of(c);
    tk_dev_kind want = c->device == TK_DEVICE_META ? TK_DEV_META
                     : c->device == TK_DEVICE_CPU  ? TK_DEV_CPU : TK_DEV_CUDA;
    /* a card's run (or its simulation on the cpu) holds the card's buffers
     * from the start, as its plan does; cuda takes them whatever */
    int card = tk_config_on_card(c);
    if (note) note[0] = 0;
    if (s->dev && s->capacity == cap && s->threads == c->threads &&
        (s->kind == TK_DEV_CUDA || s->card_buffers == card) &&
        (s->kind == want || (c->device == TK_DEVICE_AUTO && s->kind == TK_DEV_CPU)))
        return s->dev;
    tk_dev_destroy(&s->dev);
    tk_err e = {0};
    tk_dev *d = open_dev(want, cap, c->threads, card, &e);
    if (!d && c->device == TK_DEVICE_AUTO) {
        if (note) snprintf(note, 256, "no usable GPU (%.200s); running on the cpu", e.msg);
        want = TK_DEV_CPU;
        d = open_dev(want, cap, c->threads, card, &e);
    }
    if (!d) {
        tk_err_set(err, e.status, "device: %s", e.msg);
        return NULL;
    }
    /* the allocator's history only when asked (tk_session_record_history) */
    if (s->record_events && tk_alloc_record_history(tk_dev_alloc(d), s->record_events) != 0 && note)
        snprintf(note, 256, "device: no memory for the allocator's history; %%txmem --save will have no trace");
    s->dev = d;
    s->kind = want;
    s->capacity = cap;
    s->threads = c->threads;
    s->card_buffers = card;
    return d;
}

tk_dev *tk_session_current_device(tk_session *s) { return s->dev; }

tk_status tk_session_record_history(tk_session *s, size_t max_events, tk_err *err) {
    if (s->dev && tk_alloc_record_history(tk_dev_alloc(s->dev), max_events) != 0)
        return tk_err_nomem(err, "the allocator's history");
    s->record_events = max_events;
    return TK_OK;
}

size_t tk_session_recording(const tk_session *s) { return s->record_events; }
const char *tk_session_platform(const tk_session *s) { return s && s->platform[0] ? s->platform : NULL; }
void tk_session_set_platform(tk_session *s, const char *platform) {
    snprintf(s->platform, sizeof s->platform, "%s", platform ? platform : "");
}

void tk_session_where(tk_session *s, tk_run_where *w) {
    memset(w, 0, sizeof *w);
    w->platform = tk_session_platform(s);
    if (!s->dev) return;
    tk_dev_info info;
    tk_dev_info_get(s->dev, &info);
    w->device_known = 1;
    w->device = tk_dev_kind_of(s->dev);
    w->device_total = info.total;
}

const tk_config *tk_session_config(const tk_session *s) { return s->have_config ? &s->config : NULL; }
void tk_session_set_config(tk_session *s, const tk_config *c) {
    s->config = *c;
    s->have_config = 1;
}
const tk_plan_result *tk_session_plan(const tk_session *s) { return s->have_plan ? &s->plan : NULL; }
void tk_session_set_plan(tk_session *s, const tk_plan_result *p) {
    s->plan = *p;
    s->have_plan = 1;
}
const tk_oom *tk_session_oom(const tk_session *s) { return s->have_oom ? &s->oom : NULL; }
const struct tk_advice *tk_session_advice(const tk_session *s) { return s->advice; }
const tk_config *tk_session_advice_config(const tk_session *s) { return s->advice ? &s->advice_config : NULL; }
void tk_session_set_advice_config(tk_session *s, const tk_config *as_given) { s->advice_config = *as_given; }
void tk_session_take_advice(tk_session *s, struct tk_advice *a) {
    if (s->advice != a) free(s->advice);
    s->advice = a;
}

const tk_run_report *tk_session_last_run(const tk_session *s) { return s->have_run ? &s->last_run : NULL; }

void tk_session_advise_facts(const tk_session *s, int same_config, tk_advise_input *in, tk_advise_run *run,
                             tk_advise_torch *live) {
    const tk_run_report *r = s ? tk_session_last_run(s) : NULL;
    if (r) {
        *run = (tk_advise_run){.ran_out = r->end == TK_RUN_OOM, .same_config = same_config,
                               .oom = r->have_oom ? &r->oom : NULL, .oom_phase = r->oom_phase,
                               .peak_allocated = r->peak_allocated, .peak_reserved = r->peak_reserved,
                               .free_before = r->free_before};
        in->last_run = run;
    }
    static const tk_torch_live_state LIVE[] = {
        [TK_HOLDER_ABSENT] = TK_TORCH_LIVE_NOT_IMPORTED, [TK_HOLDER_NO_CUDA] = TK_TORCH_LIVE_NO_CUDA,
        [TK_HOLDER_IDLE] = TK_TORCH_LIVE_IDLE, [TK_HOLDER_HOLDS] = TK_TORCH_LIVE_HOLDS,
    };
    const tk_holder *h = s ? tk_session_holder(s) : NULL;
    if (h && h->state != TK_HOLDER_UNKNOWN && (unsigned)h->state < sizeof LIVE / sizeof LIVE[0] && LIVE[h->state]) {
        *live = (tk_advise_torch){.state = LIVE[h->state], .allocated = h->allocated, .reserved = h->reserved};
        in->torch_live = live;
    }
}

static void remember_run(tk_session *s, const tk_run_report *r) {
    s->last_run = *r;
    s->last_run.history = NULL;
    s->last_run.n_history = 0;
    s->have_run = 1;
}

const int *tk_session_lengths(const tk_session *s, int *n) {
    *n = s->n_lengths;
    return s->lengths;
}

void tk_session_set_lengths(tk_session *s, const int *len, int n) {
    int *copy = n > 0 ? tk_malloc((size_t)n * sizeof *copy) : NULL;
    if (n > 0 && !copy) return; /* keep the old ones rather than none */
    if (n > 0) memcpy(copy, len, (size_t)n * sizeof *copy);
    free(s->lengths);
    s->lengths = copy;
    s->n_lengths = copy ? n : 0;
}

const tk_mem_sample *tk_session_timeline(const tk_session *s, int *n) {
    *n = s->ntl;
    return s->tl;
}

static void timeline_add(tk_session *s, int64_t step, size_t alloc, size_t reserved, size_t peak) {
    if (s->ntl == s->captl) {
        int ncap = s->captl ? s->captl * 2 : 256;
        tk_mem_sample *n = tk_realloc(s->tl, (size_t)ncap * sizeof *n);
        if (!n) return; /* a shorter timeline, not a failed run */
        s->tl = n;
        s->captl = ncap;
    }
    s->tl[s->ntl++] = (tk_mem_sample){step, alloc, reserved, peak};
}

void tk_run_report_clear(tk_run_report *r) {
    if (!r) return;
    free(r->history);
    memset(r, 0, sizeof *r);
}

/* ---- the run ------------------------------------------------------------------ */

typedef struct {
    tk_session *s;
    const tk_run_hooks *h;
    tk_run_report *r;
} run_ctx;

static int run_progress(void *ud, const tk_progress *p) {
    run_ctx *x = ud;
    timeline_add(x->s, p->step, p->allocated, p->reserved, p->peak);
    return x->h && x->h->on_progress ? x->h->on_progress(x->h->ud, p) : 0;
}

static void run_epoch(void *ud, const tk_epoch_stats *e) {
    run_ctx *x = ud;
    if (x->h && x->h->on_epoch) x->h->on_epoch(x->h->ud, e);
}

static void note(const tk_run_hooks *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const tk_run_hooks *h, const char *fmt, ...) {
    if (!h || !h->on_note) return;
    char *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&line, fmt, ap);
    va_end(ap);
    if (n >= 0) h->on_note(h->ud, line);
    free(line);
}

static void run_note(void *ud, const char *line) {
    run_ctx *x = ud;
    note(x->h, "%s", line);
}

typedef struct {
    const tk_run_hooks *h;
} fetch_ctx;

static int fetch_progress(void *ud, const char *file, int64_t done, int64_t total) {
    const tk_run_hooks *h = ((fetch_ctx *)ud)->h;
    return h && h->on_download ? h->on_download(h->ud, file, done, total) : 0;
}

/* The rule is tk_session_resolve_model's (tk_session.h). */
tk_status tk_session_resolve_model(tk_config *c, const char *id, int download, int weights, const tk_run_hooks *h,
                                   tk_err *err) {
    struct stat st;
    tk_bert_dims dims;
    int preset = stat(id, &st) != 0 && tk_bert_preset(id, &dims, NULL) == 0;
    if (stat(id, &st) == 0 || (preset && c->init == TK_INIT_RANDOM)) return TK_OK;
    fetch_ctx fx = {h};
    tk_hub_opts o = {.weights = weights && c->init != TK_INIT_RANDOM, .offline = !download,
                     .progress = fetch_progress, .ud = &fx};
    char dir[TK_PATH_MAX];
    tk_hub_info info;
    tk_err e = {0};
    tk_status rc = tk_hub_resolve(id, c->revision, &o, dir, sizeof dir, &info, &e);
    if (rc != TK_OK) {
        if (!download && preset) return TK_OK;
        tk_err_set(err, rc, "%s", e.msg);
        return rc;
    }
    if (strlen(dir) >= sizeof c->model) {
        tk_err_set(err, TK_EINVAL, "model: the cache path %s is longer than %zu bytes; set HF_HUB_CACHE to a shorter one",
                   dir, sizeof c->model - 1);
        return TK_EINVAL;
    }
    if (download && (weights || info.n_downloaded)) {
        char b[32];
        note(h, "model: %s (revision %s, commit %.12s)%s: %s %s", info.repo, c->revision, info.commit,
             weights ? "" : ", config and tokenizer", info.n_downloaded ? "downloaded" : "from the HF cache",
             info.n_downloaded ? tk_format_bytes((size_t)info.bytes_downloaded, b, sizeof b) : dir);
    }
    snprintf(c->model, sizeof c->model, "%s", dir);
    return TK_OK;
}

tk_status tk_session_load_data(tk_session *s, tk_config *c, tk_run_data *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    char id[TK_PATH_MAX];
    snprintf(id, sizeof id, "%s", c->model);
    /* a hub id's small files (config, tokenizer) are fetched; a preset is
     * a known shape, planned as such when the cache lacks it, so a plan
     * of one never waits on the network */
    struct stat st;
    tk_bert_dims shape;
    int preset = stat(id, &st) != 0 && tk_bert_preset(id, &shape, NULL) == 0;
    tk_status mrc = tk_session_resolve_model(c, id, !preset, 0, NULL, err);
    if (mrc != TK_OK) return mrc;
    if (!c->train_file[0]) return TK_OK;
    tk_status rc = tk_run_data_load(c, out, err);
    if (rc != TK_OK) return rc;
    tk_session_set_lengths(s, out->lengths, out->n_lengths);
    tk_run_config(out, c);
    return TK_OK;
}

/* Measured here (2 shared cores, 2026-11-25) with `build/txk train
 * examples/reviews_tiny.yaml lr=X` (the README's example: bert-tiny's shape,
 * init: random, 3 epochs), dev accuracy after epochs 1/2/3: lr 2e-5
 * 0.345/0.345/0.345 (chance for 3 classes), 2e-4 0.573/0.720/0.823, 1e-3
 * 0.988/1.000/1.000, 2e-3 0.973/1.000/1.000. */
#define RANDOM_INIT_LR_NOTE                                                                                         \
    "warning: lr: %g is the default, a rate for fine-tuning pretrained weights; random weights (init: random) "    \
    "learn little at it (examples/reviews_tiny.yaml, 3 epochs: dev accuracy 0.35 at 2e-5, 0.82 at 2e-4, 1.00 at " \
    "2e-3): set lr: 2e-3"

/* The data and the plan, at the worst-case batch of this corpus, against
 * what the device has free now (an earlier run may still hold memory).
 * *stop = 1: the plan does not fit and the run ends here (r says so). */
static tk_status plan_run(tk_session *s, tk_config *cc, tk_dev *d, const tk_run_hooks *h, tk_run_data *data,
                          tk_run_report *r, int *stop, tk_err *err) {
    *stop = 0;
    tk_status rc = tk_session_load_data(s, cc, data, err);
    if (rc != TK_OK) return rc;
    if (data->vocab_note[0]) note(h, "%s", data->vocab_note);
    note(h, "data: %d training examples in %d batches, %d dev examples (digest %016llx)", data->n_examples,
         data->n_train, data->n_dev_examples, (unsigned long long)data->digest);
    if (data->n_truncated) note(h, "data: %d examples were truncated to max_len %d", data->n_truncated, cc->max_len);
    /* the run resolved once for the device it got (device: auto may have
     * found cuda): the plan and the model use the spec's attention, as
     * `txk plan` and %txplan of the same config do */
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    tk_run_where where = {.device_known = 1, .device = tk_dev_kind_of(d), .device_total = info.total};
    tk_run_spec spec;
    if ((rc = tk_run_spec_resolve(cc, &where, &spec, err)) != TK_OK) {
        tk_run_data_clear(data);
        return rc;
    }
    const char *attn_why = spec.attention_why;
    cc->attention = spec.attention;
    /* device: auto that found cuda is planned as the card's run it is */
    tk_config pc = *cc;
    if (tk_dev_kind_of(d) == TK_DEV_CUDA) pc.device = TK_DEVICE_CUDA;
    rc = tk_plan(&pc, data->lengths, data->n_lengths, &r->plan, err);
    if (rc != TK_OK) {
        tk_run_data_clear(data);
        return rc;
    }
    snprintf(r->plan.attention_why, sizeof r->plan.attention_why, "%s", attn_why);
    tk_session_set_plan(s, &r->plan);
    size_t limit = tk_session_capacity_of(cc);
    r->free_before = tk_session_free(s, d);
    int known_limit = limit || tk_dev_kind_of(d) == TK_DEV_CUDA;
    int ignore = h && h->ignore_plan;
    if (!ignore && (r->plan.oom || (known_limit && r->plan.peak_reserved > r->free_before))) {
        r->end = TK_RUN_PLANNED_OOM;
        remember_run(s, r);
        tk_run_data_clear(data);
        *stop = 1;
    }
    return TK_OK;
}

/* Before a weight is fetched or a step taken: which device trains (said
 * always: a gpu: profile on a machine without CUDA plans for that card but
 * trains on the cpu, under its capacity), and the results' folder (and its
 * parents, as mkdir -p): a run that cannot save must not train for nothing. */
static tk_status prepare_run(const tk_config *cc, tk_dev *d, const tk_run_hooks *h, tk_run_report *r, tk_err *err) {
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    char b[32];
    if (info.kind == TK_DEV_CUDA)
        note(h, "training on %s (cuda)", info.name);
    else if (cc->gpu[0])
        note(h, "training on the cpu (%s); gpu: %s is the planning profile: its %s is the memory limit here, as "
             "on that card%s", cc->device == TK_DEVICE_AUTO ? "no CUDA device here" : "device: cpu; device: cuda "
             "trains on a GPU", cc->gpu, tk_format_bytes(info.total, b, sizeof b),
             /* the plan for the card chose the card's attention; the run keeps it so they agree */
             cc->attention == TK_ATTN_FUSED && !strncmp(r->plan.attention_why, "default on cuda", 15)
                 ? ", and its default attention: fused" : "");
    else
        note(h, "training on the cpu%s%s", cc->capacity ? ", memory limited to capacity: " : "",
             cc->capacity ? tk_format_bytes(info.total, b, sizeof b) : "");
    /* made (mkdir -p) and taken as this run's, or refused when it holds another model's files */
    tk_status st = tk_ckpt_claim_output_dir(cc, err);
    if (st == TK_EIO) r->save_stopped = 1;
    return st;
}

/* The model of the run on d (*out), with what output_dir gets beside the
 * weights; says where its weights came from. On an OOM r keeps the record. */
static tk_status build_model(tk_dev *d, const tk_config *cc, const char *asked, const tk_run_data *data,
                             const tk_run_hooks *h, tk_run_report *r, tk_model **out, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_load_report lr = {0};
    int random_init = 0;
    snprintf(r->oom_phase, sizeof r->oom_phase, "model");
    tk_model *m = *out = tk_model_from_config(d, cc, &lr, &random_init, err);
    if (!m) {
        tk_status rc = err->status;
        if (rc == TK_EOOM && tk_dev_last_oom(d)) {
            r->have_oom = 1;
            r->oom = *tk_dev_last_oom(d);
        }
        return rc;
    }
    /* what output_dir gets beside the weights: label names, tokenizer files */
    tk_model_card card = {.labels = (const char *const *)data->labels,
                          .n_labels = cc->task == TK_TASK_CLASSIFY ? data->num_labels : 0,
                          .vocab_path = data->vocab_path, .lowercase = data->lowercase, .max_len = cc->max_len};
    tk_status rc = tk_model_set_card(m, &card, err);
    if (rc != TK_OK) {
        tk_load_report_clear(&lr);
        return rc;
    }
    note(h, "model: %lld parameters (%lld trainable)", (long long)tk_model_n_weights(m),
         (long long)tk_model_n_trainable(m));
    if (random_init) {
        note(h, "weights: random init (seed %llu), as init: random asks: %s gives only the shape",
             (unsigned long long)cc->seed, asked);
        /* the default lr is a fine-tuning rate for pretrained weights; from
         * random weights it barely moves them (measured on the README's
         * examples/reviews_tiny.yaml, see RANDOM_INIT_LR_NOTE) */
        tk_config dflt;
        tk_config_defaults(&dflt);
        if (cc->lr == dflt.lr) note(h, RANDOM_INIT_LR_NOTE, (double)cc->lr);
    } else {
        note(h, "weights: loaded %s", cc->model);
        if (lr.n_new) note(h, "weights: newly initialised (not in the checkpoint): %s", lr.new_names);
        if (lr.n_unused) note(h, "weights: in the checkpoint but not used by this model (ignored): %s",
                              lr.unused_names);
    }
    tk_load_report_clear(&lr);
    return TK_OK;
}

/* The training loop with the session's callbacks; its result into r. */
static tk_status train_model(tk_session *s, tk_config *cc, tk_model *m, const tk_run_data *data,
                             const tk_run_hooks *h, tk_run_report *r, tk_err *err) {
    snprintf(r->oom_phase, sizeof r->oom_phase, "training");
    /* progress every step: the timeline wants each step, the display
     * throttles itself */
    cc->log_every = 1;
    run_ctx x = {s, h, r};
    tk_train_callbacks cb = {.on_progress = run_progress, .on_epoch = run_epoch, .ud = &x,
                             .on_note = run_note, .vocab_file = data->vocab_path};
    int64_t *ck = NULL;
    int nck = cc->resume_from[0] ? 0 : tk_ckpt_list(cc->output_dir, &ck), mine = 0;
    for (int i = 0; i < nck; i++) {
        char p[TK_PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/checkpoint-%lld", cc->output_dir, (long long)ck[i]);
        if (tk_ckpt_is_ours(p, NULL, 0)) ck[mine++] = ck[i];
    }
    nck = mine;
    if (nck > 0)
        note(h, "output_dir %s already holds %d checkpoint(s), the newest checkpoint-%lld; this run starts at "
             "step 0. To go on from there instead: resume_from: auto (or a new output_dir for a new run)",
             cc->output_dir, nck, (long long)ck[0]);
    free(ck);
    tk_train_result tr;
    memset(&tr, 0, sizeof tr);
    tk_status rc = tk_train_run(cc, m, data->train, data->n_train, data->dev, data->n_dev, &cb, &tr, err);
    r->steps = tr.steps;
    r->epochs_done = tr.epochs_done;
    r->n_history = tr.n_history;
    r->history = tr.history;
    tr.history = NULL;
    r->peak_allocated = tr.peak_allocated;
    r->peak_reserved = tr.peak_reserved;
    r->seconds = tr.seconds;
    memcpy(r->checkpoint, tr.checkpoint, sizeof r->checkpoint);
    r->failed_saves = tr.failed_saves;
    r->save_stopped = rc != TK_OK && rc != TK_ECANCEL && rc != TK_EOOM && tr.failed_saves > 0;
    if (tr.have_oom) {
        r->have_oom = 1;
        r->oom = tr.oom;
    }
    tk_train_result_clear(&tr);
    return rc;
}

/* How the run ended, remembered by the session: an OOM or a cancel is a
 * report (TK_OK), not an error. */
static tk_status end_run(tk_session *s, tk_dev *d, tk_run_report *r, tk_status rc) {
    tk_alloc *a = tk_dev_alloc(d);
    tk_alloc_stats st;
    tk_alloc_empty_cache(a);
    tk_alloc_stats_get(a, &st);
    r->allocated_after = st.allocated;
    if (rc == TK_EOOM) {
        r->end = TK_RUN_OOM;
        if (!r->have_oom && tk_dev_last_oom(d)) {
            r->have_oom = 1;
            r->oom = *tk_dev_last_oom(d);
        }
        if (r->have_oom) {
            s->oom = r->oom;
            s->have_oom = 1;
        }
        remember_run(s, r); /* with its OOM record */
        return TK_OK;
    }
    if (rc == TK_ECANCEL) {
        r->end = TK_RUN_CANCELLED;
        remember_run(s, r);
        return TK_OK;
    }
    if (rc == TK_OK) r->end = TK_RUN_DONE;
    remember_run(s, r);
    return rc;
}

static tk_status session_train(tk_session *s, const tk_config *c, const tk_run_hooks *h,
                               tk_run_report *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    r->end = TK_RUN_FAILED;
    tk_err local = { 0 };
    if (!err) err = &local; /* callees' failures are read from it, never guessed */
    tk_config cc = *c;
    tk_session_set_config(s, c);
    tk_dev *d = tk_session_device(s, &cc, r->device_note, err);
    if (!d) return err->status;
    if (r->device_note[0]) note(h, "%s", r->device_note);
    tk_alloc_stats st;
    tk_alloc_stats_get(tk_dev_alloc(d), &st);
    r->baseline = st.allocated;

    /* The model's config and tokenizer first (small files: the data
     * pipeline reads its vocab.txt, the plan its config), its weights only
     * once the plan fits. A preset the hub cannot give now is planned as its
     * shape, so a run that would not fit says so even offline. */
    char id[TK_PATH_MAX];
    snprintf(id, sizeof id, "%s", c->model);
    tk_err pending = {0};
    tk_status rc = tk_session_resolve_model(&cc, id, 1, 0, h, &pending);
    tk_bert_dims shape;
    if (rc != TK_OK && tk_bert_preset(id, &shape, NULL) != 0) {
        *err = pending;
        return rc;
    }
    tk_run_data data;
    int stop = 0;
    if ((rc = plan_run(s, &cc, d, h, &data, r, &stop, err)) != TK_OK || stop) return rc;
    if ((rc = prepare_run(&cc, d, h, r, err)) != TK_OK) {
        tk_run_data_clear(&data);
        return rc;
    }

    if (pending.status == TK_OK) rc = tk_session_resolve_model(&cc, id, 1, 1, h, &pending);
    if (pending.status != TK_OK) {
        *err = pending;
        tk_run_data_clear(&data);
        return pending.status;
    }

    /* On cuda the device peak (CUPTI) starts afresh: the run's own. */
    int cupti_run = tk_dev_kind_of(d) == TK_DEV_CUDA && tk_dev_cuda_mem_reset_peak(d, NULL) == TK_OK;
    s->ntl = 0;
    tk_model *m = NULL;
    rc = build_model(d, &cc, c->model, &data, h, r, &m, err);
    if (rc == TK_OK) rc = train_model(s, &cc, m, &data, h, r, err);
    if (cupti_run) {
        tk_cuda_mem_totals tot;
        if (tk_dev_cuda_mem_totals(d, &tot, NULL) == TK_OK && tot.cupti_active) {
            r->have_device_peak = 1;
            r->device_peak = tot.device_peak;
            r->plugin_bytes = tot.plugin_bytes;
        }
    }
    tk_model_destroy(&m);
    tk_run_data_clear(&data);
    return end_run(s, d, r, rc);
}

tk_status tk_session_train(tk_session *s, const tk_config *c, const tk_run_hooks *h,
                           tk_run_report *r, tk_err *err) {
    tk_status rc = session_train(s, c, h, r, err);
    /* however it ended: the run's freed heap (its data, model, scratch in
     * every thread's arena) back to the system, so the process is not left
     * at the run's peak */
    tk_host_trim();
    return rc;
}

/* ---- using a trained model ---------------------------------------------------- */

void tk_predict_report_clear(tk_predict_report *r) {
    if (!r) return;
    for (int i = 0; i < r->n_labels; i++) free(r->labels[i]);
    free(r->labels);
    tk_predict_result_clear(r->res);
    free(r->res);
    memset(r, 0, sizeof *r);
}

static int has_file(const char *dir, const char *name) {
    char p[TK_PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The data columns a model folder was trained with: the run's config, kept
 * in its newest checkpoint's trainer_state.json (the folder itself when it
 * is a checkpoint); c keeps its own when there is none or it does not
 * parse (a run of another version). */
static void trained_columns(const char *folder, tk_config *c) {
    char dir[TK_PATH_MAX + 64], state[TK_PATH_MAX + 96];
    int64_t *steps = NULL;
    if (tk_ckpt_is_checkpoint(folder)) snprintf(dir, sizeof dir, "%s", folder);
    else if (tk_ckpt_list(folder, &steps) > 0) snprintf(dir, sizeof dir, "%s/checkpoint-%lld", folder, (long long)steps[0]);
    else dir[0] = 0;
    free(steps);
    if (!dir[0]) return;
    snprintf(state, sizeof state, "%s/trainer_state.json", dir);
    json_t *j = json_load_file(state, 0, NULL);
    const char *yaml = json_string_value(json_object_get(j, "config"));
    tk_config run;
    tk_config_defaults(&run);
    if (yaml && tk_config_parse_yaml(&run, yaml, strlen(yaml), state, NULL) == TK_OK) {
        memcpy(c->text_col, run.text_col, sizeof c->text_col);
        memcpy(c->text_pair_col, run.text_pair_col, sizeof c->text_pair_col);
        memcpy(c->label_col, run.label_col, sizeof c->label_col);
    }
    json_decref(j);
}

tk_status tk_session_predict_config(const char *folder, tk_config *c, tk_err *err) {
    char wfile[TK_PATH_MAX + 64];
    if (folder) {
        tk_config_defaults(c);
        snprintf(c->model, sizeof c->model, "%s", folder);
        struct stat st;
        if (stat(folder, &st) != 0 && tk_hub_is_repo_id(folder)) { /* its snapshot, weights and all */
            tk_status rc = tk_session_resolve_model(c, folder, 1, 1, NULL, err);
            if (rc != TK_OK) return rc;
        }
        int L = tk_hf_model_max_length(c->model);
        if (L > 0) c->max_len = L;
        trained_columns(c->model, c); /* metrics need no --label when the run's column is in the input */
    } else if (c->output_dir[0] && tk_checkpoint_find(c->output_dir, wfile, sizeof wfile)) {
        snprintf(c->model, sizeof c->model, "%s", c->output_dir);
    }
    c->max_examples = 0; /* a training-set limit: every input example is predicted */
    c->init = TK_INIT_PRETRAINED; /* the trained weights, whatever the run started from */
    c->dev_file[0] = 0;
    struct stat sd;
    /* c->model: the folder, or the hub snapshot a hub id resolved to */
    if (folder && (stat(c->model, &sd) != 0 || !S_ISDIR(sd.st_mode))) {
        tk_err_set(err, TK_EINVAL, "%s: no such folder; give the output_dir of a run, or a config whose output_dir "
                   "holds one", folder);
        return TK_EINVAL;
    }
    if (!has_file(c->model, "config.json") || !tk_checkpoint_find(c->model, wfile, sizeof wfile)) {
        tk_err_set(err, TK_EINVAL,
                   "%s: not a trained model folder (config.json and model.safetensors or pytorch_model.bin); give the "
                   "output_dir of a run, or a config whose output_dir holds one", c->model);
        return TK_EINVAL;
    }
    return TK_OK;
}

tk_status tk_session_predict(tk_session *s, const tk_config *c0, tk_predict_report *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    tk_err local = { 0 };
    if (!err) err = &local;
    tk_config c = *c0;
    snprintf(r->model, sizeof r->model, "%s", c.model);
    int head = -1;
    tk_status rc = tk_hf_head_from_config_json(c.model, &head, &r->labels, &r->n_labels, err);
    if (rc != TK_OK) return rc;
    if (head == TK_HEAD_SPAN) {
        c.task = TK_TASK_QA;
        c.head = TK_HEAD_SPAN;
    } else if (head == TK_HEAD_POOLED || head < 0) {
        c.task = TK_TASK_CLASSIFY;
        c.head = TK_HEAD_POOLED;
        c.num_labels = r->n_labels > 0 ? r->n_labels : 2;
    } else {
        tk_predict_report_clear(r);
        tk_err_set(err, TK_EINVAL, "%s: a flatten_dense head: prediction is for the pooled and span heads", c.model);
        return TK_EINVAL;
    }
    c.dropout = 0;
    tk_dev *d = tk_session_device(s, &c, NULL, err);
    if (!d) {
        tk_predict_report_clear(r);
        return err->status;
    }
    tk_run_data data;
    if ((rc = tk_run_data_load_eval(&c, (const char *const *)r->labels, r->n_labels, &data, err)) != TK_OK) {
        tk_predict_report_clear(r);
        return rc;
    }
    r->digest = data.digest;
    /* planned like a run: the weights and one eval batch, with the
     * attention of the device it got */
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    tk_run_where where = {.device_known = 1, .device = tk_dev_kind_of(d), .device_total = info.total};
    tk_run_spec spec;
    if ((rc = tk_run_spec_resolve(&c, &where, &spec, err)) != TK_OK) goto out;
    const char *attn_why = spec.attention_why;
    c.attention = spec.attention;
    tk_config pc = c;
    if (tk_dev_kind_of(d) == TK_DEV_CUDA) pc.device = TK_DEVICE_CUDA; /* as plan_run: the card's run */
    if ((rc = tk_plan_inference(&pc, data.lengths, data.n_lengths, &r->plan, err)) != TK_OK) goto out;
    snprintf(r->plan.attention_why, sizeof r->plan.attention_why, "%s", attn_why);
    size_t limit = tk_session_capacity_of(&c);
    r->free_before = tk_session_free(s, d);
    if (r->plan.oom || ((limit || tk_dev_kind_of(d) == TK_DEV_CUDA) && r->plan.peak_reserved > r->free_before)) {
        r->planned_oom = 1;
        goto out;
    }
    tk_model *m = tk_model_from_config(d, &c, NULL, NULL, err);
    if (!m) {
        rc = err->status;
        goto out;
    }
    if (!(r->res = tk_calloc(1, sizeof *r->res))) {
        tk_err_set(err, TK_ENOMEM, "predict: out of host memory");
        rc = TK_ENOMEM;
    } else {
        rc = tk_predict(m, &data, r->res, err);
    }
    tk_model_destroy(&m);
    tk_alloc_empty_cache(tk_dev_alloc(d));
out:
    tk_run_data_clear(&data);
    if (rc != TK_OK) tk_predict_report_clear(r);
    return rc;
}

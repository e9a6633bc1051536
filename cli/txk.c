/* txk — the txkernel engine from a shell: the same plans, runs and reports as
 * the notebook magics, as text or (with --json) as JSON for scripts.
 *
 *   txk plan cfg.yaml [key=value ...] [--gpu PROFILE | --gpus colab|kaggle|colab-2020|all] [--max-batch] [--sweep]
 *            [--epoch] [--snapshot FILE] [--json]
 *   txk train cfg.yaml [key=value ...] [--no-plan] [--snapshot FILE] [--json]
 *   txk predict MODEL_DIR|ORG/NAME|cfg.yaml --input FILE [--text C] [--pair C] [--label C] [--id C] [-o OUT] [--json]
 *   txk advise cfg.yaml [key=value ...] [--gpu P] [--top N] [--margin F] [--for colab|kaggle] [--api A]
 *              [--fix N|auto [-o F]] [--json]
 *   txk advise [cfg.yaml [key=value ...] [--data FILE]] --from-error FILE|- [--for colab|kaggle] [--api A] [--json]
 *   txk data FILE [--text COL] [--pair COL] [--model M] [--vocab F] [--max-len N] [--batch N] [--json]
 *   txk vocab CORPUS -o vocab.txt --size N [--text COL] [--lowercase]
 *   txk mem [--device cpu|cuda|meta] [--capacity 7.43GiB] [--json]
 *   txk mem --snapshot FILE [--gpu P | --capacity SIZE] [--model M] [--data FILE [--text COL]]
 *           [--batch N --seq N] [--json]
 *   txk device [--json]
 *   txk keys
 *   txk options      (every flag and config key as JSON: the reference pages' source)
 *   txk kernel -f CONNECTION_FILE
 *
 * Subcommands dispatch through one table. Exit status: 0 success; 1 error;
 * 2 usage; 3 the plan does not fit (nothing was allocated); 4 out of memory
 * at run time; 130 interrupted.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tk_app.h"
#include "tk_collective.h"
#include "tk_config.h"
#include "tk_kernel.h"
#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_PLAN_OOM = 3, EXIT_OOM = 4, EXIT_INT = 130 };

/* Prints JSON as --json prints it (indented, keys sorted). */
static void emit_json(const json_t *j) {
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    puts(s ? s : "{}");
    free(s);
}

/* Prints a bundle: its text/plain, or its application/json with --json. */
static void emit(json_t *bundle, int json) {
    if (json) {
        emit_json(json_object_get(bundle, "application/json"));
    } else {
        const char *t = json_string_value(json_object_get(bundle, "text/plain"));
        if (t) fputs(t, stdout);
    }
}

static int has_flag(char **argv, int argc, const char *flag) {
    for (int i = 0; i < argc; i++) if (!strcmp(argv[i], flag)) return 1;
    return 0;
}

static const char *flag_value(char **argv, int argc, const char *flag) {
    for (int i = 0; i + 1 < argc; i++) if (!strcmp(argv[i], flag)) return argv[i + 1];
    return NULL;
}

/* The words of `txk VERB` checked against the option table: every flag one
 * the verb takes in a shell (with its value), the rest key=value. 0, or
 * EXIT_USAGE after saying which word. */
static int check_words(tk_verb verb, char **argv, int argc) {
    tk_app_args a;
    tk_err err = {0};
    char who[32];
    snprintf(who, sizeof who, "txk %s", tk_app_verb_name(verb));
    if (tk_app_args_parse(verb, TK_DOOR_SHELL, who, argv, argc, &a, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_USAGE;
    }
    if (a.n_plain) {
        fprintf(stderr, "txk: unexpected '%s' (see txk --help)\n", a.plain[0]);
        return EXIT_USAGE;
    }
    return 0;
}

/* The config of `txk VERB`'s parsed words: the first plain word or --file,
 * then the key=value words apply. required: without one, the usage. 0 (and
 * *cfg_path NULL when there is none), or an exit status after saying why. */
static int config_words(tk_verb verb, const tk_app_args *a, int required, tk_config *c, const char **cfg_path) {
    const char *who = tk_app_verb_name(verb);
    const char *path = tk_app_arg(a, "--file");
    *cfg_path = NULL;
    if ((path && a->n_plain) || a->n_plain > 1) {
        fprintf(stderr, "txk: unexpected '%s' (txk %s takes one config: cfg.yaml or --file cfg.yaml)\n",
                a->plain[a->n_plain - 1], who);
        return EXIT_USAGE;
    }
    if (!path && a->n_plain) path = a->plain[0];
    if (!path && (required || a->n_kv)) {
        char *u = tk_app_usage_flags(verb, TK_DOOR_SHELL);
        fprintf(stderr, "usage: txk %s cfg.yaml [key=value ...] %s\n", who, u ? u : "");
        free(u);
        return EXIT_USAGE;
    }
    *cfg_path = path;
    tk_err err = {0};
    if (path && tk_app_config_load(c, path, a, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_ERR;
    }
    return 0;
}

/* The words of `txk VERB` read by the option table (app/) and its config
 * (config_words). 0, or an exit status after saying why. */
static int request(tk_verb verb, int argc, char **argv, tk_app_args *a, tk_config *c) {
    char who[32];
    const char *path;
    snprintf(who, sizeof who, "txk %s", tk_app_verb_name(verb));
    tk_err err = {0};
    if (tk_app_args_parse(verb, TK_DOOR_SHELL, who, argv, argc, a, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_USAGE;
    }
    return config_words(verb, a, 1, c, &path);
}

/* ---- plan ------------------------------------------------------------------------ */

static int cmd_plan(int argc, char **argv) {
    tk_app_args args;
    tk_plan_request rq = {.new_config = 1};
    int rc = request(TK_VERB_PLAN, argc, argv, &args, &rq.config);
    if (rc) return rc;
    rq.gpu = tk_app_arg(&args, "--gpu");
    rq.gpus = tk_app_arg(&args, "--gpus");
    rq.snapshot = tk_app_arg(&args, "--snapshot");
    rq.max_batch = tk_app_has(&args, "--max-batch");
    rq.measure = tk_app_has(&args, "--measure");
    rq.sweep = rq.measure || tk_app_has(&args, "--sweep");
    rq.epoch = tk_app_has(&args, "--epoch");
    tk_session *s = tk_session_new();
    tk_plan_reply r = {0};
    tk_err err = {0};
    tk_status st = s ? tk_app_plan(s, &rq, &r, &err) : tk_err_nomem(&err, "txk plan");
    tk_session_destroy(&s);
    if (st != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return r.ename && !strcmp(r.ename, "UsageError") ? EXIT_USAGE : EXIT_ERR;
    }
    emit(r.bundle, tk_app_has(&args, "--json"));
    json_decref(r.bundle);
    if (r.said[0]) fprintf(stderr, "txk: %s\n", r.said);
    return r.fits ? EXIT_OK : EXIT_PLAN_OOM;
}

/* ---- train ------------------------------------------------------------------------- */

static atomic_int g_cancel;
static void on_sigint(int sig) {
    (void)sig;
    atomic_store(&g_cancel, 1);
}

typedef struct { int tty; double last; int quiet; } train_view; /* quiet: a rank other than 0 */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void train_note(void *ud, const char *line) {
    const train_view *v = ud;
    if (v && v->quiet) return; /* rank 0 says it for the run */
    fprintf(stderr, "%s\n", line);
}

static int train_progress(void *ud, const struct tk_progress *p) {
    train_view *v = ud;
    double t = now_s();
    if (!v->quiet && (p->step == p->total_steps || t - v->last >= (v->tty ? 0.25 : 5.0))) {
        char al[32], pk[32];
        fprintf(stderr, "%sepoch %d/%d step %lld/%lld loss %.4f %.1f samples/s ETA %.0fs mem %s (peak %s)%s",
                v->tty ? "\r" : "", p->epoch, p->epochs, (long long)p->step, (long long)p->total_steps, p->loss,
                p->samples_per_s, p->eta_s, tk_format_bytes(p->allocated, al, sizeof al),
                tk_format_bytes(p->peak, pk, sizeof pk), v->tty ? "   " : "\n");
        v->last = t;
    }
    return atomic_load(&g_cancel);
}


static int train_download(void *ud, const char *file, int64_t done, int64_t total) {
    train_view *v = ud;
    double t = now_s();
    if ((total > 0 && done >= total) || t - v->last >= (v->tty ? 0.25 : 5.0)) {
        char d[32], tt[32];
        fprintf(stderr, "%sdownload %s: %s of %s%s", v->tty ? "\r" : "", file, tk_format_bytes((size_t)done, d, sizeof d),
                total > 0 ? tk_format_bytes((size_t)total, tt, sizeof tt) : "?",
                v->tty && !(total > 0 && done >= total) ? "   " : "\n");
        v->last = t;
    }
    return atomic_load(&g_cancel);
}

static void ranks_note(void *ud, const char *line) {
    (void)ud;
    fprintf(stderr, "txk: %s\n", line);
}

/* world_size N on the cpu: the same command ran as N MPI ranks (app/ranks.c),
 * this process having waited for them. Their exit status is the run's;
 * mpirun's own message names a rank that died. */
static int ranks_said(const tk_ranks_result *r) {
    if (r->code == 0) return EXIT_OK;
    if (r->asked && r->code == EXIT_INT) {
        fprintf(stderr, "txk: interrupted: the %d ranks stopped after the same step (rank 0 said which, above)\n",
                r->world);
        return EXIT_INT;
    }
    fprintf(stderr, "txk: the %d-rank run failed (mpirun ended with status %d; its message above names the rank)\n",
            r->world, r->code);
    return r->code == EXIT_OOM || r->code == EXIT_INT || r->code == EXIT_PLAN_OOM ? r->code : EXIT_ERR;
}

/* What a run that ended says: the plan or the OOM (exit status 3, 4), the
 * interrupt, each rank's peak beside its plan, the epochs and the summary
 * (rank 0). who: "rank N: " in a rank of a world_size > 1 run, else "". */
static int run_said(const tk_config *c, const tk_run_report *r, const tk_app_train_result *t, int json, const char *who,
                    const char *msg) {
    char b1[32], b2[32];
    int rank = tk_coll_env_rank();
    if (t->bundle && (rank == 0 || r->end == TK_RUN_PLANNED_OOM)) emit(t->bundle, json);
    if (r->end == TK_RUN_PLANNED_OOM) {
        fprintf(stderr, "txk: %sthe plan needs %s but %s is free: stopped before allocating anything\n", who,
                tk_format_bytes(r->plan.peak_reserved, b1, sizeof b1), tk_format_bytes(r->free_before, b2, sizeof b2));
        return EXIT_PLAN_OOM;
    }
    if (r->end == TK_RUN_OOM) {
        json_t *j = json && r->have_oom ? tk_report_oom_json(&r->oom, r->oom_phase) : NULL;
        char *txt = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS)
                      : r->have_oom ? tk_report_oom_text(&r->oom, r->oom_phase) : NULL;
        if (!j && who[0]) printf("%s\n", who);
        if (j) puts(txt ? txt : "");
        else fputs(txt ? txt : msg, stdout);
        free(txt);
        json_decref(j);
        return EXIT_OOM;
    }
    if (r->end == TK_RUN_CANCELLED) {
        if (rank == 0)
            fprintf(stderr, "txk: interrupted after step %lld; %s%s\n", (long long)r->steps,
                    r->checkpoint[0] ? "last checkpoint " : "no checkpoint", r->checkpoint);
        return EXIT_INT;
    }
    for (int i = 0; who[0] && i < r->plan.n_ranks; i++) /* each rank's measured peak beside its own plan */
        if (r->plan.rank_of[i] == rank)
            fprintf(stderr, "txk: rank %d: peak %zu B allocated, %zu B reserved; planned for this rank %zu B, %zu B\n",
                    rank, r->peak_allocated, r->peak_reserved, r->plan.rank[i].peak_allocated,
                    r->plan.rank[i].peak_reserved);
    if (rank != 0) return EXIT_OK;
    if (!json)
        printf("trained %lld steps in %.1f s; peak %s allocated (planned %s)%s%s\n", (long long)r->steps, r->seconds,
               tk_format_bytes(r->peak_allocated, b1, sizeof b1), tk_format_bytes(r->plan.peak_allocated, b2, sizeof b2),
               r->checkpoint[0] ? "; checkpoint " : "", r->checkpoint);
    if (!r->failed_saves) return EXIT_OK;
    fprintf(stderr, "txk: %d save%s into %s failed during the run (save_error: continue); %s%s\n", r->failed_saves,
            r->failed_saves == 1 ? "" : "s", c->output_dir, r->checkpoint[0] ? "the last one saved: " : "nothing was saved",
            r->checkpoint);
    return EXIT_ERR;
}

static int cmd_train(int argc, char **argv) {
    tk_app_args args;
    tk_config c;
    int rc = request(TK_VERB_TRAIN, argc, argv, &args, &c);
    if (rc) return rc;
    tk_session *s = tk_session_new();
    if (!s) return EXIT_ERR;
    /* Ctrl-C (or the kernel's interrupt) stops at the next step; a launcher
     * passes it to every rank, a rank gets it as SIGUSR1 through mpirun */
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigaction(SIGINT, &sa, NULL);
    if (tk_config_world_size(&c) > 1) sigaction(SIGTERM, &sa, NULL); /* a launcher's: passed on to the ranks */
    if (tk_coll_env_size() > 1) sigaction(SIGUSR1, &sa, NULL);
    int rank = tk_coll_env_rank();
    char who[32] = ""; /* a rank says its errors with its rank, rank 0 alone the results */
    if (tk_coll_env_size() > 1) snprintf(who, sizeof who, "rank %d: ", rank);
    train_view v = {isatty(2) && rank == 0, 0, rank > 0};
    tk_run_hooks h = {.on_note = train_note, .on_progress = train_progress, .on_download = train_download, .ud = &v,
                      .ignore_plan = tk_app_has(&args, "--no-plan")};
    tk_ranks_io io = {.cancel = &g_cancel, .on_note = ranks_note};
    tk_app_train_request rq = {.config = &c, .snapshot = tk_app_arg(&args, "--snapshot"), .rank_args = argv,
                               .n_rank_args = argc, .ranks = &io};
    tk_run_report r;
    tk_app_train_result t;
    tk_err err = {0};
    tk_status st = tk_app_train(s, &rq, &h, &r, &t, &err);
    if (v.tty && !t.launched) fputc('\n', stderr);
    if (st != TK_OK) fprintf(stderr, "txk: %s%s\n", who, err.msg);
    int json = tk_app_has(&args, "--json");
    rc = st != TK_OK ? EXIT_ERR : t.launched ? ranks_said(&t.ranks) : run_said(&c, &r, &t, json, who, err.msg);
    if (t.snapshot_rc <= 0) fprintf(stderr, "txk: %s\n", t.said);
    if (t.snapshot_rc < 0 && !rc) rc = EXIT_ERR;
    if (who[0] && rc != EXIT_OK && rc != EXIT_INT) {
        fflush(NULL); /* the other ranks would wait for this one in their next collective */
        tk_coll_abort_job(rc);
    }
    json_decref(t.bundle);
    tk_run_report_clear(&r);
    tk_session_destroy(&s);
    return rc;
}

/* ---- advise ---------------------------------------------------------------------- */

/* Diagnoses and ranked fixes for a config, as %txadvise shows them
 * (app/advise.c); with --fix N|auto the chosen candidate's config is
 * written as YAML (-o FILE, or stdout). */
static int advise_plan(tk_session *s, const tk_advise_request *rq, int json) {
    tk_advise_reply r;
    tk_err err = {0};
    if (tk_app_advise(s, rq, &r, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return r.ename && !strcmp(r.ename, "UsageError") ? EXIT_USAGE : EXIT_ERR;
    }
    if (json || !rq->fix || rq->out) emit(r.bundle, json);
    if (r.yaml) fputs(r.yaml, stdout);
    if (r.said[0]) fprintf(stderr, "txk: %s\n", r.said);
    json_decref(r.bundle);
    free(r.yaml);
    return r.no_fix ? EXIT_PLAN_OOM : r.fix_failed ? EXIT_ERR : EXIT_OK;
}

/* txk advise [cfg.yaml] --from-error FILE|-: the pasted OOM message read and
 * diagnosed; with a config, the config planned on the message's card and on
 * each card of its platform. Exit 1 with "no OOM message found" when the
 * text holds none. */
static int advise_error(tk_session *s, const tk_advise_request *rq, int json) {
    json_t *b = NULL;
    const char *ename = NULL;
    tk_err err = {0};
    tk_status st = tk_app_advise_error(s, rq, NULL, 0, &b, &ename, &err);
    if (st == TK_EFORMAT) puts("no OOM message found");
    else if (st != TK_OK) fprintf(stderr, "txk: %s\n", err.msg);
    else emit(b, json);
    json_decref(b);
    return st == TK_OK ? EXIT_OK : ename && !strcmp(ename, "UsageError") ? EXIT_USAGE : EXIT_ERR;
}

static int cmd_advise(int argc, char **argv) {
    tk_app_args a;
    tk_advise_request rq = {0};
    tk_err err = {0};
    if (tk_app_args_parse(TK_VERB_ADVISE, TK_DOOR_SHELL, "txk advise", argv, argc, &a, &err) != TK_OK ||
        tk_app_advise_flags(&a, TK_DOOR_SHELL, &rq, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_USAGE;
    }
    /* the config: needed for plan advice, optional with a pasted message */
    int rc = config_words(TK_VERB_ADVISE, &a, !rq.from_error, &rq.config, &rq.cli_config);
    if (rc) return rc;
    rq.have_config = rq.cli_config != NULL;
    tk_session *s = tk_session_new();
    if (!s) return EXIT_ERR;
    rc = rq.from_error ? advise_error(s, &rq, tk_app_has(&a, "--json")) : advise_plan(s, &rq, tk_app_has(&a, "--json"));
    tk_session_destroy(&s);
    return rc;
}

/* ---- predict ---------------------------------------------------------------------- */

/* Predictions of a trained model (a folder, a hub id, or a config whose
 * output_dir holds one) over an input file, with metrics when it has gold
 * labels (app/predict.c); -o writes every prediction. */
static int cmd_predict(int argc, char **argv) {
    tk_app_args a;
    tk_err err = {0};
    if (tk_app_args_parse(TK_VERB_PREDICT, TK_DOOR_SHELL, "txk predict", argv, argc, &a, &err) != TK_OK ||
        a.n_plain < 1) {
        char *u = tk_app_usage_flags(TK_VERB_PREDICT, TK_DOOR_SHELL);
        fprintf(stderr, "%s%s%susage: txk predict MODEL_DIR|ORG/NAME|cfg.yaml [key=value ...] %s\n", err.msg[0] ? "txk: " : "",
                err.msg, err.msg[0] ? "\n" : "", u ? u : "");
        free(u);
        return EXIT_USAGE;
    }
    tk_session *s = tk_session_new();
    tk_predict_reply r = {0};
    tk_status st = s ? tk_app_predict(s, &a, NULL, &r, &err) : tk_err_nomem(&err, "txk predict");
    int rc = st != TK_OK ? (r.ename && !strcmp(r.ename, "UsageError") ? EXIT_USAGE : EXIT_ERR)
           : r.planned_oom ? EXIT_PLAN_OOM : r.write_failed && !strcmp(r.ename, "UsageError") ? EXIT_USAGE
           : r.write_failed ? EXIT_ERR : EXIT_OK;
    if (st != TK_OK) fprintf(stderr, "txk: %s\n", err.msg);
    if (r.bundle) emit(r.bundle, tk_app_has(&a, "--json"));
    if (r.said[0]) fprintf(stderr, "txk: %s\n", r.said);
    json_decref(r.bundle);
    tk_session_destroy(&s);
    return rc;
}

/* ---- data, vocab ------------------------------------------------------------------ */

/* "usage: txk VERB WORDS [flags from the option table]" on stderr. */
static void usage_line(tk_verb verb, const char *words) {
    char *u = tk_app_usage_flags(verb, TK_DOOR_SHELL);
    fprintf(stderr, "usage: txk %s %s %s\n", tk_app_verb_name(verb), words, u ? u : "");
    free(u);
}

static int cmd_data(int argc, char **argv) {
    tk_app_args a;
    tk_err err = {0};
    json_t *b = NULL;
    if (tk_app_args_parse(TK_VERB_DATA, TK_DOOR_SHELL, "txk data", argv, argc, &a, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        usage_line(TK_VERB_DATA, "FILE");
        return EXIT_USAGE;
    }
    if (tk_app_data(&a, NULL, &b, NULL, NULL, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        int usage = a.n_plain != 1 || a.n_kv; /* the words, not the file, were wrong */
        if (usage) usage_line(TK_VERB_DATA, "FILE");
        return usage ? EXIT_USAGE : EXIT_ERR;
    }
    emit(b, tk_app_has(&a, "--json"));
    json_decref(b);
    return EXIT_OK;
}

static int cmd_vocab(int argc, char **argv) {
    const char *out = flag_value(argv, argc, "-o"), *size = flag_value(argv, argc, "--size");
    if (argc < 1 || !out || !size || atoi(size) < 10 || check_words(TK_VERB_VOCAB, argv + 1, argc - 1)) {
        fprintf(stderr, "usage: txk vocab CORPUS -o vocab.txt --size N [--text COL] [--lowercase]\n");
        return EXIT_USAGE;
    }
    tk_err err = {0};
    int n_texts = 0, n_tokens = 0;
    if (tk_vocab_from_file(argv[0], flag_value(argv, argc, "--text"), atoi(size), has_flag(argv, argc, "--lowercase"),
                           out, &n_texts, &n_tokens, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_ERR;
    }
    printf("wrote %s: %d tokens learned from %d texts\n", out, n_tokens, n_texts);
    return EXIT_OK;
}

/* ---- mem, keys, kernel ------------------------------------------------------------- */

/* The device and its memory, or a PyTorch memory snapshot diagnosed
 * (app/mem.c, as %txmem shows them). */
static int cmd_mem(int argc, char **argv) {
    tk_app_args a;
    tk_err err = {0};
    if (tk_app_args_parse(TK_VERB_MEM, TK_DOOR_SHELL, "txk mem", argv, argc, &a, &err) != TK_OK) {
        fprintf(stderr, "txk: %s\n", err.msg);
        return EXIT_USAGE;
    }
    tk_session *s = tk_session_new();
    tk_mem_reply r = {0};
    tk_status st = s ? tk_app_mem(s, &a, TK_DOOR_SHELL, &r, &err) : tk_err_nomem(&err, "txk mem");
    if (st != TK_OK) fprintf(stderr, "txk: %s\n", err.msg);
    else emit(r.bundle, tk_app_has(&a, "--json"));
    json_decref(r.bundle);
    json_decref(r.timeline);
    tk_session_destroy(&s);
    return st == TK_OK ? EXIT_OK : r.ename && !strcmp(r.ename, "UsageError") ? EXIT_USAGE : EXIT_ERR;
}

/* The device a run here would get, as %txdevice shows it before a run
 * (app/device.c). */
static int cmd_device(int argc, char **argv) {
    tk_app_args a;
    tk_err err = {0};
    if (tk_app_args_parse(TK_VERB_DEVICE, TK_DOOR_SHELL, "txk device", argv, argc, &a, &err) != TK_OK ||
        a.n_plain || a.n_kv) {
        fprintf(stderr, "txk: %s\n", err.msg[0] ? err.msg : "device takes no words but --json");
        return EXIT_USAGE;
    }
    tk_session *s = tk_session_new();
    json_t *b = s ? tk_app_device(s) : NULL;
    if (b) emit(b, tk_app_has(&a, "--json"));
    else fprintf(stderr, "txk: out of host memory\n");
    json_decref(b);
    tk_session_destroy(&s);
    return b ? EXIT_OK : EXIT_ERR;
}

static int cmd_keys(int argc, char **argv) {
    (void)argc;
    (void)argv;
    for (const char *const *k = tk_config_keys(); *k; k++) printf("%-24s %s\n", *k, tk_config_key_help(*k));
    return EXIT_OK;
}

static int cmd_kernel(int argc, char **argv) {
    const char *conn = flag_value(argv, argc, "-f");
    if (!conn) {
        fprintf(stderr, "usage: txk kernel -f CONNECTION_FILE\n");
        return EXIT_USAGE;
    }
    tk_magics *m = tk_magics_new();
    if (!m) return EXIT_ERR;
    tk_interp it = tk_magics_interp(m);
    tk_kerr err = {{0}};
    int rc = tk_kernel_serve(conn, &it, &err);
    if (rc) fprintf(stderr, "txk: %s\n", err.msg);
    tk_magics_destroy(&m);
    return rc ? EXIT_ERR : EXIT_OK;
}

/* ---- dispatch ------------------------------------------------------------------------ */

/* The words before the flags and what the command does; the flags
 * themselves are printed from the option table (app/options.c). */
typedef struct { const char *name; int (*run)(int argc, char **argv); const char *words, *summary; } txk_cmd;

static int cmd_options(int argc, char **argv);

static const txk_cmd CMDS[] = {
    {"plan", cmd_plan, "cfg.yaml [key=value ...]", "planned peak memory, no training (--epoch: the first epoch's own "
     "batches in the run's order, so dynamic padding's and empty_cache's reserved peak is planned too; --snapshot: the "
     "planned step as a PyTorch snapshot)"},
    {"advise", cmd_advise, "cfg.yaml [key=value ...]", "why it does not fit, ranked fixes, each as code in your API; "
     "--fix -o writes your config with the change; [cfg.yaml [--data FILE]] --from-error FILE|-: read a pasted OOM "
     "message (PyTorch or TensorFlow) and diagnose it; --data: the corpus whose p99 the max_length fix carries"},
    {"train", cmd_train, "cfg.yaml [key=value ...]", "plan, then train (stops before allocating if it won't fit; "
     "--no-plan: train anyway; --snapshot: the allocator's history as a PyTorch snapshot, at the end or at an OOM)"},
    {"predict", cmd_predict, "MODEL_DIR|ORG/NAME|cfg.yaml", "(--input FILE is needed) labels and probabilities (answers for QA); "
     "metrics with gold labels (the run's label column by default); -o rows keyed by the input's id column (id/ID or "
     "--id)"},
    {"data", cmd_data, "FILE", "token lengths, truncation, padding"},
    {"vocab", cmd_vocab, "CORPUS", "learn a WordPiece vocabulary (-o vocab.txt and --size N are needed)"},
    {"mem", cmd_mem, "", "the device and its memory; --snapshot FILE: a PyTorch memory snapshot diagnosed; a BERT "
     "(recognised from block sizes, or --model) gets each fix planned"},
    {"device", cmd_device, "", "the device a run here would get: kind, capacity, free, other processes, driver and "
     "CUDA versions (as %txdevice shows it before a run)"},
    {"keys", cmd_keys, "", "every config key with its help"},
    {"options", cmd_options, "", "every flag of txk, the magics and the companion, and every config key, as JSON "
     "(what the reference pages are made from)"},
    {"kernel", cmd_kernel, "-f CONNECTION_FILE", "serve as a Jupyter kernel"},
};

/* txk options: the option table and the config key table as one JSON
 * object {options: [...], keys: [{key, help}]}. */
static int cmd_options(int argc, char **argv) {
    (void)argc;
    (void)argv;
    json_t *keys = json_array();
    for (const char *const *k = tk_config_keys(); keys && *k; k++)
        json_array_append_new(keys, json_pack("{s:s, s:s}", "key", *k, "help", tk_config_key_help(*k)));
    json_t *j = json_pack("{s:o, s:o}", "options", tk_app_options_json(), "keys", keys);
    emit_json(j);
    json_decref(j);
    return j ? EXIT_OK : EXIT_ERR;
}

static int usage(FILE *f) {
    fprintf(f, "txk — BERT fine-tuning memory planner and trainer (txkernel)\n\nusage:\n");
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++) {
        tk_verb v = tk_app_verb_find(CMDS[i].name);
        char *flags = v ? tk_app_usage_flags(v, TK_DOOR_SHELL) : NULL;
        fprintf(f, "  txk %s%s%s%s%s\n            %s\n", CMDS[i].name, CMDS[i].words[0] ? " " : "", CMDS[i].words,
                flags && *flags ? " " : "", flags ? flags : "", CMDS[i].summary);
        free(flags);
    }
    fprintf(f, "\nexit status: 0 ok, 1 error, 2 usage, 3 plan does not fit, 4 out of memory, 130 interrupted\n");
    return f == stdout ? EXIT_OK : EXIT_USAGE;
}

int main(int argc, char **argv) {
    /* libgomp reads OMP_WAIT_POLICY once, when it loads: a spinning OpenMP
     * pool starves OpenBLAS's threads (3x slower steps here), so start again
     * with the passive policy unless the user chose one. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("TXK_NO_REEXEC")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        setenv("TXK_NO_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: go on with the default policy */
    }
    /* a file-size limit (ulimit -f) makes a write fail with EFBIG, which the
     * save reports naming the file, instead of killing the run unsaid */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) return usage(stderr);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) return usage(stdout);
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        if (!strcmp(argv[1], CMDS[i].name)) return CMDS[i].run(argc - 2, argv + 2);
    fprintf(stderr, "txk: unknown command '%s'\n\n", argv[1]);
    return usage(stderr);
}

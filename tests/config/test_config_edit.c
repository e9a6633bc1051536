/* test_config_edit.c — a config file changed in place (bert/config_edit.c,
 * `txk advise CFG --fix N -o F`): the changed values replaced where the
 * text sets them, under any spelling (alias, dotted, a section, freeze:,
 * device: PROFILE), new keys appended, every other byte kept (comments,
 * number spellings, UTF-8), unset keys left unset; a text that cannot take
 * the change is an error, never a wrong file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_test.h"
#include "tk_config_edit.h"

/* The text changed so that it reads as its own config with `key=value`
 * pairs set (NULL-ended); NULL when the edit fails (err filled). */
static char *edit(const char *text, const char *const *kv, tk_err *err) {
    tk_config from, to;
    tk_config_defaults(&from);
    TK_CHECK(tk_config_parse_yaml(&from, text, strlen(text), "t.yaml", err) == TK_OK);
    to = from;
    for (int i = 0; kv[i]; i += 2) TK_CHECK(tk_config_set(&to, kv[i], kv[i + 1], err) == TK_OK);
    size_t n = 0;
    char *out = tk_config_edit_yaml(text, strlen(text), "t.yaml", &from, &to, &n, err);
    if (out) TK_CHECK(n == strlen(out));
    return out;
}

static void check_edit(const char *text, const char *const *kv, const char *want) {
    tk_err err = {0};
    char *out = edit(text, kv, &err);
    TK_CHECK_MSG(out && !strcmp(out, want), "got:\n%s\nwant:\n%s\n(%s)", out ? out : "(null)", want, err.msg);
    free(out);
}

static void test_in_place(void) {
    /* the value replaced, its comment kept; a new key appended; 2e-5 and the rest as they were */
    check_edit("# my run\nmodel: bert-base-cased\nbatch_size: 32   # fits the P4?\nlr: 2e-5\n",
               (const char *const[]){"batch_size", "8", "accumulate", "4", NULL},
               "# my run\nmodel: bert-base-cased\nbatch_size: 8   # fits the P4?\nlr: 2e-5\naccumulate: 4\n");
    /* nothing changes: the same bytes */
    check_edit("model: bert-base-cased\nlr: 2e-5\n", (const char *const[]){NULL}, "model: bert-base-cased\nlr: 2e-5\n");
    /* an alias, a dotted key, a section: each where it is */
    check_edit("per_device_train_batch_size: 32  # HF's name\n", (const char *const[]){"batch_size", "16", NULL},
               "per_device_train_batch_size: 16  # HF's name\n");
    check_edit("train.batch_size: 32\n", (const char *const[]){"batch_size", "16", NULL}, "train.batch_size: 16\n");
    check_edit("model: bert-base-cased\ntrain:\n  batch_size: 32\n  max_len: 512\n",
               (const char *const[]){"max_len", "128", NULL}, "model: bert-base-cased\ntrain:\n  batch_size: 32\n  max_len: 128\n");
    /* no final newline: the added key on its own line */
    check_edit("batch_size: 32", (const char *const[]){"precision", "fp16", NULL}, "batch_size: 32\nprecision: fp16\n");
    /* UTF-8 before the value: byte offsets, not characters */
    check_edit("# über-lange Sätze\nmax_len: 512  # längste\n", (const char *const[]){"max_len", "96", NULL},
               "# über-lange Sätze\nmax_len: 96  # längste\n");
}

static void test_special_keys(void) {
    /* freeze: one line holds both freeze keys */
    check_edit("freeze: embeddings\n", (const char *const[]){"freeze_layers", "6", NULL}, "freeze: embeddings,layers:6\n");
    /* device: t4 names the profile */
    check_edit("device: t4\n", (const char *const[]){"gpu", "p4", NULL}, "device: p4\n");
    /* empty_cache: every:N carries its N */
    check_edit("model: bert-tiny\n", (const char *const[]){"empty_cache", "every:1", NULL},
               "model: bert-tiny\nempty_cache: every:1\n");
    /* a key left unset stays unset: no device key appears */
    tk_err err = {0};
    char *out = edit("model: bert-tiny\nbatch_size: 32\n", (const char *const[]){"batch_size", "4", NULL}, &err);
    TK_CHECK(out && !strstr(out, "device"));
    free(out);
}

static void test_cannot_take_it(void) {
    /* a flow map cannot take a line after it: an error with the change, no file */
    tk_err err = {0};
    char *out = edit("{model: bert-tiny, batch_size: 32}\n", (const char *const[]){"accumulate", "4", NULL}, &err);
    TK_CHECK_MSG(!out && err.status == TK_EINVAL && strstr(err.msg, "t.yaml") && strstr(err.msg, "accumulate: 1 -> 4"),
                 "%s", err.msg);
    free(out);
    /* inside it, a value is still replaced in place */
    check_edit("{model: bert-tiny, batch_size: 32}\n", (const char *const[]){"batch_size", "8", NULL},
               "{model: bert-tiny, batch_size: 8}\n");
}

int main(void) {
    TK_RUN(test_in_place);
    TK_RUN(test_special_keys);
    TK_RUN(test_cannot_take_it);
    return tk_test_done();
}

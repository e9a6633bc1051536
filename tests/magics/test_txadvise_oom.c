/* test_txadvise_oom.c — the card lottery through the interpreter:
 *  - %%txadvise --from-error with the seed's pasted message, alone and after
 *    a config: the P4 named, the figures in the JSON, the config planned on
 *    each Colab card; garbage pasted gets the one line "no OOM message found";
 *  - %txplan --gpus colab / colab-2020: one row per card and the sentence;
 *  - %%txadvise --from-error --for kaggle / colab and --api: the platform's
 *    paragraphs and the fixes' API; a platform it does not know refused,
 *    naming both;
 *  - %txfix auto --for colab-2020: a config that fits with margin on every card. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_test.h"

#include "magics_rec.h"

#define SEED "model: bert-base-cased\nnum_labels: 3\nmax_len: 512\nbatch_size: 32\ngpu: p4\ndevice: cpu\nattention: standard\n" /* as the seed ran it */
#define MSG                                                                                               \
    "Traceback (most recent call last):\n  File \"<ipython-input-29>\", line 1, in <module>\n"               \
    "RuntimeError: CUDA out of memory. Tried to allocate 24.00 MiB (GPU 0; 7.43 GiB total capacity; 5.42 GiB " \
    "already allocated; 8.94 MiB free; 5.79 GiB reserved in total by PyTorch)\n"

static const char *plain(json_t *msgs) {
    json_t *d = first(msgs, "display");
    return d ? json_string_value(json_object_get(json_object_get(d, "data"), "text/plain")) : NULL;
}

static void test_from_error(void) {
    int rc;
    json_t *m = run("%txreset", &rc);
    json_decref(m);
    m = run("%%txadvise --from-error --json\n" MSG, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_t *j = last_json(m);
    TK_CHECK(j && json_integer_value(json_object_get(j, "total")) == 7977901752ll);
    TK_CHECK(j && !strcmp(json_string_value(json_object_get(j, "card")), "p4"));
    json_decref(m);
    m = run("%%txplan\n" SEED, &rc);
    json_decref(m);
    m = run("%%txadvise --from-error\n" MSG, &rc);
    const char *t = plain(m);
    TK_CHECK_MSG(t && strstr(t, "not on K80 or P4") && strstr(t, "The config planned on p4"), "%s", t ? t : "");
    json_decref(m);
    m = run("%%txadvise --from-error\nnothing to see here\n", &rc);
    t = plain(m);
    TK_CHECK(rc == 0 && t && !strcmp(t, "no OOM message found\n"));
    json_decref(m);
    m = run("%txadvise --from-error", &rc);
    TK_CHECK(rc != 0 && strstr(evalue(m), "cell body"));
    json_decref(m);
    /* the notebook's --for and --api: Kaggle's accelerators and no lottery; the Trainer's lines */
    m = run("%%txadvise --from-error --for kaggle --api trainer\n" MSG, &rc);
    t = plain(m);
    TK_CHECK_MSG(rc == 0 && t && !strstr(t, "card lottery") && strstr(t, "your choice and not a lottery") &&
                 strstr(t, "TrainingArguments(") && !strstr(t, "GradScaler"), "%s", t ? t : evalue(m));
    json_decref(m);
    m = run("%%txadvise --from-error --for colab\n" MSG, &rc);
    t = plain(m);
    TK_CHECK_MSG(rc == 0 && t && strstr(t, "card lottery: why it fits") && !strstr(t, "your choice and not a lottery"),
                 "%s", t ? t : evalue(m));
    json_decref(m);
    m = run("%%txadvise --from-error --for mars\n" MSG, &rc);
    TK_CHECK(rc != 0 && strstr(evalue(m), "colab") && strstr(evalue(m), "kaggle"));
    json_decref(m);
    m = run("%%txadvise --from-error --frobnicate\n" MSG, &rc);
    TK_CHECK(rc != 0 && strstr(evalue(m), "--frobnicate"));
    json_decref(m);
}

static void test_gpus_and_fix_for(void) {
    int rc;
    json_t *m = run("%%txplan --gpus colab --json\n" SEED, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_t *j = last_json(m);
    TK_CHECK(j && json_array_size(json_object_get(j, "cards")) == 6); /* today's: T4 .. RTX PRO 6000 */
    json_decref(m);
    m = run("%%txplan --gpus colab-2020 --json\n" SEED, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    j = last_json(m);
    TK_CHECK(j && json_array_size(json_object_get(j, "cards")) == 5); /* the seed's: K80 .. V100-16 */
    TK_CHECK(j && strstr(json_string_value(json_object_get(j, "sentence")), "not on K80 or P4"));
    json_decref(m);
    m = run("%txadvise --json", &rc);
    json_decref(m);
    m = run("%txfix auto --for colab-2020", &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    m = run("%txplan --gpus colab-2020 --json", &rc);
    j = last_json(m);
    json_t *cards = j ? json_object_get(j, "cards") : NULL;
    for (size_t i = 0; i < json_array_size(cards); i++) {
        json_t *c = json_array_get(cards, i);
        TK_CHECK(json_is_true(json_object_get(c, "fits")) &&
                 json_integer_value(json_object_get(c, "margin")) >= json_integer_value(json_object_get(c, "budget")) / 20);
    }
    TK_CHECK(j && strstr(json_string_value(json_object_get(j, "sentence")), "fits on every card"));
    json_decref(m);
    m = run("%txfix 1 --for colab", &rc);
    TK_CHECK(rc != 0 && strstr(evalue(m), "--for goes with auto"));
    json_decref(m);
}

int main(void) {
    M = tk_magics_new();
    I = tk_magics_interp(M);
    TK_RUN(test_from_error);
    TK_RUN(test_gpus_and_fix_for);
    tk_magics_destroy(&M);
    return tk_test_done();
}

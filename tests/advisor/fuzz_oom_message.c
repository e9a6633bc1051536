/* fuzz_oom_message.c — libFuzzer target over the pasted-OOM-message reader:
 * parse any bytes (never NUL-terminated: the buffer is exactly the input),
 * then diagnose what it found, with and without planned cards, and write the
 * text and JSON reports. Built from advisor/oom_message.c and gpu/profile.c
 * alone (advisor/module.mk); tests/suites/oom_message_fuzz.sh runs it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tk_oom_message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tk_oom_message m;
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    if (tk_oom_message_parse(buf, size, &m) == 0) {
        tk_oom_message_diagnose(&m, NULL, 0, NULL);
        /* the input's first bytes choose which cards "fit", to reach the planned lottery */
        tk_card_fit cards[9];
        int n = 0;
        for (int i = 0; tk_gpu_profile_at(i) && n < 9; i++, n++) {
            const tk_gpu_profile *p = tk_gpu_profile_at(i);
            cards[n] = (tk_card_fit){.card = p, .fits = size > (size_t)i && (data[i] & 1), .budget = p->capacity,
                                     .margin = size > (size_t)i ? (int64_t)data[i] << 20 : 0};
        }
        tk_oom_message_diagnose(&m, cards, n, size && (data[0] & 2) ? "kaggle" : "colab");
        char *t = tk_oom_message_format(&m);
        char *j = tk_oom_message_json(&m);
        free(t);
        free(j);
    }
    free(buf);
    return 0;
}

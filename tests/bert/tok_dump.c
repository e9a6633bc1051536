/* tok_dump — drives the C tokenizer for the python parity test and the bench.
 *
 *   tok_dump VOCAB LOWER MAX_LEN STRATEGY < in.jsonl > out.jsonl
 *       each input line {"a": text, "b": text-or-absent}; each output line
 *       {"ids": [...], "type_ids": [...], "offsets": [[s,e],...]} (character
 *       offsets) or {"error": msg}. LOWER is 1, 0 or -1 (from the vocab);
 *       MAX_LEN 0 = no truncation; STRATEGY longest_first|only_first|only_second.
 *   tok_dump --bench VOCAB LOWER FILE REPEAT
 *       tokenizes every line of FILE REPEAT times; prints bytes, tokens, seconds
 *       and MB/s as one JSON object.
 *   tok_dump --squad VOCAB LOWER FILE MAX_LEN STRIDE
 *       SQuAD features (tk_features_squad), one JSON line per window:
 *       {"example", "ids", "type_ids", "start", "end"}.
 *   tok_dump --vocab OUT SIZE LOWER FILE...
 *       learns a WordPiece vocabulary (tk_vocab_build) from the lines of FILEs.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tk_data.h"

static int bench(const char *vocab, int lower, const char *path, int repeat) {
    tk_err err = {0};
    tk_tokenizer_opts o = {.lowercase = lower, .strip_accents = -1};
    tk_tokenizer *t = tk_tokenizer_new(vocab, &o, &err);
    if (!t) { fprintf(stderr, "%s\n", err.msg); return 1; }
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); tk_tokenizer_destroy(&t); return 1; }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    size_t got = buf ? fread(buf, 1, (size_t)sz, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)sz) { free(buf); tk_tokenizer_destroy(&t); return 1; }
    buf[sz] = 0;
    tk_encoding e = {0};
    long tokens = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < repeat; r++) {
        char *p = buf;
        while (*p) {
            char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            e.n = 0;
            tk_tokenize_append(t, p, n, 0, &e, NULL);
            tokens += e.n;
            p += n + (nl ? 1 : 0);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    double bytes = (double)sz * repeat;
    printf("{\"bytes\": %.0f, \"tokens\": %ld, \"seconds\": %.6f, \"mb_per_s\": %.3f}\n", bytes, tokens, s,
           bytes / 1e6 / s);
    tk_encoding_clear(&e);
    free(buf);
    tk_tokenizer_destroy(&t);
    return 0;
}

static int vocab(int argc, char **argv) {
    char **texts = NULL;
    int n = 0, cap = 0, rc = 1;
    for (int a = 5; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (!f) { perror(argv[a]); goto out; }
        char *line = NULL;
        size_t lc = 0;
        while (getline(&line, &lc, f) > 0) {
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                char **nt = realloc(texts, sizeof(char *) * (size_t)cap);
                if (!nt) { free(line); fclose(f); goto out; }
                texts = nt;
            }
            texts[n++] = strdup(line);
        }
        free(line);
        fclose(f);
    }
    tk_err err = {0};
    if (tk_vocab_build((const char *const *)texts, n, atoi(argv[3]), atoi(argv[4]), 0, argv[2], &err) != TK_OK)
        fprintf(stderr, "%s\n", err.msg);
    else
        rc = 0;
out:
    for (int i = 0; i < n; i++) free(texts[i]);
    free(texts);
    return rc;
}

static int squad(char **argv) {
    tk_err err = {0};
    tk_tokenizer_opts o = {.lowercase = atoi(argv[3]), .strip_accents = -1};
    tk_tokenizer *t = tk_tokenizer_new(argv[2], &o, &err);
    tk_squad *sq = NULL;
    tk_features *f = NULL;
    if (!t || tk_squad_load(argv[4], &sq, &err) != TK_OK ||
        tk_features_squad(t, sq, atoi(argv[5]), atoi(argv[6]), &f, &err) != TK_OK) {
        fprintf(stderr, "%s\n", err.msg);
        tk_squad_destroy(&sq);
        tk_tokenizer_destroy(&t);
        return 1;
    }
    for (int i = 0; i < f->n; i++) {
        printf("{\"example\": %d, \"start\": %d, \"end\": %d, \"ids\": [", f->example[i], f->start_pos[i],
               f->end_pos[i]);
        for (int64_t k = f->off[i]; k < f->off[i + 1]; k++) printf("%s%d", k > f->off[i] ? "," : "", f->ids[k]);
        printf("], \"type_ids\": [");
        for (int64_t k = f->off[i]; k < f->off[i + 1]; k++) printf("%s%d", k > f->off[i] ? "," : "", f->type_ids[k]);
        printf("]}\n");
    }
    tk_features_destroy(&f);
    tk_squad_destroy(&sq);
    tk_tokenizer_destroy(&t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "--squad") == 0) return squad(argv);
    if (argc >= 6 && strcmp(argv[1], "--vocab") == 0) return vocab(argc, argv);
    if (argc == 6 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]));
    if (argc != 5) {
        fprintf(stderr, "usage: tok_dump VOCAB LOWER MAX_LEN STRATEGY < in.jsonl\n");
        return 2;
    }
    tk_err err = {0};
    tk_tokenizer_opts o = {.lowercase = atoi(argv[2]), .strip_accents = -1};
    tk_tokenizer *t = tk_tokenizer_new(argv[1], &o, &err);
    if (!t) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int max_len = atoi(argv[3]);
    tk_truncation st = strcmp(argv[4], "only_first") == 0 ? TK_TRUNC_ONLY_FIRST
                     : strcmp(argv[4], "only_second") == 0 ? TK_TRUNC_ONLY_SECOND : TK_TRUNC_LONGEST_FIRST;
    char *line = NULL;
    size_t cap = 0;
    tk_encoding e = {0};
    while (getline(&line, &cap, stdin) > 0) {
        json_error_t je;
        json_t *in = json_loads(line, 0, &je);
        if (!in) { fprintf(stderr, "bad input line: %s\n", je.text); continue; }
        const char *a = json_string_value(json_object_get(in, "a"));
        const char *b = json_string_value(json_object_get(in, "b"));
        json_t *o2 = json_object();
        if (tk_encode(t, a ? a : "", b, max_len, st, &e, NULL, &err) != TK_OK) {
            json_object_set_new(o2, "error", json_string(err.msg));
        } else {
            json_t *ids = json_array(), *tt = json_array(), *off = json_array();
            for (int i = 0; i < e.n; i++) {
                json_array_append_new(ids, json_integer(e.ids[i]));
                json_array_append_new(tt, json_integer(e.type_ids[i]));
                json_array_append_new(off, json_pack("[ii]", e.start[i], e.end[i]));
            }
            json_object_set_new(o2, "ids", ids);
            json_object_set_new(o2, "type_ids", tt);
            json_object_set_new(o2, "offsets", off);
        }
        char *s = json_dumps(o2, JSON_COMPACT);
        puts(s);
        free(s);
        json_decref(o2);
        json_decref(in);
    }
    free(line);
    tk_encoding_clear(&e);
    tk_tokenizer_destroy(&t);
    return 0;
}

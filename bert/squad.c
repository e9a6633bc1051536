/* squad.c — SQuAD v1.1/v2.0 reader and question-answering features.
 *
 * Reader: checks the structure and every answer (answer_start must point at
 * the answer text in the context), so a bad file fails on load with the
 * question id, not later with a wrong loss. Offsets in SQuAD are in
 * characters (Python str indices); the byte offset is kept beside them.
 *
 * Features follow HF run_qa.py (prepare_train_features): [CLS] question [SEP]
 * context-window [SEP]; the question is never cut; windows of the context
 * overlap by doc_stride tokens (HF `stride`); the answer's start and end
 * token are found with the same offset walk, and an answer not wholly inside
 * a window is labelled (0, 0) = [CLS]. Each token keeps its byte span in the
 * context, so a predicted (start, end) maps back to the exact text.
 */
#include "tk_data_internal.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tk_squad_destroy(tk_squad **p) {
    if (!p || !*p) return;
    tk_squad *s = *p;
    for (int i = 0; i < s->n; i++) {
        tk_squad_example *e = &s->ex[i];
        free(e->id); free(e->question); free(e->context);
        for (int k = 0; k < e->nanswers; k++) free(e->answer_text[k]);
        free(e->answer_text); free(e->answer_start); free(e->answer_bstart);
    }
    free(s->ex);
    free(s);
    *p = NULL;
}

/* byte offset of character `ci` in UTF-8 s (len bytes), or -1 past the end */
static long char_to_byte(const char *s, size_t len, long ci) {
    size_t b = 0;
    long c = 0;
    while (b < len && c < ci) {
        b++;
        while (b < len && ((uint8_t)s[b] & 0xC0) == 0x80) b++;
        c++;
    }
    return c == ci ? (long)b : -1;
}

static long utf8_chars(const char *s, size_t len) {
    long c = 0;
    for (size_t i = 0; i < len; i++) c += ((uint8_t)s[i] & 0xC0) != 0x80;
    return c;
}

static char *dup_str(json_t *v) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    char *p = tk_malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

tk_status tk_squad_parse(const char *buf, size_t len, const char *name, tk_squad **out, tk_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    if (!root) {
        tk_err_set(err, TK_EFORMAT, "%s:%d:%d: invalid JSON: %s", name, je.line, je.column, je.text);
        return TK_EFORMAT;
    }
    tk_status st = TK_OK;
    tk_squad *sq = tk_calloc(1, sizeof *sq);
    json_t *data = json_object_get(root, "data");
    if (!sq) goto oom;
    snprintf(sq->name, sizeof sq->name, "%s", name);
    if (!json_is_array(data)) {
        tk_err_set(err, TK_EFORMAT, "%s: not SQuAD JSON: no \"data\" list at the top level", name);
        st = TK_EFORMAT;
        goto done;
    }
    int cap = 0;
    size_t ai, pi, qi;
    json_t *art, *par, *qa;
    json_array_foreach(data, ai, art) {
        json_t *pars = json_object_get(art, "paragraphs");
        if (!json_is_array(pars)) {
            tk_err_set(err, TK_EFORMAT, "%s: data[%zu]: no \"paragraphs\" list", name, ai);
            st = TK_EFORMAT;
            goto done;
        }
        json_array_foreach(pars, pi, par) {
            json_t *ctx = json_object_get(par, "context"), *qas = json_object_get(par, "qas");
            if (!json_is_string(ctx) || !json_is_array(qas)) {
                tk_err_set(err, TK_EFORMAT, "%s: data[%zu].paragraphs[%zu]: needs a \"context\" string and a "
                           "\"qas\" list", name, ai, pi);
                st = TK_EFORMAT;
                goto done;
            }
            const char *c = json_string_value(ctx);
            size_t clen = json_string_length(ctx);
            long cchars = utf8_chars(c, clen);
            json_array_foreach(qas, qi, qa) {
                json_t *id = json_object_get(qa, "id"), *q = json_object_get(qa, "question");
                json_t *ans = json_object_get(qa, "answers"), *imp = json_object_get(qa, "is_impossible");
                char idbuf[64];
                snprintf(idbuf, sizeof idbuf, "%s", json_is_string(id) ? json_string_value(id) : "?");
                if (!json_is_string(id) || !json_is_string(q) || !json_is_array(ans)) {
                    tk_err_set(err, TK_EFORMAT, "%s: question '%s' (data[%zu].paragraphs[%zu].qas[%zu]): needs "
                               "\"id\", \"question\" and an \"answers\" list", name, idbuf, ai, pi, qi);
                    st = TK_EFORMAT;
                    goto done;
                }
                int impossible = json_is_true(imp);
                if (!impossible && json_array_size(ans) == 0) {
                    tk_err_set(err, TK_EFORMAT, "%s: question '%s': no answers (SQuAD v2.0 marks such questions "
                               "\"is_impossible\": true)", name, idbuf);
                    st = TK_EFORMAT;
                    goto done;
                }
                if (sq->n == cap) {
                    cap = cap ? cap * 2 : 256;
                    tk_squad_example *ne = tk_realloc(sq->ex, sizeof *ne * (size_t)cap);
                    if (!ne) goto oom;
                    sq->ex = ne;
                }
                tk_squad_example *e = &sq->ex[sq->n++];
                memset(e, 0, sizeof *e);
                e->is_impossible = impossible;
                e->id = dup_str(id);
                e->question = dup_str(q);
                e->context = dup_str(ctx);
                size_t na = json_array_size(ans);
                e->answer_text = tk_calloc(na ? na : 1, sizeof(char *));
                e->answer_start = tk_malloc(sizeof(int32_t) * (na ? na : 1));
                e->answer_bstart = tk_malloc(sizeof(int32_t) * (na ? na : 1));
                if (!e->id || !e->question || !e->context || !e->answer_text || !e->answer_start || !e->answer_bstart)
                    goto oom;
                size_t k;
                json_t *a;
                json_array_foreach(ans, k, a) {
                    json_t *t = json_object_get(a, "text"), *s = json_object_get(a, "answer_start");
                    if (!json_is_string(t) || !json_is_integer(s)) {
                        tk_err_set(err, TK_EFORMAT, "%s: question '%s': answer %zu needs \"text\" and an integer "
                                   "\"answer_start\"", name, idbuf, k);
                        st = TK_EFORMAT;
                        goto done;
                    }
                    long as = (long)json_integer_value(s);
                    size_t tl = json_string_length(t);
                    long bs = as >= 0 && as <= cchars ? char_to_byte(c, clen, as) : -1;
                    if (bs < 0 || (size_t)bs + tl > clen || memcmp(c + bs, json_string_value(t), tl) != 0) {
                        char have[48] = "";
                        if (bs >= 0) snprintf(have, sizeof have, "%.*s", (int)(tl < 40 ? tl : 40), c + bs);
                        tk_err_set(err, TK_EFORMAT, "%s: question '%s': answer '%s' not at answer_start %ld (context "
                                   "has '%s' there)", name, idbuf, json_string_value(t), as, have);
                        st = TK_EFORMAT;
                        goto done;
                    }
                    e->answer_text[k] = dup_str(t);
                    if (!e->answer_text[k]) goto oom;
                    e->answer_start[k] = (int32_t)as;
                    e->answer_bstart[k] = (int32_t)bs;
                    e->nanswers = (int)k + 1;
                }
            }
        }
    }
    if (sq->n == 0) {
        tk_err_set(err, TK_EINVAL, "%s: no questions", name);
        st = TK_EINVAL;
    }
    goto done;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
    st = TK_ENOMEM;
done:
    json_decref(root);
    if (st == TK_OK) *out = sq;
    else tk_squad_destroy(&sq);
    return st;
}

tk_status tk_squad_load(const char *path, tk_squad **out, tk_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (!f) { tk_err_set(err, TK_EIO, "%s: cannot open: %s", path, strerror(errno)); return TK_EIO; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? tk_malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        tk_err_set(err, TK_EIO, "%s: read error", path);
        return TK_EIO;
    }
    fclose(f);
    tk_status st = tk_squad_parse(buf, (size_t)n, name, out, err);
    free(buf);
    return st;
}

tk_status tk_features_squad(const tk_tokenizer *t, const tk_squad *sq, int max_len, int doc_stride,
                            tk_features **out, tk_err *err) {
    *out = NULL;
    tk_features *f = tk_features_alloc(max_len, 1);
    tk_encoding q = {0}, c = {0};
    int32_t *ids = tk_malloc(sizeof(int32_t) * (size_t)(max_len > 0 ? max_len : 1) * 4);
    tk_status st = TK_OK;
    if (!f || !ids) goto oom;
    int32_t *tt = ids + max_len, *bs = ids + 2 * max_len, *be = ids + 3 * max_len;
    tk_special_ids sp = tk_tokenizer_special(t);
    int capf = 0;
    int64_t capt = 0;
    for (int i = 0; i < sq->n; i++) {
        const tk_squad_example *e = &sq->ex[i];
        q.n = c.n = 0;
        /* HF run_qa strips the question's leading white space; the tokenizer
         * drops white space anyway, so tokens are the same. */
        if (tk_tokenize_append(t, e->question, (size_t)-1, 0, &q, err) != TK_OK ||
            tk_tokenize_append(t, e->context, (size_t)-1, 1, &c, err) != TK_OK)
            goto oom;
        int W = max_len - 3 - q.n;
        if (W <= 0 || doc_stride >= W) {
            tk_err_set(err, TK_EINVAL, "%s: question '%s' has %d tokens: with max_len %d that leaves %d for the "
                       "context, %s doc_stride %d (raise max_len or lower doc_stride)", sq->name, e->id, q.n,
                       max_len, W > 0 ? W : 0, W <= 0 ? "no room at all;" : "not more than", doc_stride);
            st = TK_EINVAL;
            goto done;
        }
        int s_char = -1, e_char = -1;
        if (!e->is_impossible && e->nanswers > 0) {
            s_char = e->answer_start[0];
            e_char = s_char + (int)utf8_chars(e->answer_text[0], strlen(e->answer_text[0]));
        }
        int step = W - doc_stride, nwin = 0;
        for (int ws = 0;; ws += step) {
            int we = ws + W < c.n ? ws + W : c.n;
            int n = 0;
            ids[n] = sp.cls; tt[n] = 0; bs[n] = be[n] = -1; n++;
            for (int k = 0; k < q.n; k++, n++) { ids[n] = q.ids[k]; tt[n] = 0; bs[n] = be[n] = -1; }
            ids[n] = sp.sep; tt[n] = 0; bs[n] = be[n] = -1; n++;
            int ctx0 = n;
            for (int k = ws; k < we; k++, n++) { ids[n] = c.ids[k]; tt[n] = 1; bs[n] = c.bstart[k]; be[n] = c.bend[k]; }
            ids[n] = sp.sep; tt[n] = 1; bs[n] = be[n] = -1; n++;
            int sp_ = 0, ep_ = 0;
            if (s_char >= 0 && we > ws && c.start[ws] <= s_char && c.end[we - 1] >= e_char) {
                int a = ws;
                while (a < we && c.start[a] <= s_char) a++;
                int z = we - 1;
                while (z >= ws && c.end[z] >= e_char) z--;
                sp_ = ctx0 + (a - 1 - ws);
                ep_ = ctx0 + (z + 1 - ws);
            }
            if (tk_features_push(f, &capf, &capt, ids, tt, n, q.n + c.n + 3, -1, sp_, ep_, i, bs, be)) goto oom;
            nwin++;
            if (we >= c.n) break;
        }
        if (nwin > 1) f->n_truncated++;
    }
    goto done;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory while tokenizing", sq->name);
    st = TK_ENOMEM;
done:
    tk_encoding_clear(&q);
    tk_encoding_clear(&c);
    free(ids);
    if (st == TK_OK) *out = f;
    else tk_features_destroy(&f);
    return st;
}

/* test_tokenizer.c — WordPiece known outputs, normalization edge cases,
 * pairs and truncation, offsets, vocabulary errors, tokenizer.json (read,
 * written, its errors, a folder with both files) and the vocab builder. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tk_test.h"
#include "tk_tokenizer.h"

static const char *VOCAB[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello",
                              "world", "##s", ",", "!", ".", "e", "a", "cafe", "caf", "##é", "中", "文",
                              "x", "##x", "run", "##ning", "Hello", "?", "-", "b"};
#define NV ((int)(sizeof VOCAB / sizeof VOCAB[0]))

static tk_tokenizer *mk(int lower) {
    tk_tokenizer_opts o = {.lowercase = lower, .strip_accents = -1};
    tk_err err = {0};
    tk_tokenizer *t = tk_tokenizer_from_tokens(VOCAB, NV, "test", &o, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    return t;
}

/* Space-joined tokens of text (no specials), for readable checks. */
static const char *toks(const tk_tokenizer *t, const char *text) {
    static char buf[2048];
    tk_encoding e = {0};
    buf[0] = 0;
    if (tk_tokenize_append(t, text, (size_t)-1, 0, &e, NULL) != TK_OK) return "(error)";
    for (int i = 0; i < e.n; i++) {
        strcat(buf, i ? " " : "");
        strcat(buf, tk_tokenizer_id_to_token(t, e.ids[i]));
    }
    tk_encoding_clear(&e);
    return buf;
}

static void test_unaffable(void) {
    tk_tokenizer *t = mk(1);
    TK_CHECK_STR(toks(t, "unaffable"), "un ##aff ##able");
    TK_CHECK_STR(toks(t, "UnAffable!"), "un ##aff ##able !");
    TK_CHECK_STR(toks(t, "running worlds"), "run ##ning world ##s");
    TK_CHECK_STR(toks(t, "unaffablex"), "un ##aff ##able ##x");
    TK_CHECK_STR(toks(t, "unaffabley"), "[UNK]"); /* one unmatched piece: whole word */
    tk_tokenizer_destroy(&t);
    TK_CHECK(t == NULL);
    tk_tokenizer_destroy(&t); /* no-op on NULL */
}

static void test_accents_and_case(void) {
    tk_tokenizer *u = mk(1), *c = mk(0);
    TK_CHECK_STR(toks(u, "Café"), "cafe");         /* uncased: strip accents, lower */
    TK_CHECK_STR(toks(c, "café"), "caf ##é");      /* cased: keeps the accent */
    TK_CHECK_STR(toks(c, "Hello hello"), "Hello hello");
    TK_CHECK_STR(toks(u, "HELLO"), "hello");
    TK_CHECK_STR(toks(c, "HELLO"), "[UNK]");
    TK_CHECK_STR(toks(u, "e\xCC\x81"), "e");       /* e + combining acute */
    TK_CHECK(tk_tokenizer_lowercase(u) == 1 && tk_tokenizer_lowercase(c) == 0);
    tk_tokenizer_destroy(&u);
    tk_tokenizer_destroy(&c);
    /* auto: the vocabulary has "Hello", so it is cased */
    tk_tokenizer *a = mk(-1);
    TK_CHECK(tk_tokenizer_lowercase(a) == 0);
    tk_tokenizer_destroy(&a);
}

static void test_cjk_control_punct(void) {
    tk_tokenizer *t = mk(1);
    TK_CHECK_STR(toks(t, "x中文x"), "x 中 文 x");
    TK_CHECK_STR(toks(t, "hel\x01lo\x7f"), "hello");          /* control chars dropped */
    TK_CHECK_STR(toks(t, "hello\xEF\xBF\xBDworld"), "[UNK]");  /* U+FFFD dropped: helloworld */
    TK_CHECK_STR(toks(t, "hello\xE2\x80\x83world"), "hello world"); /* em space */
    TK_CHECK_STR(toks(t, "hello\tworld\r\n"), "hello world");
    TK_CHECK_STR(toks(t, "!?-,."), "! ? - , .");
    TK_CHECK_STR(toks(t, "hello\xC2\xBFworld"), "hello [UNK] world"); /* ¿ is Unicode Po */
    TK_CHECK_STR(toks(t, "a$b"), "a [UNK] b");                 /* $ is ASCII punctuation */
    TK_CHECK_STR(toks(t, "   "), "");
    /* U+0000 inside the text (explicit length) is dropped */
    tk_encoding e = {0};
    TK_CHECK(tk_tokenize_append(t, "hel\0lo", 6, 0, &e, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 1);
    TK_CHECK_EQ_INT(e.ids[0], tk_tokenizer_token_to_id(t, "hello"));
    TK_CHECK_EQ_INT(e.start[0], 0);
    TK_CHECK_EQ_INT(e.end[0], 6);
    tk_encoding_clear(&e);
    /* invalid UTF-8 reads as U+FFFD and is dropped */
    TK_CHECK_STR(toks(t, "x\xff" "x"), "x ##x");
    tk_tokenizer_destroy(&t);
}

static void test_special_tokens_in_text(void) {
    /* matched in the raw text before normalization, as HF's added vocabulary
     * does; a lower-cased or spaced copy is ordinary text */
    tk_tokenizer *t = mk(1);
    TK_CHECK_STR(toks(t, "hello[SEP]world [MASK]s [sep]"), "hello [SEP] world [MASK] [UNK] [UNK] [UNK] [UNK]"); /* s starts a word */
    tk_encoding e = {0};
    TK_CHECK(tk_tokenize_append(t, "é[CLS]", (size_t)-1, 0, &e, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 2);
    if (e.n == 2) {
        TK_CHECK_EQ_INT(e.ids[1], 2);
        TK_CHECK_EQ_INT(e.start[1], 1); /* characters */
        TK_CHECK_EQ_INT(e.end[1], 6);
        TK_CHECK_EQ_INT(e.bstart[1], 2); /* bytes */
        TK_CHECK_EQ_INT(e.bend[1], 7);
    }
    tk_encoding_clear(&e);
    TK_CHECK_EQ_INT(tk_count_tokens(t, "[CLS][CLS] hello", (size_t)-1), 3);
    tk_tokenizer_destroy(&t);
}

static void test_long_words(void) {
    tk_tokenizer *t = mk(1);
    char w[200];
    memset(w, 'x', 100);
    w[100] = 0;
    tk_encoding e = {0};
    TK_CHECK(tk_tokenize_append(t, w, (size_t)-1, 0, &e, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 100); /* x ##x ##x ... */
    memset(w, 'x', 101);
    w[101] = 0;
    e.n = 0;
    TK_CHECK(tk_tokenize_append(t, w, (size_t)-1, 0, &e, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 1);
    TK_CHECK_EQ_INT(e.ids[0], tk_tokenizer_special(t).unk);
    TK_CHECK_EQ_INT(e.end[0], 101);
    TK_CHECK_EQ_INT(tk_count_tokens(t, w, (size_t)-1), 1);
    tk_encoding_clear(&e);
    tk_tokenizer_destroy(&t);
}

static void test_offsets(void) {
    tk_tokenizer *t = mk(1);
    tk_encoding e = {0};
    /* "Café unaffable": é is 2 bytes, 1 char */
    TK_CHECK(tk_encode(t, "Café unaffable", NULL, 0, TK_TRUNC_LONGEST_FIRST, &e, NULL, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 6);
    TK_CHECK_EQ_INT(e.ids[0], tk_tokenizer_special(t).cls);
    TK_CHECK_EQ_INT(e.start[1], 0); TK_CHECK_EQ_INT(e.end[1], 4);
    TK_CHECK_EQ_INT(e.bstart[1], 0); TK_CHECK_EQ_INT(e.bend[1], 5);
    TK_CHECK_EQ_INT(e.start[2], 5); TK_CHECK_EQ_INT(e.end[2], 7);   /* un */
    TK_CHECK_EQ_INT(e.start[3], 7); TK_CHECK_EQ_INT(e.end[3], 10);  /* ##aff */
    TK_CHECK_EQ_INT(e.bstart[3], 8); TK_CHECK_EQ_INT(e.bend[3], 11);
    TK_CHECK_EQ_INT(e.ids[5], tk_tokenizer_special(t).sep);
    TK_CHECK_EQ_INT(e.start[5], 0); TK_CHECK_EQ_INT(e.end[5], 0);
    tk_encoding_clear(&e);
    tk_tokenizer_destroy(&t);
}

static void test_pairs_and_truncation(void) {
    tk_tokenizer *t = mk(1);
    tk_encoding e = {0};
    int tr = -1;
    TK_CHECK(tk_encode(t, "hello world", "unaffable", 0, TK_TRUNC_NONE, &e, &tr, NULL) == TK_OK);
    /* [CLS] hello world [SEP] un ##aff ##able [SEP] */
    TK_CHECK_EQ_INT(e.n, 8);
    TK_CHECK_EQ_INT(tr, 0);
    int types[] = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) TK_CHECK_EQ_INT(e.type_ids[i], types[i]);
    TK_CHECK_EQ_INT(e.start[4], 0); /* offsets of B are into B */
    /* longest_first to 7: B (3) is longer than A (2): B loses one */
    TK_CHECK(tk_encode(t, "hello world", "unaffable", 7, TK_TRUNC_LONGEST_FIRST, &e, &tr, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 7);
    TK_CHECK_EQ_INT(tr, 1);
    TK_CHECK_STR(tk_tokenizer_id_to_token(t, e.ids[5]), "##aff");
    TK_CHECK_EQ_INT(e.ids[6], tk_tokenizer_special(t).sep);
    TK_CHECK_EQ_INT(e.type_ids[6], 1);
    /* longest_first to 5: room 2, both get 1 */
    TK_CHECK(tk_encode(t, "hello world", "unaffable", 5, TK_TRUNC_LONGEST_FIRST, &e, NULL, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 5);
    TK_CHECK_STR(tk_tokenizer_id_to_token(t, e.ids[1]), "hello");
    TK_CHECK_STR(tk_tokenizer_id_to_token(t, e.ids[3]), "un");
    /* only_first: A loses 1 */
    TK_CHECK(tk_encode(t, "hello world", "unaffable", 7, TK_TRUNC_ONLY_FIRST, &e, NULL, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 7);
    TK_CHECK_EQ_INT(e.ids[2], tk_tokenizer_special(t).sep);
    /* only_second cannot remove 3 of B's 3 tokens */
    tk_err err = {0};
    TK_CHECK(tk_encode(t, "hello world", "unaffable", 5, TK_TRUNC_ONLY_SECOND, &e, NULL, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "truncation only_second cannot fit max_len 5: the second text has 3 tokens, 3 must go "
                          "(use longest_first or a larger max_len)");
    /* single text truncated */
    TK_CHECK(tk_encode(t, "hello world hello", NULL, 3, TK_TRUNC_LONGEST_FIRST, &e, &tr, NULL) == TK_OK);
    TK_CHECK_EQ_INT(e.n, 3);
    TK_CHECK_EQ_INT(e.ids[2], tk_tokenizer_special(t).sep);
    TK_CHECK(tk_encode(t, "hello", NULL, 1, TK_TRUNC_LONGEST_FIRST, &e, NULL, &err) == TK_EINVAL);
    tk_encoding_clear(&e);
    tk_tokenizer_destroy(&t);
}

static void test_vocab_errors(void) {
    tk_err err = {0};
    TK_CHECK(tk_tokenizer_new("/nonexistent/vocab.txt", NULL, &err) == NULL);
    TK_CHECK_EQ_INT(err.status, TK_EIO);
    TK_CHECK_STR(err.msg, "/nonexistent/vocab.txt: cannot open vocabulary: No such file or directory");
    char path[] = "/tmp/tk_vocab_XXXXXX";
    int fd = mkstemp(path);
    TK_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("[PAD]\n[CLS]\n[SEP]\nhello\n", f);
    fclose(f);
    TK_CHECK(tk_tokenizer_new(path, NULL, &err) == NULL);
    char want[256];
    snprintf(want, sizeof want, "%s: no [UNK] token (a BERT vocab.txt needs [PAD] [UNK] [CLS] [SEP])", strrchr(path, '/') + 1);
    TK_CHECK_STR(err.msg, want);
    f = fopen(path, "w");
    fputs("[PAD]\n[UNK]\n\n[CLS]\n", f);
    fclose(f);
    TK_CHECK(tk_tokenizer_new(path, NULL, &err) == NULL);
    snprintf(want, sizeof want, "%s:3: empty token (each line of vocab.txt is one token)", path);
    TK_CHECK_STR(err.msg, want);
    f = fopen(path, "w");
    fputs("[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nhello\r\n", f);  /* CRLF vocab reads fine */
    fclose(f);
    tk_tokenizer *t = tk_tokenizer_new(path, NULL, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (t) {
        TK_CHECK_EQ_INT(tk_tokenizer_vocab_size(t), 5);
        TK_CHECK_EQ_INT(tk_tokenizer_token_to_id(t, "hello"), 4);
        TK_CHECK_EQ_INT(tk_tokenizer_special(t).mask, -1);
    }
    tk_tokenizer_destroy(&t);
    unlink(path);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    TK_CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A tokenizer.json as transformers 5 writes one for BERT, with the given
 * normalizer and max_input_chars_per_word. */
static void write_tokenizer_json(const char *path, const char *normalizer, int max_word) {
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 0, \"content\": \"[PAD]\", \"special\": true},"
             " {\"id\": 1, \"content\": \"[UNK]\", \"special\": true}],"
             " \"normalizer\": %s, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
             " \"post_processor\": {\"type\": \"TemplateProcessing\"},"
             " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\","
             " \"max_input_chars_per_word\": %d, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3,"
             " \"hello\": 4, \"Hello\": 5, \"cafe\": 6, \"café\": 7, \"中\": 8, \"文\": 9, \"中文\": 10,"
             " \"##s\": 11}}}",
             normalizer, max_word);
    write_text(path, buf);
}

static void test_tokenizer_json(void) {
    char dir[] = "/tmp/tk_tokjson_XXXXXX", path[256], vt[256];
    TK_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(vt, sizeof vt, "%s/vocab.txt", dir);
    tk_err err = {0};
    /* the normalizer's flags are read: lowercase, strip_accents (null: as lowercase), CJK, max word */
    write_tokenizer_json(path, "{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true,"
                               " \"strip_accents\": null, \"lowercase\": true}", 100);
    tk_tokenizer *t = tk_tokenizer_new(path, NULL, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (t) {
        TK_CHECK_EQ_INT(tk_tokenizer_vocab_size(t), 12);
        TK_CHECK_STR(toks(t, "HELLOs Café 中文"), "hello ##s cafe 中 文");
        tk_tokenizer_destroy(&t);
    }
    write_tokenizer_json(path, "{\"type\": \"BertNormalizer\", \"handle_chinese_chars\": false,"
                               " \"strip_accents\": false, \"lowercase\": false}", 5);
    t = tk_tokenizer_new(path, NULL, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (t) {
        TK_CHECK_STR(toks(t, "Hello café 中文 hellos"), "Hello café 中文 [UNK]"); /* 6 characters > 5 */
        /* written and read back: the same tokenizer, and vocab.txt agrees with it */
        TK_CHECK(tk_tokenizer_write_json(t, path, &err) == TK_OK);
        TK_CHECK(tk_tokenizer_write_vocab(t, vt, &err) == TK_OK);
        tk_tokenizer_destroy(&t);
        char used[512];
        t = tk_tokenizer_from_folder(dir, NULL, used, sizeof used, &err);
        TK_CHECK_MSG(t != NULL, "%s", err.msg);
        TK_CHECK_STR(used, vt);
        if (t) TK_CHECK_STR(toks(t, "Hello café 中文 hellos"), "Hello café 中文 [UNK]"); /* tokenizer.json's normalizer */
        tk_tokenizer_destroy(&t);
    }
    /* no normalizer at all: nothing lower-cased, CJK not split */
    write_tokenizer_json(path, "null", 100);
    unlink(vt);
    t = tk_tokenizer_from_folder(dir, NULL, NULL, 0, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (t) TK_CHECK_STR(toks(t, "Hello 中文"), "Hello 中文");
    tk_tokenizer_destroy(&t);
    /* both files, different vocabularies: an error naming both */
    write_text(vt, "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\n");
    TK_CHECK(tk_tokenizer_from_folder(dir, NULL, NULL, 0, &err) == NULL);
    char want[1024];
    snprintf(want, sizeof want, "%s and %s disagree: 6 and 12 tokens, first difference at id 5 (\"world\" vs "
             "\"Hello\"); remove the one that does not belong to this model", vt, path);
    TK_CHECK_STR(err.msg, want);
    unlink(vt);
    /* bad files name the file and the key */
    struct { const char *text, *want; } bad[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "\"model.type\" is \"BPE\"; only WordPiece"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0, \"b\": 7}}}", "\"model.vocab\": \"b\" has id out of range"},
        {"{\"model\": {\"type\": \"WordPiece\", \"continuing_subword_prefix\": \"@@\", \"vocab\": {\"a\": 0}}}",
         "\"model.continuing_subword_prefix\" must be \"##\""},
        {"{\"normalizer\": {\"type\": \"Sequence\"}, \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
         "\"normalizer.type\" is \"Sequence\"; only BertNormalizer"},
        {"{\"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": 1}, \"model\": {\"type\": \"WordPiece\", "
         "\"vocab\": {\"a\": 0}}}", "\"normalizer.lowercase\" must be true or false"},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
         "\"pre_tokenizer.type\" is \"Whitespace\"; only BertPreTokenizer"},
        {"{\"added_tokens\": [{\"id\": 9, \"content\": \"<x>\"}], \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
         "\"added_tokens[0]\": \"<x>\" (id 9) is not in \"model.vocab\""},
        {"{\"model\": ", ":1: "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        TK_CHECK(tk_tokenizer_new(path, NULL, &err) == NULL);
        TK_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, bad[i].want), "%zu: %s", i, err.msg);
    }
    unlink(path);
    TK_CHECK(tk_tokenizer_from_folder(dir, NULL, NULL, 0, &err) == NULL);
    TK_CHECK(strstr(err.msg, "neither vocab.txt nor tokenizer.json") != NULL);
    rmdir(dir);
}

static void test_vocab_build(void) {
    const char *texts[] = {"the cat sat on the mat", "the cats sat", "Unaffable cat, the end.", "cat cat cat"};
    char path[] = "/tmp/tk_vb_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    tk_err err = {0};
    TK_CHECK(tk_vocab_build(texts, 4, 60, 1, 2, path, &err) == TK_OK);
    tk_tokenizer *t = tk_tokenizer_new(path, NULL, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (t) {
        TK_CHECK(tk_tokenizer_vocab_size(t) <= 60);
        TK_CHECK(tk_tokenizer_lowercase(t) == 1);
        TK_CHECK(tk_tokenizer_token_to_id(t, "cat") >= 0);  /* frequent word became one piece */
        TK_CHECK(tk_tokenizer_token_to_id(t, "the") >= 0);
        /* every seen word tokenizes without [UNK] */
        tk_encoding e = {0};
        for (int i = 0; i < 4; i++) {
            e.n = 0;
            tk_tokenize_append(t, texts[i], (size_t)-1, 0, &e, NULL);
            for (int k = 0; k < e.n; k++) TK_CHECK(e.ids[k] != tk_tokenizer_special(t).unk);
        }
        tk_encoding_clear(&e);
    }
    tk_tokenizer_destroy(&t);
    TK_CHECK(tk_vocab_build(texts, 4, 10, 1, 2, path, &err) == TK_EINVAL);
    TK_CHECK(strstr(err.msg, "vocab_size 10 is smaller than") != NULL);
    TK_CHECK(tk_vocab_build(texts, 0, 100, 1, 2, path, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "vocab: no texts to learn from");
    TK_CHECK(tk_vocab_build(texts, 4, 100, 1, 2, "/nonexistent/dir/vocab.txt", &err) == TK_EIO);
    unlink(path);
}

/* Seeded random bytes (valid and invalid UTF-8, controls, punctuation):
 * no crash under ASan, offsets ordered and inside the text. */
static void test_random_bytes(void) {
    tk_tokenizer *t = mk(1), *c = mk(0);
    static const char *frag[] = {"un", "aff", "able", " ", "\t", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                 "!", "\xff", "\xC3", "\x01", "\xEF\xBF\xBD", "x", "\xE2\x80\x83", "\xCC\x81"};
    uint64_t s = 42;
    tk_encoding e = {0};
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        char buf[512];
        size_t n = 0;
        int parts = (int)(s % 60);
        for (int k = 0; k < parts; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frag[(s >> 33) % 16];
            size_t l = strlen(f);
            memcpy(buf + n, f, l);
            n += l;
        }
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        for (int pass = 0; pass < 2; pass++) {
            e.n = 0;
            if (tk_tokenize_append(pass ? c : t, buf, n, 0, &e, NULL) != TK_OK) { bad++; continue; }
            for (int i = 0; i < e.n; i++) {
                if (e.bstart[i] < 0 || e.bend[i] > (int)n || e.bstart[i] >= e.bend[i] || e.start[i] >= e.end[i]) bad++;
                if (i && e.bstart[i] < e.bstart[i - 1]) bad++;
            }
            if (tk_count_tokens(pass ? c : t, buf, n) != e.n) bad++;
        }
    }
    TK_CHECK_EQ_INT(bad, 0);
    tk_encoding_clear(&e);
    tk_tokenizer_destroy(&t);
    tk_tokenizer_destroy(&c);
}

int main(void) {
    TK_RUN(test_unaffable);
    TK_RUN(test_accents_and_case);
    TK_RUN(test_cjk_control_punct);
    TK_RUN(test_special_tokens_in_text);
    TK_RUN(test_long_words);
    TK_RUN(test_offsets);
    TK_RUN(test_pairs_and_truncation);
    TK_RUN(test_vocab_errors);
    TK_RUN(test_tokenizer_json);
    TK_RUN(test_vocab_build);
    TK_RUN(test_random_bytes);
    return tk_test_done();
}

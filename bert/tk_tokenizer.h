/* tk_tokenizer.h — WordPiece tokenizer compatible with HF BertTokenizerFast.
 *
 * What it does: reads a vocab.txt (one token per line, id = line number) or
 * a tokenizer.json (HF tokenizers' file, as transformers 5 saves a BERT
 * folder: model.vocab, unk_token, max_input_chars_per_word, the
 * BertNormalizer's flags), writes both, and turns UTF-8 text into word-piece ids the way HF `tokenizers` does with
 * BertNormalizer + BertPreTokenizer + WordPiece + the BERT template
 * ([CLS] A [SEP] B [SEP]):
 *   - special tokens in the text ([CLS], [SEP], [PAD], [UNK], [MASK]; for a
 *     tokenizer.json its added_tokens) are matched first, in the raw text,
 *     as HF's added vocabulary does, and become their own ids;
 *   - cleaning (clean_text): U+0000, U+FFFD and category-C characters (except
 *     \t \n \r) are dropped; white space (incl. Zs, \t \n \r) becomes a space;
 *   - CJK ideographs become words of their own (handle_chinese_chars);
 *   - uncased vocabularies only: accents stripped (NFD, Mn dropped), lower-case;
 *   - split on white space; each punctuation character (ASCII 33-47, 58-64,
 *     91-96, 123-126 or Unicode P*) is its own word;
 *   - greedy longest-match-first with "##" continuations; a word of more than
 *     100 characters, or one with a piece not in the vocabulary, is [UNK].
 * Offsets are Unicode character (code point) offsets into the original text,
 * as HF reports them (special tokens get 0,0); byte offsets are kept too.
 * Invalid UTF-8 bytes read as U+FFFD, so they are dropped like HF drops it.
 *
 * Guarantees: no global state; a tk_tokenizer is immutable after creation and
 * may be shared by threads. Errors name the file and line.
 */
#ifndef TK_TOKENIZER_H
#define TK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h" /* tk_status, tk_err */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_tokenizer tk_tokenizer;

typedef struct tk_tokenizer_opts {
    int lowercase;     /* 1 lower-case + strip accents, 0 keep case; -1 = decide from the
                        * vocabulary: uncased when no token has an upper-case letter */
    int strip_accents; /* -1 = same as lowercase (HF default); 0/1 force */
    int max_word_chars;/* 0 = 100 (HF max_input_chars_per_word) */
    int keep_cjk;      /* 1: CJK ideographs are not split off (handle_chinese_chars false) */
    int keep_control;  /* 1: no cleaning (clean_text false): control characters stay in words */
} tk_tokenizer_opts;

/* Reads vocab.txt, or tokenizer.json when the path ends in ".json" (then
 * the file's normalizer is the default for what `opts` leaves at -1/0; only
 * model.type WordPiece with "##" pieces, the BertNormalizer (or none), the
 * BertPreTokenizer and BERT's template are accepted, and added_tokens must be
 * vocabulary entries matched in the raw text: normalized, single_word,
 * lstrip and rstrip false). `opts` may be NULL (all defaults). The vocabulary must
 * hold the unknown token ([UNK], or tokenizer.json's unk_token), [CLS], [SEP],
 * [PAD] ([MASK] optional). New object, or NULL with err naming the file and
 * line or key ("vocab.txt: cannot open: No such file or directory",
 * "vocab.txt:7: empty token", "vocab.txt: no [UNK] token",
 * "tokenizer.json: \"model.type\" is \"BPE\"; only WordPiece ..."). */
tk_tokenizer *tk_tokenizer_new(const char *vocab_path, const tk_tokenizer_opts *opts, tk_err *err);
/* A model folder's tokenizer: vocab.txt, else tokenizer.json. With both,
 * their vocabularies (and unknown token) must be the same list, else an
 * error naming both files; tokenizer.json's normalizer then decides what
 * `opts` leaves open (transformers' fast tokenizer reads that file). `used`
 * (un bytes, may be NULL) gets the file whose vocabulary was read. */
tk_tokenizer *tk_tokenizer_from_folder(const char *dir, const tk_tokenizer_opts *opts, char *used, size_t un,
                                       tk_err *err);
/* Writes the vocabulary as vocab.txt (one token a line, id order), or the
 * whole tokenizer as a tokenizer.json that HF tokenizers (transformers 4
 * and 5) loads to the same ids; each atomically. */
tk_status tk_tokenizer_write_vocab(const tk_tokenizer *t, const char *path, tk_err *err);
tk_status tk_tokenizer_write_json(const tk_tokenizer *t, const char *path, tk_err *err);
/* Same from tokens in memory (id = index; tokens are copied). `name` is used in
 * errors. */
tk_tokenizer *tk_tokenizer_from_tokens(const char *const *tokens, int n, const char *name,
                                       const tk_tokenizer_opts *opts, tk_err *err);
void tk_tokenizer_destroy(tk_tokenizer **p);

int tk_tokenizer_vocab_size(const tk_tokenizer *t);
int tk_tokenizer_lowercase(const tk_tokenizer *t);   /* 1 when it lower-cases */
/* Its normalizer as options (every field decided: lowercase and
 * strip_accents 0/1), e.g. to write a tokenizer_config.json that agrees. */
tk_tokenizer_opts tk_tokenizer_normalizer(const tk_tokenizer *t);
int tk_tokenizer_token_to_id(const tk_tokenizer *t, const char *token); /* -1 if absent */
const char *tk_tokenizer_id_to_token(const tk_tokenizer *t, int id);    /* borrowed; NULL if out of range */

typedef struct tk_special_ids { int32_t pad, unk, cls, sep, mask; /* mask -1 if absent */ } tk_special_ids;
tk_special_ids tk_tokenizer_special(const tk_tokenizer *t);

/* One encoded sequence or pair. Arrays have n entries; the struct owns them
 * (tk_encoding_clear frees them; a zeroed struct is a valid empty encoding and
 * can be reused across calls without clearing). */
typedef struct tk_encoding {
    int n, cap;
    int32_t *ids;
    int32_t *type_ids;    /* 0 for [CLS] A [SEP], 1 for B [SEP] */
    int32_t *seq;         /* 0 = from A, 1 = from B, -1 = special token */
    int32_t *start, *end; /* character offsets into its own text (A or B), [start,end) */
    int32_t *bstart, *bend; /* the same in bytes */
} tk_encoding;
void tk_encoding_clear(tk_encoding *e);

/* Word pieces of `text` (len bytes; len (size_t)-1 = strlen), no special tokens,
 * appended to `out` with seq = `seq` and type id = `seq`. Only fails on
 * out-of-memory (TK_EOOM). */
tk_status tk_tokenize_append(const tk_tokenizer *t, const char *text, size_t len, int seq,
                             tk_encoding *out, tk_err *err);

typedef enum {
    TK_TRUNC_LONGEST_FIRST = 0, /* HF default: trims the longer, keeps the split balanced */
    TK_TRUNC_ONLY_FIRST,
    TK_TRUNC_ONLY_SECOND,
    TK_TRUNC_NONE
} tk_truncation;

/* Encodes [CLS] a [SEP] (b [SEP]) into `out` (reset first). `b` may be NULL.
 * With max_len > 0 and a strategy other than NONE, the result has at most
 * max_len tokens, trimmed as HF `tokenizers` trims; *truncated (may be NULL)
 * says whether tokens were dropped. Errors: TK_EINVAL when the strategy
 * cannot fit (e.g. only_second and the first alone exceeds max_len). */
tk_status tk_encode(const tk_tokenizer *t, const char *a, const char *b, int max_len,
                    tk_truncation strategy, tk_encoding *out, int *truncated, tk_err *err);

/* Number of word pieces of `text` without special tokens (no allocation
 * visible to the caller; for length statistics). -1 on out-of-memory. */
int tk_count_tokens(const tk_tokenizer *t, const char *text, size_t len);

/* The normalizer and pre-tokenizer alone (used by the vocabulary builder):
 * calls `fn(word, nbytes, user)` for each word of `text` after cleaning,
 * CJK splitting, optional lower-casing/accent stripping and punctuation
 * splitting. Returns TK_OK or TK_EOOM. */
typedef void (*tk_word_fn)(const char *word, size_t nbytes, void *user);
tk_status tk_pretokenize(const char *text, size_t len, int lowercase, tk_word_fn fn, void *user);

/* ---- vocabulary builder (bert/vocab_build.c) ----------------------------- */

/* Learns a WordPiece vocabulary of at most `vocab_size` tokens from `n` texts
 * and writes it to `out_path` (vocab.txt: [PAD] [UNK] [CLS] [SEP] [MASK], then
 * every character seen (as itself and as "##c"), then merged pieces in order
 * of learning). Merges pick the most frequent adjacent pairs (as HF's
 * WordPieceTrainer, a BPE trainer with "##" continuations, does) among pairs
 * seen at least `min_count` (0 = 2) times. `lowercase` selects the
 * normalizer as in the tokenizer. Errors: TK_EINVAL (no text, vocab_size too
 * small for the alphabet), TK_EIO (cannot write out_path). */
tk_status tk_vocab_build(const char *const *texts, int n, int vocab_size, int lowercase,
                         int min_count, const char *out_path, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

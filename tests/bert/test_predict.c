/* test_predict.c — the SQuAD v1.1 answer metric on hand-made cases, each
 * expectation computed with the official script's definitions
 * (normalize_answer, exact_match_score, f1_score; max over gold answers):
 * case and punctuation, articles only as whole words, duplicate tokens
 * counted as multisets, empty answers, non-ASCII lower case (with Greek
 * final sigma) and non-ASCII punctuation kept. */
#include "tk_predict.h"
#include "tk_test.h"

typedef struct {
    const char *pred;
    const char *gold[2];
    int n_gold;
    double em, f1;
} squad_case;

static const squad_case CASES[] = {
    {"The Cat", {"the cat"}, 1, 1, 1},
    {"cat.", {"cat"}, 1, 1, 1},
    {"a red cat", {"the red dog"}, 1, 0, 0.5},
    {"", {""}, 1, 1, 0},
    {"", {"x"}, 1, 0, 0},
    {"cat cat dog", {"cat dog dog"}, 1, 0, 2.0 / 3.0},
    {"Paris", {"London", "paris"}, 2, 1, 1},
    {"\xc3\x9cn\xc3\xaf" "code", {"\xc3\xbcn\xc3\xaf" "code"}, 1, 1, 1},          /* Ünïcode / ünïcode */
    {"the theater", {"theater"}, 1, 1, 1},
    {"cat\xe2\x80\x94" "dog", {"cat dog"}, 1, 0, 0},                         /* an em dash is no ASCII punctuation */
    {"the\xe2\x80\x94" "cat", {"\xe2\x80\x94" "cat"}, 1, 1, 1},              /* 'the' before a dash is a word */
    {"an_apple", {"an apple"}, 1, 0, 0},                                     /* '_' joins words */
    {"The  1,000   km", {"1000 km"}, 1, 1, 1},
    {"\xce\xa3\xce\x8a\xce\xa3\xce\xa5\xce\xa6\xce\x9f\xce\xa3", {"\xcf\x83\xce\xaf\xcf\x83\xcf\x85\xcf\x86\xce\xbf\xcf\x83"}, 1, 0, 0},
    {"no gold", {NULL}, 0, 0, 0},
};

static void test_squad_v11_metric(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const squad_case *c = &CASES[i];
        double em = tk_squad_em(c->pred, c->gold, c->n_gold), f1 = tk_squad_f1(c->pred, c->gold, c->n_gold);
        TK_CHECK_MSG(fabs(em - c->em) < 1e-12, "case %zu '%s': EM %g, want %g", i, c->pred, em, c->em);
        TK_CHECK_MSG(fabs(f1 - c->f1) < 1e-12, "case %zu '%s': F1 %g, want %g", i, c->pred, f1, c->f1);
    }
}

int main(void) {
    TK_RUN(test_squad_v11_metric);
    return tk_test_done();
}

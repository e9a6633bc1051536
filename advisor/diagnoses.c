/* diagnoses.c — the names of the diagnosis kinds (tk_diag_kind): the words a
 * report shows and the ids the JSON carries, for every reader (a plan, a
 * pasted message, a snapshot). Alone so that the fuzz targets, which build
 * the readers without the planner, link it too. */
#include "tk_advisor.h"

static const char *const DIAG_NAMES[TK_DIAG_COUNT] = {
    "capacity", "headroom", "fragmentation", "dominant layer", "dominant category",
    "padding", "data spike", "leak", "card lottery", "card choice", "held outside the step",
    "another process", "the step or held memory", "no kernel image", "several GPUs", "platform",
    "growth", "engine pool",
};

static const char *const DIAG_IDS[TK_DIAG_COUNT] = {
    "capacity", "headroom", "fragmentation", "dominant_layer", "dominant_category",
    "padding", "data_spike", "leak", "card_lottery", "card_choice", "held",
    "another_process", "step_or_held", "no_kernel_image", "multi_gpu", "platform",
    "growth", "engine_pool",
};

const char *tk_diag_name(tk_diag_kind k) {
    return (unsigned)k < TK_DIAG_COUNT ? DIAG_NAMES[k] : "?";
}

const char *tk_diag_id(tk_diag_kind k) {
    return (unsigned)k < TK_DIAG_COUNT ? DIAG_IDS[k] : "other";
}

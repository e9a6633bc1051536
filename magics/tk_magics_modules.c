/* tk_magics_modules.c — tk_magics_new: an empty registry (tk_magics.c) with
 * every magic module listed in tk_magics_modules.def registered (one
 * TK_MAGIC_MODULE(fn) line each; see tk_magics.h). Order is the order of
 * registration; a name registered twice keeps the first. Calls go one way:
 * this file -> the modules -> the registry. */
#include <stdio.h>

#include "tk_magics.h"

#define TK_MAGIC_MODULE(fn) int fn(tk_magics *m);
#include "tk_magics_modules.def"
#undef TK_MAGIC_MODULE

tk_magics *tk_magics_new(void) {
    tk_magics *m = tk_magics_new_empty();
    if (!m) return NULL;
    int rc = 0;
#define TK_MAGIC_MODULE(fn) if (fn(m) != 0) rc = -1;
#include "tk_magics_modules.def"
#undef TK_MAGIC_MODULE
    if (rc) fprintf(stderr, "txkernel: some magics could not be registered (duplicate names or out of memory)\n");
    return m;
}

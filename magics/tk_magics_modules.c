/* tk_magics_modules.c — registers every magic module listed in
 * tk_magics_modules.def (one TK_MAGIC_MODULE(fn) line each; see tk_magics.h).
 * Order is the order of registration; a name registered twice keeps the first. */
#include "tk_magics.h"

#define TK_MAGIC_MODULE(fn) int fn(tk_magics *m);
#include "tk_magics_modules.def"
#undef TK_MAGIC_MODULE

int tk_magics_register_modules(tk_magics *m);
int tk_magics_register_modules(tk_magics *m) {
    int rc = 0;
#define TK_MAGIC_MODULE(fn) if (fn(m) != 0) rc = -1;
#include "tk_magics_modules.def"
#undef TK_MAGIC_MODULE
    return rc;
}

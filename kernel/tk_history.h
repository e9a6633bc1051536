/* tk_history.h — per-user execution history (internal to kernel/).
 *
 * Each stored cell is one JSON line {"s":session,"l":line,"i":input,"o":output}
 * appended to a file, so history survives restarts. History is bounded by
 * bytes as well as by count, so no cell a user ran can make a later kernel
 * slow to start or large:
 *  - a cell (or its output) over TK_HIST_CELL_MAX is kept as its first and
 *    last lines around a marker line saying how much was left out;
 *  - memory holds the last TK_HIST_KEEP entries, and fewer when they would
 *    hold over TK_HIST_MAX_BYTES (a ring; the oldest go first);
 *  - start-up reads the file backwards from its end, only as far as memory
 *    keeps (and never more than TK_HIST_SCAN_MAX bytes); a line over
 *    TK_HIST_LINE_MAX (a whole huge cell an older kernel wrote) is skipped;
 *  - the file is compacted to what memory keeps when it is over four times
 *    that size.
 * Session numbers count kernel starts: each start takes max(previous)+1.
 */
#ifndef TK_HISTORY_H
#define TK_HISTORY_H
#include <jansson.h>
#include <stddef.h>

#define TK_HIST_KEEP 2000
#define TK_HIST_CELL_MAX ((size_t)1 << 20)
#define TK_HIST_CUT_LINES 5             /* first and last lines kept of a cut cell */
#define TK_HIST_CUT_SIDE ((size_t)16 << 10) /* at most this many bytes of each */
#define TK_HIST_MAX_BYTES ((size_t)16 << 20)
#define TK_HIST_SCAN_MAX ((size_t)64 << 20)
#define TK_HIST_LINE_MAX ((size_t)16 << 20)

typedef struct tk_history tk_history;
/* path "" keeps history in memory only. A file that cannot be opened is
 * reported on stderr and history goes on in memory: a read-only home must not
 * stop the kernel. New. */
tk_history *tk_history_open(const char *path);
void tk_history_close(tk_history **ph);
int tk_history_session(const tk_history *h);
/* input borrowed; output (text/plain result) borrowed, may be NULL. */
void tk_history_add(tk_history *h, int line, const char *input, const char *output);
/* Answers a history_request content (borrowed): returns a new array of
 * [session, line, input] or [session, line, [input, output]], or NULL with
 * *why set when the request is malformed. */
json_t *tk_history_query(tk_history *h, json_t *content, const char **why);
/* Entries and bytes (inputs and outputs) held in memory now. */
size_t tk_history_count(const tk_history *h);
size_t tk_history_bytes(const tk_history *h);
/* text of len bytes as history keeps it: itself (new copy) when it is at
 * most TK_HIST_CELL_MAX, else its first and last lines around a marker. NULL
 * on OOM. */
char *tk_history_cut(const char *text, size_t len);
#endif

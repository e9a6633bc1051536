/* tk_history.h — per-user execution history (internal to kernel/).
 *
 * Each stored cell is one JSON line {"s":session,"l":line,"i":input,"o":output}
 * appended to a file, so history survives restarts. Memory holds only the last
 * TK_HIST_KEEP entries (a ring), so a long session does not grow the process;
 * the file is compacted to that many lines when it grows past four times it.
 * Session numbers count kernel starts: each start takes max(previous)+1.
 */
#ifndef TK_HISTORY_H
#define TK_HISTORY_H
#include <jansson.h>

#define TK_HIST_KEEP 2000

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
#endif

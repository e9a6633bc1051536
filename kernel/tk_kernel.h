/* tk_kernel.h — the Jupyter kernel (messaging protocol 5.3): message codec,
 * protocol core, interpreter interface, and the ZeroMQ transport.
 *
 * Three layers wired by callbacks (as in xeus):
 *   transport (tk_zmq.c)  sockets, threads, heartbeat; hands raw frames to the core
 *   core      (tk_core.c) verify, decode, dispatch by msg_type, status, replies,
 *                         execution count, history; sends raw frames back through a
 *                         tk_transport table, so tests can swap in an in-memory one
 *   interpreter           a tk_interp table (magics/ provides one); it never sees a
 *                         socket, only a tk_out sink and a cancel flag.
 *
 * Guarantees: every request whose header can be read and trusted gets a reply:
 * one the kernel cannot take (over its size limit, a part that is not JSON,
 * invalid UTF-8, a lone surrogate, a NUL in its code, wrong types) gets an
 * error reply saying why. Only a message with no readable header (unsigned,
 * mis-signed, replayed, missing frames, a header that is not a JSON object
 * with msg_id and msg_type) is dropped, and that is logged on stderr. Nothing
 * bad is ever executed or crashes the process. Nothing here exits or aborts.
 *
 * Ownership: "new" = caller destroys; "borrowed" = lives as long as its owner.
 * *_destroy(T **p) is a no-op on NULL and sets *p to NULL.
 */
#ifndef TK_KERNEL_H
#define TK_KERNEL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TK_KERNEL_VERSION "0.1.0"
#define TK_PROTOCOL_VERSION "5.3"
/* The kernel's own limit on one message (all frames): a larger request is
 * answered with an error naming both sizes. The transport sets no limit of
 * its own (a ZeroMQ ZMQ_MAXMSGSIZE drops the connection without a word).
 * TXKERNEL_MAX_MESSAGE_BYTES overrides it (tk_core_opts.max_message_bytes). */
#define TK_MSG_MAX_BYTES ((size_t)1 << 30)
#define TK_HEADER_MAX_BYTES (1u << 20) /* a header frame larger than this is not read */

typedef struct tk_kerr { char msg[512]; } tk_kerr;

/* ---- message codec ------------------------------------------------------ */

/* One raw ZeroMQ frame. Borrowed bytes unless a function says otherwise. */
typedef struct tk_frame { const uint8_t *data; size_t len; } tk_frame;

/* A decoded message. All json_t members are owned by the message. */
typedef struct tk_msg {
    size_t nids;            /* routing identities (before <IDS|MSG>) */
    uint8_t **ids;          /* owned copies */
    size_t *id_lens;
    json_t *header, *parent, *metadata, *content;
    const char *msg_id;     /* borrowed from header */
    const char *msg_type;   /* borrowed from header */
    /* What identifies this exact message for the replay guard: the signature
     * when messages are signed, else the raw header bytes (owned). msg_id alone
     * is not unique: jupyter_client's cloned sessions (a KernelManager and its
     * clients) number their msg_ids from the same session id independently. */
    uint8_t *replay_key;
    size_t replay_key_len;
    /* "" for a message decoded whole. Otherwise the header was read (and its
     * signature checked) but the rest cannot be taken: why, for the error
     * reply. Then parent, metadata and content may be NULL. */
    char refused[640];
} tk_msg;

void tk_msg_destroy(tk_msg **pm);

/* HMAC-SHA256 signer; any key length; an empty key signs with "" and accepts
 * any signature (the connection file asked for no authentication). */
typedef struct tk_signer tk_signer;
tk_signer *tk_signer_new(const uint8_t *key, size_t key_len);    /* new; NULL on OOM */
void tk_signer_destroy(tk_signer **ps);
/* Writes the lowercase hex digest of the four frames into hex[65] ("" for an
 * empty key). */
void tk_signer_sign(const tk_signer *s, const tk_frame parts[4], char hex[65]);

/* Decodes raw received frames: finds <IDS|MSG>, checks the signature over the
 * raw header/parent/metadata/content frames in constant time, parses them as
 * JSON objects (jansson rejects invalid UTF-8 and lone surrogates; NULs are
 * kept; the header refuses duplicated keys, the other parts keep the last, as
 * Python's json does), checks header field types. Returns a new message, or
 * NULL with err filled (the caller logs it) when there is no readable, trusted
 * header. A message whose header is readable but whose total size is over
 * max_bytes, or whose other parts do not decode, comes back with refused set
 * (see tk_msg). Does not check replays: see tk_replay. */
tk_msg *tk_msg_decode_max(const tk_signer *s, const tk_frame *frames, size_t n, size_t max_bytes, tk_kerr *err);
/* tk_msg_decode_max with TK_MSG_MAX_BYTES. */
tk_msg *tk_msg_decode(const tk_signer *s, const tk_frame *frames, size_t n, tk_kerr *err);
/* "1.5 GiB" (binary units, one decimal) into buf. */
void tk_msg_format_bytes(size_t n, char *buf, size_t len);

/* Encodes header/parent/metadata/content (borrowed) with the given identities
 * into frames: ids..., "<IDS|MSG>", signature, header, parent, metadata,
 * content. Writes the frame count to *n and a new array of new byte buffers to
 * *out (free each .data then the array with tk_frames_free). -1 on OOM. */
int tk_msg_encode(const tk_signer *s, const tk_msg *route, json_t *header, json_t *parent,
                  json_t *metadata, json_t *content, tk_frame **out, size_t *n);
void tk_frames_free(tk_frame *frames, size_t n);

/* A header for a new message: msg_id (uuid4), session, username, date (UTC ISO
 * 8601 with microseconds), msg_type, version. New reference. */
json_t *tk_msg_header_new(const char *session, const char *msg_type);

/* Remembers the last TK_REPLAY_KEEP message keys (tk_msg.replay_key; a keyed
 * 64-bit hash of each, fixed memory) and says whether one was seen before, so a
 * captured message sent again is not executed twice. Not thread safe. */
#define TK_REPLAY_KEEP 16384
typedef struct tk_replay tk_replay;
tk_replay *tk_replay_new(void);
void tk_replay_destroy(tk_replay **pr);
/* 1 if key was already seen (a replay), else records it and returns 0. */
int tk_replay_check(tk_replay *r, const uint8_t *key, size_t len);

/* ---- interpreter interface ---------------------------------------------- */

/* Where an executing cell sends its output. The core implements it; every call
 * publishes at once on iopub with the executing request as parent, so all of a
 * cell's output precedes its idle status. Valid only while execute runs; it may
 * be called from a worker thread the interpreter starts and joins within that
 * call (iopub sends are serialised). Arguments are borrowed. */
typedef struct tk_out tk_out;
typedef struct tk_out_ops {
    void (*stream)(tk_out *o, const char *name /* "stdout"|"stderr" */, const char *text);
    /* data: MIME bundle object; metadata may be NULL; display_id may be NULL.
     * update != 0 sends update_display_data (display_id required). */
    void (*display)(tk_out *o, json_t *data, json_t *metadata, const char *display_id, int update);
    void (*result)(tk_out *o, json_t *data, json_t *metadata);    /* execute_result */
    void (*clear)(tk_out *o, int wait);                            /* clear_output */
    /* traceback: array of strings or NULL (then evalue alone). The reply becomes
     * an error reply carrying the same ename/evalue/traceback. */
    void (*error)(tk_out *o, const char *ename, const char *evalue, json_t *traceback);
    void (*page)(tk_out *o, json_t *data);                         /* pager payload */
} tk_out_ops;
struct tk_out { const tk_out_ops *ops; void *impl; };

/* Options of one execute_request the interpreter may care about. */
typedef struct tk_exec_opts {
    int silent, store_history, allow_stdin;
    int execution_count;    /* the count this cell runs as */
} tk_exec_opts;

/* The interpreter: a table of callbacks plus its own context pointer. Every
 * callback runs on the shell thread, except kernel_info, which the control
 * thread may also call while a cell runs (keep it free of mutable state).
 * cancel is set from the control thread or a signal handler; the interpreter
 * polls it and ends the cell with an error when it is set. Optional callbacks
 * may be NULL: no completions, nothing found, "unknown", default info. */
typedef struct tk_interp {
    void *self;
    /* Runs one cell. Returns 0 when the cell succeeded, -1 after out->error. */
    int (*execute)(void *self, const char *code, const tk_exec_opts *opts, tk_out *out,
                   atomic_int *cancel);
    /* Completion at byte offset cursor: appends strings to matches (borrowed
     * array) and sets the replaced byte range [*start, *end). */
    void (*complete)(void *self, const char *code, size_t cursor, json_t *matches,
                     size_t *start, size_t *end);
    /* Help for the word at byte offset cursor into data (a MIME bundle object,
     * borrowed). Returns 1 when found. */
    int (*inspect)(void *self, const char *code, size_t cursor, int detail, json_t *data);
    /* "complete" | "incomplete" | "invalid" | "unknown"; indent for incomplete. */
    const char *(*is_complete)(void *self, const char *code, const char **indent);
    /* Fills language_info, banner and help_links of kernel_info_reply (borrowed). */
    void (*kernel_info)(void *self, json_t *reply_content);
} tk_interp;

/* ---- protocol core ------------------------------------------------------- */

typedef enum { TK_CH_SHELL = 0, TK_CH_CONTROL, TK_CH_STDIN, TK_CH_IOPUB, TK_CH_COUNT } tk_channel;

/* How the core sends: frames are borrowed for the call. Sends on iopub may come
 * from the shell and the control thread; the core serialises them. */
typedef struct tk_transport {
    void *self;
    void (*send)(void *self, tk_channel ch, const tk_frame *frames, size_t n);
    /* Optional (NULL: none). Hands the messages waiting on ch to
     * tk_core_handle, and those that arrive until none has come for quiet_s
     * (at most max_s in all). The core calls it when a stop_on_error cell
     * failed, before its reply goes out: what arrives then was sent before
     * the client could have read that reply, and is aborted. */
    void (*drain)(void *self, tk_channel ch, double quiet_s, double max_s);
} tk_transport;

typedef struct tk_core_opts {
    const uint8_t *key; size_t key_len;
    tk_interp interp;           /* copied */
    tk_transport transport;     /* copied */
    const char *history_path;   /* NULL: default per-user path; "" : no file */
    /* seconds after an error during which execute requests are still
     * aborted: sent within it (by header.date, see tk_core.c), or taken off
     * the queue within it when undated; ipykernel's stop_on_error_timeout.
     * Requests already waiting when the error went out are aborted
     * whatever their dates (tk_transport.drain). */
    double stop_on_error_timeout;
    /* the largest message (all frames) the kernel takes; 0: TK_MSG_MAX_BYTES */
    size_t max_message_bytes;
} tk_core_opts;

typedef struct tk_core tk_core;
tk_core *tk_core_new(const tk_core_opts *opts, tk_kerr *err);  /* new */
void tk_core_destroy(tk_core **pc);

/* Handles one received message (raw frames, borrowed). A request that cannot
 * be taken but has a readable header gets an error reply; a message with no
 * readable header is logged and dropped. Shell requests run on the calling
 * thread. */
void tk_core_handle(tk_core *c, tk_channel ch, const tk_frame *frames, size_t n);
/* Nonzero after a stop_on_error cell failed and until an execute request
 * sent after the client could have seen that error runs. */
int tk_core_aborting(tk_core *c);
/* Publishes status "starting" (once, at start). */
void tk_core_starting(tk_core *c);
/* The cancel flag the interpreter polls; interrupt_request and SIGINT set it. */
atomic_int *tk_core_cancel_flag(tk_core *c);
/* Nonzero once a shutdown_request was answered; *restart tells which kind. */
int tk_core_should_stop(tk_core *c, int *restart);
/* Publishes an iopub message (content borrowed) with an empty parent, e.g.
 * iopub_welcome. */
void tk_core_publish(tk_core *c, const char *msg_type, json_t *content);
/* Number of messages dropped as bad since start (no readable header; for
 * tests). */
unsigned long tk_core_dropped(tk_core *c);
/* Number of requests answered with an error because they could not be taken
 * (too large, undecodable parts, a NUL in the code). */
unsigned long tk_core_refused(tk_core *c);
int tk_core_execution_count(tk_core *c);
const char *tk_core_session(tk_core *c);

/* ---- history (persisted per user) --------------------------------------- */

/* Default file: $XDG_DATA_HOME/txkernel/history.jsonl or
 * ~/.local/share/txkernel/history.jsonl. Writes into buf; "" if no home. */
void tk_history_default_path(char *buf, size_t n);

/* ---- ZeroMQ transport ---------------------------------------------------- */

/* Reads the connection file, binds every socket (tcp or ipc), starts the
 * heartbeat and control threads, and serves shell on the calling thread until a
 * shutdown_request or SIGTERM. SIGINT sets the cancel flag. Returns 0 on a clean
 * shutdown, -1 with err on a setup failure (bad connection file, bind error). */
int tk_kernel_serve(const char *connection_file, const tk_interp *interp, tk_kerr *err);

#endif

/* tk_config_edit.h — a config file's text changed in place: the user's file
 * plus a change (txk advise CFG --fix N -o F), never the whole config
 * written out again. */
#ifndef TK_CONFIG_EDIT_H
#define TK_CONFIG_EDIT_H

#include <stddef.h>
#include "tk_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rewrites the YAML text[0..len) (named `source` in errors), which parses
 * to `from` over the defaults, so that it parses to `to`: the value of each
 * key that differs is replaced where the text sets it (its other bytes on
 * the line, comments, other lines and their number spellings kept); a key
 * the text does not set is added as a `key: value` line at the end; a key
 * that does not differ is not touched, so a key left unset stays unset.
 * The result is parsed back and must give `to`, or it is not returned.
 * New NUL-terminated string (its length in *out_len), or NULL with err
 * (TK_EINVAL: the text cannot be changed that way, naming the key;
 * TK_ENOMEM). */
char *tk_config_edit_yaml(const char *text, size_t len, const char *source, const tk_config *from,
                          const tk_config *to, size_t *out_len, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif

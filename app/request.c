/* request.c — what every verb's request starts from: the config, read the
 * same way whether a shell names the file (`txk plan cfg.yaml`, `--file`) or
 * a cell does (`%txplan --file`, `%%txtrain --file`).
 *
 * Guarantees: the file is read whole before it is parsed; an error names
 * the file (and the parser names the line and key).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_app.h"

tk_status tk_app_config_load(tk_config *c, const char *path, const tk_app_args *a, tk_err *err) {
    tk_config_defaults(c);
    tk_status st = tk_app_config_file(c, path, err);
    if (st == TK_OK) st = tk_app_args_apply(a, c, err);
    if (st != TK_OK || (st = tk_config_validate(c, err)) == TK_OK) return st;
    char m[sizeof err->msg];
    snprintf(m, sizeof m, "%s", err->msg);
    tk_err_set(err, st, "%s: %.900s", path, m);
    return st;
}

tk_status tk_app_config_file(tk_config *c, const char *path, tk_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tk_err_set(err, TK_EIO, "%s: cannot read the config: %s", path, strerror(errno));
        return TK_EIO;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    char chunk[8192];
    size_t k;
    int bad = !mem;
    while (mem && (k = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (fwrite(chunk, 1, k, mem) != k) bad = 1;
    if (ferror(f)) bad = 1;
    fclose(f);
    if (mem) fclose(mem);
    if (bad) {
        free(buf);
        tk_err_set(err, TK_EIO, "%s: cannot read the config", path);
        return TK_EIO;
    }
    tk_status st = tk_config_parse_yaml(c, buf ? buf : "", len, path, err);
    free(buf);
    return st;
}

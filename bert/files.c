/* files.c — `mkdir -p` with an error that names the path (tk_files.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_files.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h"

/* One component: made, or already a folder. A file in the way reports
 * ENOTDIR, which says more than mkdir's EEXIST. */
static int make_one(const char *p) {
    if (mkdir(p, 0755) == 0) return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST) {
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        e = ENOTDIR;
    }
    errno = e;
    return -1;
}

tk_status tk_mkdirs(const char *path, tk_err *err) {
    if (!path || !path[0]) {
        tk_err_set(err, TK_EINVAL, "cannot create a folder with an empty name");
        return TK_EINVAL;
    }
    size_t n = strlen(path);
    char *p = tk_malloc(n + 1);
    if (!p) return tk_err_nomem(err, path);
    memcpy(p, path, n + 1);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    int rc = 0;
    for (char *s = p + 1; *s && rc == 0; s++) {
        if (*s != '/' || s[-1] == '/') continue;
        *s = 0;
        rc = make_one(p);
        if (rc) break;
        *s = '/';
    }
    if (rc == 0) rc = make_one(p);
    if (rc) {
        int e = errno;
        struct stat st;
        int is_file = e == ENOTDIR && stat(p, &st) == 0 && !S_ISDIR(st.st_mode);
        if (strcmp(p, path) == 0 || (strlen(p) == n && strncmp(p, path, n) == 0))
            tk_err_set(err, TK_EIO, "%s: cannot create folder: %s%s", path, strerror(e),
                       is_file ? " (a file has that name)" : "");
        else
            tk_err_set(err, TK_EIO, "%s: cannot create folder %s: %s%s", path, p, strerror(e),
                       is_file ? " (it is a file)" : "");
    }
    free(p);
    return rc ? TK_EIO : TK_OK;
}

tk_status tk_write_json_atomic(const char *path, const json_t *j, size_t flags, tk_err *err) {
    char *s = json_dumps(j, flags);
    if (!s) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        return TK_ENOMEM;
    }
    const void *parts[2] = {s, "\n"};
    size_t sizes[2] = {strlen(s), 1};
    tk_status st = tk_write_file_atomic(path, parts, sizes, 2, err);
    free(s);
    return st;
}

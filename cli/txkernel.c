/* txkernel — the Jupyter kernel executable: `txkernel -f connection_file`.
 * Wires the magics interpreter to the ZeroMQ transport and serves until a
 * shutdown_request or SIGTERM. Exit status: 0 after a clean shutdown, 2 for a
 * usage error, 1 when the sockets could not be set up. */
#include "tk_kernel.h"
#include "tk_magics.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f, "usage: txkernel -f CONNECTION_FILE\n"
               "  Jupyter starts this through the kernelspec (jupyter kernelspec list shows txkernel).\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *conn = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") && i + 1 < argc) conn = argv[++i];
        else if (!strncmp(argv[i], "--f=", 4)) conn = argv[i] + 4;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout), 0;
        else if (!strcmp(argv[i], "--version")) { printf("txkernel %s\n", TK_KERNEL_VERSION); return 0; }
        else return usage(stderr);
    }
    if (!conn) return usage(stderr);
    /* as in txk: a file-size limit is a save error naming the file, not a kill */
    signal(SIGXFSZ, SIG_IGN);
    tk_magics *m = tk_magics_new();
    if (!m) { fprintf(stderr, "txkernel: out of memory at start\n"); return 1; }
    tk_interp it = tk_magics_interp(m);
    tk_kerr err = {{0}};
    int rc = tk_kernel_serve(conn, &it, &err);
    if (rc) fprintf(stderr, "txkernel: %s\n", err.msg);
    tk_magics_destroy(&m);
    return rc ? 1 : 0;
}

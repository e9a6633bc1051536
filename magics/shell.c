/* shell.c — the shell habits of a Colab notebook inside txkernel: `!CMD` (the
 * cell grammar turns it into %system CMD), %system, %%bash, %%sh, %cd, %pwd,
 * %env.
 *
 * Guarantees: a command runs in its own process group under /bin/sh (or
 * /bin/bash for %%bash) with stdin from /dev/null, so it can never wait on a
 * terminal the kernel does not have; its stdout and stderr reach the notebook
 * as stream messages while it runs, as valid UTF-8 (a multi-byte character
 * split across reads is held back until complete; an invalid byte becomes
 * U+FFFD). A non-zero exit status or a fatal signal ends the cell with one
 * error that names it. An interrupt sends SIGINT to the child's process group,
 * then SIGTERM after 0.3 s and SIGKILL after 0.6 s, so the cell ends within a
 * second even for a child that ignores SIGINT. %cd changes the kernel
 * process's working directory, which relative paths in configs follow.
 * Nothing here exits the kernel.
 */
#define _GNU_SOURCE /* pipe2, environ, strsignal */
#include "tk_magics.h"
#include "tk_host_mem.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define POLL_MS 20
#define TERM_AFTER_S 0.3
#define KILL_AFTER_S 0.6

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Bytes of the UTF-8 sequence that lead byte b starts (0: not a lead byte). */
static int utf8_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

static int utf8_seq_ok(const unsigned char *s, int n) {
    for (int i = 1; i < n; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && s[0] == 0xE0 && s[1] < 0xA0) return 0;   /* overlong */
    if (n == 3 && s[0] == 0xED && s[1] >= 0xA0) return 0;  /* surrogate */
    if (n == 4 && s[0] == 0xF0 && s[1] < 0x90) return 0;   /* overlong */
    if (n == 4 && s[0] == 0xF4 && s[1] >= 0x90) return 0;  /* > U+10FFFF */
    return 1;
}

/* One output stream of the child: bytes read but not yet sent because they
 * end in an incomplete UTF-8 sequence. */
typedef struct pending {
    const char *name;          /* "stdout" | "stderr" */
    int fd;                    /* -1 once at EOF */
    unsigned char buf[65536 + 4];
    size_t n;
} pending;

/* Sends buf[0..n) as text, keeping an incomplete trailing sequence unless
 * flush_all (EOF), where it becomes U+FFFD like any other invalid byte. */
static void emit(tk_magic_ctx *c, pending *p, int flush_all) {
    char *txt = tk_malloc(p->n * 3 + 1);
    if (!txt) { p->n = 0; return; }
    size_t i = 0, o = 0;
    while (i < p->n) {
        int len = utf8_len(p->buf[i]);
        if (len && i + (size_t)len > p->n && !flush_all) {
            int prefix_ok = 1;  /* keep it only if what we have could still complete */
            for (size_t k = i + 1; k < p->n; k++) if ((p->buf[k] & 0xC0) != 0x80) prefix_ok = 0;
            if (prefix_ok) break;
        }
        if (len && i + (size_t)len <= p->n && p->buf[i] != 0 && utf8_seq_ok(p->buf + i, len)) {
            memcpy(txt + o, p->buf + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(txt + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    txt[o] = 0;
    if (o) c->out->ops->stream(c->out, p->name, txt);
    free(txt);
    memmove(p->buf, p->buf + i, p->n - i);
    p->n -= i;
}

/* Reads what is available; returns 0, or -1 at EOF or on a read error. */
static int drain(tk_magic_ctx *c, pending *p) {
    ssize_t r = read(p->fd, p->buf + p->n, sizeof p->buf - 4 - p->n);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    if (r <= 0) {
        emit(c, p, 1);
        close(p->fd);
        p->fd = -1;
        return -1;
    }
    p->n += (size_t)r;
    emit(c, p, 0);
    return 0;
}

/* Runs argv (argv[0] an absolute path) and streams its output. what names the
 * command in messages ("!ls -l", "%%bash cell"). Returns 0 on exit status 0,
 * else -1 after reporting the error. */
static int run_child(tk_magic_ctx *c, char *const argv[], const char *what) {
    int outp[2] = {-1, -1}, errp[2] = {-1, -1};
    if (pipe2(outp, O_CLOEXEC) || pipe2(errp, O_CLOEXEC)) {
        int e = errno;
        for (int i = 0; i < 2; i++) { if (outp[i] >= 0) close(outp[i]); if (errp[i] >= 0) close(errp[i]); }
        return tk_magic_error(c, "OSError", "%s: cannot create pipes: %s", what, strerror(e));
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
    posix_spawnattr_init(&at);
    /* its own process group, so the kernel's interrupt reaches it only through
     * us, and every process it starts gets the signal we forward */
    posix_spawnattr_setpgroup(&at, 0);
    sigset_t none, dflt;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    sigemptyset(&dflt);
    int sigs[] = {SIGINT, SIGTERM, SIGQUIT, SIGPIPE, SIGCHLD, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaddset(&dflt, sigs[i]);
    posix_spawnattr_setsigdefault(&at, &dflt);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int se = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(outp[1]);
    close(errp[1]);
    if (se) {
        close(outp[0]);
        close(errp[0]);
        return tk_magic_error(c, "OSError", "%s: cannot start %s: %s", what, argv[0], strerror(se));
    }
    pending *ps = tk_calloc(2, sizeof *ps);
    if (!ps) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(outp[0]);
        close(errp[0]);
        return tk_magic_error(c, "MemoryError", "%s: out of memory reading its output", what);
    }
    ps[0].name = "stdout"; ps[0].fd = outp[0];
    ps[1].name = "stderr"; ps[1].fd = errp[0];

    int status = 0, exited = 0, stage = 0, rounds_after_exit = 0;
    double cancelled_at = 0;
    while (!exited || ps[0].fd >= 0 || ps[1].fd >= 0) {
        struct pollfd pf[2];
        int np = 0, idx[2];
        for (int i = 0; i < 2; i++)
            if (ps[i].fd >= 0) { pf[np].fd = ps[i].fd; pf[np].events = POLLIN; pf[np].revents = 0; idx[np++] = i; }
        /* once the shell has exited, take what is already there and stop: a
         * background job (`!sleep 99 &`) may hold the pipes open for ever */
        int n = np ? poll(pf, (nfds_t)np, exited ? 0 : POLL_MS) : 0;
        for (int k = 0; k < n && k < np; k++)
            if (pf[k].revents) drain(c, &ps[idx[k]]);
        if (exited && (n <= 0 || ++rounds_after_exit > 64)) break;
        if (!exited) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid || (w < 0 && errno == ECHILD)) exited = 1;
        }
        if (!exited && c->cancel && atomic_load(c->cancel)) {
            double t = now_s();
            if (stage == 0) { kill(-pid, SIGINT); cancelled_at = t; stage = 1; }
            else if (stage == 1 && t - cancelled_at >= TERM_AFTER_S) { kill(-pid, SIGTERM); stage = 2; }
            else if (stage == 2 && t - cancelled_at >= KILL_AFTER_S) { kill(-pid, SIGKILL); stage = 3; }
        }
        if (!np && !exited) {
            struct timespec d = {0, POLL_MS * 1000 * 1000};
            nanosleep(&d, NULL);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (ps[i].fd >= 0) close(ps[i].fd);
        if (ps[i].n) emit(c, &ps[i], 1);
    }
    free(ps);
    if (stage) return tk_magic_interrupted(c);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        return tk_magic_error(c, "CalledProcessError", "%s exited with status %d", what, WEXITSTATUS(status));
    if (WIFSIGNALED(status))
        return tk_magic_error(c, "CalledProcessError", "%s was killed by signal %d (%s)", what, WTERMSIG(status),
                              strsignal(WTERMSIG(status)));
    return 0;
}

static int run_system(tk_magic_ctx *c) {
    if (!*c->args) return tk_magic_error(c, "UsageError", "!CMD (or %%system CMD) needs a command, e.g. !ls -l");
    char *what = NULL;
    if (asprintf(&what, "!%.200s%s", c->args, strlen(c->args) > 200 ? "..." : "") < 0)
        return tk_magic_error(c, "MemoryError", "out of memory starting !%s", c->args);
    char *argv[] = {"/bin/sh", "-c", (char *)c->args, NULL};
    int rc = run_child(c, argv, what);
    free(what);
    return rc;
}

static int run_script(tk_magic_ctx *c, const char *shell) {
    if (*c->args)
        return tk_magic_error(c, "UsageError", "%%%%%s takes no arguments (got \"%s\"); the script is the cell body",
                              c->name, c->args);
    char what[64];
    snprintf(what, sizeof what, "%%%%%s cell", c->name);
    /* "-c BODY NAME": NAME becomes $0, so messages from the shell say which cell */
    char *argv[] = {(char *)shell, "-c", (char *)c->body, what, NULL};
    return run_child(c, argv, what);
}

static int run_bash(tk_magic_ctx *c) { return run_script(c, "/bin/bash"); }
static int run_sh(tk_magic_ctx *c) { return run_script(c, "/bin/sh"); }

/* The argument with one pair of surrounding quotes removed (new string). */
static char *unquote(const char *a) {
    size_t n = strlen(a);
    if (n >= 2 && (a[0] == '"' || a[0] == '\'') && a[n - 1] == a[0]) return tk_strndup(a + 1, n - 2);
    return tk_strdup(a);
}

static int run_cd(tk_magic_ctx *c) {
    char *arg = unquote(c->args);
    if (!arg) return tk_magic_error(c, "MemoryError", "out of memory in %%cd");
    const char *home = getenv("HOME");
    char *target = NULL;
    int rc = 0;
    if (!*arg) target = tk_strdup(home && *home ? home : "/");
    else if (!strcmp(arg, "-")) {
        const char *old = getenv("OLDPWD");
        if (!old) { free(arg); return tk_magic_error(c, "UsageError", "%%cd -: no previous directory yet"); }
        target = tk_strdup(old);
    } else if (arg[0] == '~' && (arg[1] == 0 || arg[1] == '/') && home) {
        if (asprintf(&target, "%s%s", home, arg + 1) < 0) target = NULL;
    } else target = tk_strdup(arg);
    char before[PATH_MAX];
    if (!getcwd(before, sizeof before)) before[0] = 0;
    if (!target) rc = tk_magic_error(c, "MemoryError", "out of memory in %%cd");
    else if (chdir(target) != 0)
        rc = tk_magic_error(c, errno == ENOENT ? "FileNotFoundError" : "OSError", "%%cd %s: %s", target, strerror(errno));
    else {
        char now[PATH_MAX];
        if (!getcwd(now, sizeof now)) snprintf(now, sizeof now, "%s", target);
        /* PWD/OLDPWD as a shell keeps them, so !pwd, $OLDPWD and %cd - agree */
        if (before[0]) setenv("OLDPWD", before, 1);
        setenv("PWD", now, 1);
        tk_magic_printf(c, "stdout", "%s\n", now);
    }
    free(target);
    free(arg);
    return rc;
}

static int run_pwd(tk_magic_ctx *c) {
    char now[PATH_MAX];
    if (!getcwd(now, sizeof now)) return tk_magic_error(c, "OSError", "%%pwd: %s", strerror(errno));
    json_t *data = json_pack("{s:s}", "text/plain", now);
    c->out->ops->result(c->out, data, NULL);
    json_decref(data);
    return 0;
}

static int env_name_ok(const char *s, size_t n) {
    if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
    for (size_t i = 1; i < n; i++) if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_env(tk_magic_ctx *c) {
    const char *a = c->args;
    if (!*a) {
        size_t n = 0;
        while (environ[n]) n++;
        char **v = tk_malloc((n ? n : 1) * sizeof *v);
        if (!v) return tk_magic_error(c, "MemoryError", "out of memory listing the environment");
        memcpy(v, environ, n * sizeof *v);
        qsort(v, n, sizeof *v, cmp_str);
        for (size_t i = 0; i < n; i++) tk_magic_printf(c, "stdout", "%s\n", v[i]);
        free(v);
        return 0;
    }
    size_t nl = strcspn(a, "= \t");
    if (!env_name_ok(a, nl))
        return tk_magic_error(c, "UsageError", "%%env: \"%.*s\" is not a variable name (letters, digits, _)", (int)nl, a);
    char name[256];
    if (nl >= sizeof name) return tk_magic_error(c, "UsageError", "%%env: the name is longer than 255 characters");
    memcpy(name, a, nl);
    name[nl] = 0;
    const char *rest = a + nl;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (!*rest) {
        const char *v = getenv(name);
        if (!v) return tk_magic_error(c, "UsageError", "%%env: %s is not set", name);
        tk_magic_printf(c, "stdout", "%s\n", v);
        return 0;
    }
    if (*rest == '=') rest++;
    char *val = unquote(rest);
    if (!val) return tk_magic_error(c, "MemoryError", "out of memory in %%env");
    int rc = 0;
    /* setenv while other threads run is safe here: the kernel's control and
     * heartbeat threads never read the environment */
    if (setenv(name, val, 1) != 0) rc = tk_magic_error(c, "OSError", "%%env %s: %s", name, strerror(errno));
    else tk_magic_printf(c, "stdout", "env: %s=%s\n", name, val);
    free(val);
    return rc;
}

static const tk_magic_def SHELL[] = {
    {"system", TK_MAGIC_LINE, run_system, "run a shell command, streaming its output (also written !CMD)",
     "!CMD   or   %system CMD\n\nRuns CMD with /bin/sh -c in the kernel's working directory (%pwd), stdin from\n"
     "/dev/null, stdout and stderr shown as they come. A non-zero exit status ends the\n"
     "cell with an error naming it. An interrupt signals the command's process group\n"
     "(SIGINT, then SIGTERM and SIGKILL if it does not stop). Each !line of a cell runs\n"
     "on its own, in order."},
    {"bash", TK_MAGIC_CELL, run_bash, "run the cell body as a bash script",
     "%%bash\n\nRuns the cell body with /bin/bash -c, streaming its output; exit status and\n"
     "interrupts as for !CMD."},
    {"sh", TK_MAGIC_CELL, run_sh, "run the cell body as a /bin/sh script",
     "%%sh\n\nRuns the cell body with /bin/sh -c, streaming its output; exit status and\n"
     "interrupts as for !CMD."},
    {"cd", TK_MAGIC_LINE, run_cd, "change the kernel's working directory",
     "%cd [DIR | - | ~]\n\nChanges the working directory of the kernel process (no DIR: $HOME; -: the\n"
     "previous one) and prints the new one. Relative paths in configs (train_file,\n"
     "vocab, output_dir) and !commands follow it."},
    {"pwd", TK_MAGIC_LINE, run_pwd, "the kernel's working directory",
     "%pwd\n\nReturns the kernel process's working directory as the cell's result."},
    {"env", TK_MAGIC_LINE, run_env, "list, get or set environment variables",
     "%env [NAME[=VALUE]]\n\nNo argument: every variable, NAME=VALUE, sorted. NAME: its value. NAME=VALUE\n"
     "(or NAME VALUE): sets it for the kernel and every command it starts afterwards."},
};

int tk_magics_register_shell(tk_magics *m);
int tk_magics_register_shell(tk_magics *m) { return tk_magics_add_table(m, SHELL, sizeof SHELL / sizeof *SHELL); }

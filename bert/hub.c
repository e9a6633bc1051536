/* hub.c — model resolution: a path, the HF cache, or a download from the hub
 * with libcurl (tk_hub.h says what it guarantees).
 *
 * The protocol is the one huggingface_hub speaks: HEAD on
 * {endpoint}/{repo}/resolve/{revision}/{file} without following redirects
 * gives X-Repo-Commit (the commit the revision points at), the file's etag
 * (X-Linked-Etag, the sha256 of an LFS file, else ETag, the git blob id) and
 * size (X-Linked-Size, else Content-Length); an LFS file answers with a
 * redirect to where its bytes are, which the GET then asks. Relative
 * redirects (a renamed repo) are followed for the HEAD itself. Which files
 * the repo has comes from its model info (GET /api/models/{repo}/revision/
 * {commit}, "siblings"), so only files it has are asked for; a hub that
 * does not answer that is asked file by file, a 404 meaning "not there".
 */
#define _GNU_SOURCE /* strcasestr */
#include "tk_hub.h"
#include "tk_files.h"
#include "tk_host_mem.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATHN 1536 /* any path we compose; longer ones are cut, and then not found */

/* snprintf for paths and URLs: a cut one names nothing that exists, so it
 * fails at the first open or request, which names it. */
static void pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

static const struct { const char *name, *id; } ALIASES[] = {
    {"bert-tiny", "prajjwal1/bert-tiny"},
    {"bert-mini", "prajjwal1/bert-mini"},
    {"bert-small", "prajjwal1/bert-small"},
    {"bert-medium", "prajjwal1/bert-medium"},
    {"bert-base-cased", "google-bert/bert-base-cased"},
    {"bert-base-uncased", "google-bert/bert-base-uncased"},
    {"bert-base", "google-bert/bert-base-uncased"},
    {"bert-large-cased", "google-bert/bert-large-cased"},
    {"bert-large-uncased", "google-bert/bert-large-uncased"},
    {"bert-large", "google-bert/bert-large-uncased"},
};

const char *tk_hub_alias(const char *name) {
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcasecmp(name, ALIASES[i].name)) return ALIASES[i].id;
    return NULL;
}

/* ---- environment ------------------------------------------------------------ */

static const char *env(const char *k) {
    const char *v = getenv(k);
    return v && *v ? v : NULL;
}

static int env_true(const char *k) {
    const char *v = env(k);
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

static void hf_home(char *out, size_t n) {
    if (env("HF_HOME")) pathf(out, n, "%s", env("HF_HOME"));
    else if (env("XDG_CACHE_HOME")) pathf(out, n, "%s/huggingface", env("XDG_CACHE_HOME"));
    else pathf(out, n, "%s/.cache/huggingface", env("HOME") ? env("HOME") : "/root");
}

void tk_hub_cache_dir(char *out, size_t n) {
    char home[PATHN];
    if (env("HF_HUB_CACHE")) pathf(out, n, "%s", env("HF_HUB_CACHE"));
    else if (env("HUGGINGFACE_HUB_CACHE")) pathf(out, n, "%s", env("HUGGINGFACE_HUB_CACHE"));
    else {
        hf_home(home, sizeof home);
        pathf(out, n, "%s/hub", home);
    }
}

/* HF_TOKEN, else the file `huggingface-cli login` writes. "" when none. */
static void token(char *out, size_t n) {
    out[0] = 0;
    if (env("HF_TOKEN")) {
        pathf(out, n, "%s", env("HF_TOKEN"));
    } else {
        char path[PATHN], home[PATHN - 64];
        if (env("HF_TOKEN_PATH")) pathf(path, sizeof path, "%s", env("HF_TOKEN_PATH"));
        else {
            hf_home(home, sizeof home);
            pathf(path, sizeof path, "%s/token", home);
        }
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(out, (int)n, f)) out[0] = 0;
            fclose(f);
        }
    }
    size_t l = strlen(out);
    while (l && isspace((unsigned char)out[l - 1])) out[--l] = 0;
}

/* ---- files ---------------------------------------------------------------- */

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int64_t file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++) if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

/* "org/name" with the characters the hub allows. */
int tk_hub_is_repo_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/') || strlen(s) > 200) return 0;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.' || *p == '/')) return 0;
    return 1;
}

static tk_status sha256_file(const char *path, char hex[65], tk_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tk_err_set(err, TK_EIO, "%s: cannot read: %s", path, strerror(errno));
        return TK_EIO;
    }
    unsigned char *buf = tk_malloc(1 << 20);
    if (!buf) {
        fclose(f);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory to hash it", path);
        return TK_ENOMEM;
    }
    crypto_hash_sha256_state s;
    crypto_hash_sha256_init(&s);
    size_t k;
    while ((k = fread(buf, 1, 1 << 20, f)) > 0) crypto_hash_sha256_update(&s, buf, k);
    free(buf);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        tk_err_set(err, TK_EIO, "%s: read error", path);
        return TK_EIO;
    }
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&s, h);
    sodium_bin2hex(hex, 65, h, sizeof h);
    return TK_OK;
}

/* ---- the repo in the cache -------------------------------------------------- */

typedef struct hub {
    const char *repo, *revision;
    const tk_hub_opts *o;
    tk_hub_info *info;
    char endpoint[512], token[512];
    char cache[PATHN], dir[PATHN + 512]; /* the cache, and models--ORG--NAME in it */
    char commit[64];
    json_t *siblings; /* the repo's file list at commit (the hub's model info); NULL = not known */
} hub;

/* 1: the listing names file; 0: it does not; -1: no listing to ask. */
static int listed(const hub *h, const char *file) {
    if (!h->siblings) return -1;
    size_t i;
    json_t *v;
    json_array_foreach(h->siblings, i, v) {
        const char *name = json_string_value(json_object_get(v, "rfilename"));
        if (name && !strcmp(name, file)) return 1;
    }
    return 0;
}

static void read_ref(const hub *h, char *commit, size_t n) {
    char p[PATHN + 256];
    commit[0] = 0;
    pathf(p, sizeof p, "%s/refs/%s", h->dir, h->revision);
    FILE *f = fopen(p, "r");
    if (!f) return;
    if (!fgets(commit, (int)n, f)) commit[0] = 0;
    fclose(f);
    commit[strcspn(commit, " \r\n")] = 0;
    if (!is_hex(commit, 40)) commit[0] = 0;
}

static void snap_path(const hub *h, const char *file, char *out, size_t n) {
    pathf(out, n, "%s/snapshots/%s/%s", h->dir, h->commit, file);
}

static int in_snapshot(const hub *h, const char *file) {
    char p[PATHN + 512];
    snap_path(h, file, p, sizeof p);
    return exists(p);
}

/* An LFS blob is named by its sha256: check the bytes against the name. */
static tk_status verify_blob(const hub *h, const char *file, tk_err *err) {
    char p[PATHN + 512], target[PATHN + 512];
    snap_path(h, file, p, sizeof p);
    char *real = realpath(p, NULL);
    if (!real) return TK_OK;
    pathf(target, sizeof target, "%s", real);
    free(real);
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if (!is_hex(base, 64)) return TK_OK;
    char hex[65];
    tk_status st = sha256_file(target, hex, err);
    if (st != TK_OK) return st;
    if (strcasecmp(hex, base)) {
        tk_err_set(err, TK_EFORMAT,
                   "%s: corrupted in the HF cache: its sha256 is %s but the hub's is %s (%s of %s); delete %s "
                   "and run again to download it afresh",
                   target, hex, base, file, h->repo, target);
        return TK_EFORMAT;
    }
    return TK_OK;
}

/* The weights of the snapshot: "model.safetensors", the index with every
 * shard, or "pytorch_model.bin"; NULL when none is complete. */
static const char *cached_weights(const hub *h) {
    if (in_snapshot(h, "model.safetensors")) return "model.safetensors";
    if (in_snapshot(h, "model.safetensors.index.json")) {
        char p[PATHN + 512];
        snap_path(h, "model.safetensors.index.json", p, sizeof p);
        json_t *root = json_load_file(p, 0, NULL);
        json_t *map = root ? json_object_get(root, "weight_map") : NULL;
        int ok = json_is_object(map) && json_object_size(map) > 0;
        const char *k;
        json_t *v;
        json_object_foreach(map, k, v) if (!json_is_string(v) || !in_snapshot(h, json_string_value(v))) ok = 0;
        json_decref(root);
        if (ok) return "model.safetensors.index.json";
    }
    if (in_snapshot(h, "pytorch_model.bin")) return "pytorch_model.bin";
    return NULL;
}

/* The tokenizer is vocab.txt or tokenizer.json (transformers 5 saves only
 * the latter); the others are read when the repo has them. */
static const char *const TOKENIZER_FILES[] = {"vocab.txt", "tokenizer.json", NULL};
static const char *const OPTIONAL[] = {"tokenizer_config.json", "special_tokens_map.json", NULL};

/* The first file the snapshot lacks among those a run needs; NULL when whole. */
static const char *snapshot_missing(const hub *h, int weights) {
    if (!h->commit[0]) return "refs/";
    if (!in_snapshot(h, "config.json")) return "config.json";
    if (!in_snapshot(h, "vocab.txt") && !in_snapshot(h, "tokenizer.json")) return "vocab.txt (or tokenizer.json)";
    if (weights && !cached_weights(h)) return "model.safetensors";
    return NULL;
}

/* ---- HTTP --------------------------------------------------------------------- */

typedef struct head_info {
    long code;
    char commit[64], etag[160], location[2048], error_code[64], error_msg[256];
    int64_t size, linked_size;
} head_info;

static void header_value(const char *line, size_t len, const char *name, char *out, size_t n) {
    size_t k = strlen(name);
    if (len <= k + 1 || strncasecmp(line, name, k) || line[k] != ':') return;
    const char *v = line + k + 1;
    size_t vl = len - k - 1;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    if (vl >= n) vl = n - 1;
    memcpy(out, v, vl);
    out[vl] = 0;
}

static size_t on_header(char *buf, size_t sz, size_t nitems, void *ud) {
    head_info *hi = ud;
    size_t len = sz * nitems;
    char num[32] = "";
    if (len > 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response: forget the last one's headers */
        long code = hi->code;
        memset(hi, 0, sizeof *hi);
        hi->code = code;
        hi->size = hi->linked_size = -1;
    }
    header_value(buf, len, "X-Repo-Commit", hi->commit, sizeof hi->commit);
    header_value(buf, len, "X-Linked-Etag", hi->etag, sizeof hi->etag);
    if (!hi->etag[0] || strncasecmp(buf, "X-Linked-Etag", 13)) {
        char e[160] = "";
        header_value(buf, len, "ETag", e, sizeof e);
        if (e[0] && !hi->etag[0]) pathf(hi->etag, sizeof hi->etag, "%s", e);
    }
    header_value(buf, len, "Location", hi->location, sizeof hi->location);
    header_value(buf, len, "X-Error-Code", hi->error_code, sizeof hi->error_code);
    header_value(buf, len, "X-Error-Message", hi->error_msg, sizeof hi->error_msg);
    header_value(buf, len, "X-Linked-Size", num, sizeof num);
    if (num[0]) hi->linked_size = strtoll(num, NULL, 10);
    num[0] = 0;
    header_value(buf, len, "Content-Length", num, sizeof num);
    if (num[0]) hi->size = strtoll(num, NULL, 10);
    return len;
}

/* The linked etag wins over ETag, as huggingface_hub reads them. */
static void normalise_etag(char *e) {
    char *s = e;
    if (!strncmp(s, "W/", 2)) s += 2;
    if (*s == '"') s++;
    size_t l = strlen(s);
    if (l && s[l - 1] == '"') l--;
    memmove(e, s, l);
    e[l] = 0;
}

static struct curl_slist *auth_headers(const hub *h, int with_token) {
    struct curl_slist *l = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (with_token && h->token[0]) {
        char a[600];
        pathf(a, sizeof a, "Authorization: Bearer %s", h->token);
        l = curl_slist_append(l, a);
    }
    return l;
}

static void common_opts(CURL *c) {
    curl_easy_setopt(c, CURLOPT_USERAGENT, "txkernel/0.1 (libcurl)");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    /* a stalled transfer is an error after 30 s below 1 byte/s */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

static tk_status net_error(const hub *h, CURLcode rc, const char *url, const char *detail, tk_err *err) {
    tk_err_set(err, TK_EIO,
               "cannot reach the hub at %s for %s (%s%s%s): no network? Set HF_HUB_OFFLINE=1 to use only the HF "
               "cache (%s), set HF_ENDPOINT to a mirror, or set model: to a local folder",
               h->endpoint, url, curl_easy_strerror(rc), detail && *detail ? ": " : "", detail ? detail : "",
               h->cache);
    return TK_EIO;
}

static tk_status http_error(const hub *h, const char *file, const char *rev, const head_info *hi, tk_err *err) {
    const char *ec = hi->error_code;
    if (hi->code == 401 || hi->code == 403 || !strcmp(ec, "GatedRepo")) {
        tk_err_set(err, TK_EIO,
                   "%s: HTTP %ld: %s is gated or private%s; set HF_TOKEN to a token that has access (or log in with "
                   "huggingface-cli, which writes %s/token)%s%s",
                   h->endpoint, hi->code, h->repo, h->token[0] ? " and the token in use has no access" : "",
                   env("HF_HOME") ? env("HF_HOME") : "~/.cache/huggingface", hi->error_msg[0] ? ": " : "",
                   hi->error_msg);
    } else if (hi->code == 404) {
        const char *what = !strcmp(ec, "RepoNotFound")       ? "the repo does not exist (or is private: set HF_TOKEN)"
                         : !strcmp(ec, "RevisionNotFound")   ? "the revision does not exist"
                         : !strcmp(ec, "EntryNotFound")      ? "the repo has no such file at this revision"
                                                             : "not found";
        tk_err_set(err, TK_EIO, "%s: HTTP 404 for repo %s, revision %s, file %s: %s", h->endpoint, h->repo, rev, file,
                   what);
    } else {
        tk_err_set(err, TK_EIO, "%s: HTTP %ld for repo %s, revision %s, file %s%s%s", h->endpoint, hi->code, h->repo,
                   rev, file, hi->error_msg[0] ? ": " : "", hi->error_msg);
    }
    return TK_EIO;
}

/* HEAD, following relative redirects only (a renamed repo), as
 * huggingface_hub does; an absolute one (an LFS file's bytes) is returned. */
static tk_status http_head(const hub *h, const char *url0, head_info *hi, tk_err *err) {
    char url[4096];
    pathf(url, sizeof url, "%s", url0);
    for (int hop = 0; hop < 5; hop++) {
        CURL *c = curl_easy_init();
        if (!c) {
            tk_err_set(err, TK_EIO, "libcurl: cannot start a transfer");
            return TK_EIO;
        }
        memset(hi, 0, sizeof *hi);
        hi->size = hi->linked_size = -1;
        char ebuf[CURL_ERROR_SIZE] = "";
        struct curl_slist *hd = auth_headers(h, 1);
        common_opts(c);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, hi);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
        CURLcode rc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &hi->code);
        curl_easy_cleanup(c);
        curl_slist_free_all(hd);
        if (rc != CURLE_OK) return net_error(h, rc, url, ebuf, err);
        if (hi->code >= 300 && hi->code < 400 && hi->location[0] == '/') {
            char next[4096];
            pathf(next, sizeof next, "%s%s", h->endpoint, hi->location);
            pathf(url, sizeof url, "%s", next);
            continue;
        }
        return TK_OK;
    }
    tk_err_set(err, TK_EIO, "%s: too many redirects", url0);
    return TK_EIO;
}

typedef struct get_ctx {
    FILE *f;
    int64_t base, total;
    const char *file;
    const tk_hub_opts *o;
    int write_errno, cancelled;
    long code;
} get_ctx;

static size_t on_body(char *buf, size_t sz, size_t n, void *ud) {
    get_ctx *g = ud;
    size_t len = sz * n;
    if (fwrite(buf, 1, len, g->f) != len) {
        g->write_errno = errno ? errno : EIO;
        return 0;
    }
    return len;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ut, curl_off_t un) {
    (void)ut;
    (void)un;
    get_ctx *g = ud;
    if (!g->o || !g->o->progress) return 0;
    int64_t total = g->total > 0 ? g->total : dltotal > 0 ? g->base + (int64_t)dltotal : 0;
    if (g->o->progress(g->o->ud, g->file, g->base + (int64_t)dlnow, total)) {
        g->cancelled = 1;
        return 1;
    }
    return 0;
}

/* Bytes of `url` appended to `part` from its current length (a Range
 * request; a server that ignores it sends everything and the part starts
 * over). */
static tk_status http_get(const hub *h, const char *url, int with_token, const char *part, const char *file,
                          int64_t total, tk_err *err) {
    int64_t have = file_size(part);
    if (have < 0) have = 0;
    if (total > 0 && have > total) have = 0; /* not this file's beginning: start over */
    FILE *f = fopen(part, have ? "ab" : "wb");
    if (!f) {
        tk_err_set(err, TK_EIO, "%s: cannot write: %s", part, strerror(errno));
        return TK_EIO;
    }
    get_ctx g = {.f = f, .base = have, .total = total, .file = file, .o = h->o};
    CURL *c = curl_easy_init();
    if (!c) {
        fclose(f);
        tk_err_set(err, TK_EIO, "libcurl: cannot start a transfer");
        return TK_EIO;
    }
    char ebuf[CURL_ERROR_SIZE] = "", range[64];
    struct curl_slist *hd = auth_headers(h, with_token);
    if (have > 0) {
        pathf(range, sizeof range, "Range: bytes=%lld-", (long long)have);
        hd = curl_slist_append(hd, range);
    }
    common_opts(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &g);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &g);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(hd);
    int close_bad = fclose(f) != 0;
    if (g.cancelled) {
        tk_err_set(err, TK_ECANCEL, "%s: download of %s interrupted; %s keeps what came, the next run resumes", h->repo,
                   file, part);
        return TK_ECANCEL;
    }
    if (g.write_errno || close_bad) {
        int e = g.write_errno ? g.write_errno : errno;
        tk_err_set(err, TK_EIO, "%s: cannot write %s: %s%s", part, file, strerror(e),
                   e == ENOSPC ? " (the disk is full: free space there, or set HF_HUB_CACHE to a disk with room)" : "");
        return TK_EIO;
    }
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
        head_info hi = {.code = code};
        return http_error(h, file, h->commit, &hi, err);
    }
    if (rc != CURLE_OK) {
        if (rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_OPERATION_TIMEDOUT ||
            rc == CURLE_GOT_NOTHING) {
            tk_err_set(err, TK_EIO,
                       "%s: download of %s broke off after %lld of %lld bytes (%s); %s keeps them and the next run "
                       "resumes from there",
                       h->repo, file, (long long)file_size(part), (long long)total, ebuf[0] ? ebuf : curl_easy_strerror(rc),
                       part);
            return TK_EIO;
        }
        return net_error(h, rc, url, ebuf, err);
    }
    if (have > 0 && code == 200) {
        /* a 200 to a Range request is the whole file after our partial one:
         * keep only what this answer sent */
        int64_t now = file_size(part);
        if (now >= have && total > 0 && now - have == total) {
            FILE *in = fopen(part, "rb");
            char tmp[PATHN + 600];
            pathf(tmp, sizeof tmp, "%s.whole", part);
            FILE *out = in ? fopen(tmp, "wb") : NULL;
            int ok = in && out && fseeko(in, have, SEEK_SET) == 0;
            char buf[1 << 16];
            size_t k;
            while (ok && (k = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, k, out) == k;
            if (in) fclose(in);
            if (out && fclose(out)) ok = 0;
            if (!ok || rename(tmp, part)) {
                unlink(tmp);
                tk_err_set(err, TK_EIO, "%s: cannot rewrite %s: %s", part, file, strerror(errno));
                return TK_EIO;
            }
        }
    }
    return TK_OK;
}

/* ---- one file ------------------------------------------------------------------ */

static void url_of(const hub *h, const char *rev, const char *file, char *out, size_t n) {
    char *r = curl_easy_escape(NULL, rev, 0);
    pathf(out, n, "%s/%s/resolve/%s/%s", h->endpoint, h->repo, r ? r : rev, file);
    curl_free(r);
}

/* ../../blobs/<etag> seen from snapshots/<commit>/<file> (file may hold '/'). */
static tk_status link_snapshot(const hub *h, const char *file, const char *etag, tk_err *err) {
    char p[PATHN + 512], target[PATHN];
    snap_path(h, file, p, sizeof p);
    char *slash = strrchr(p, '/');
    *slash = 0;
    if (tk_mkdirs(p, err) != TK_OK) return TK_EIO;
    *slash = '/';
    int depth = 2;
    for (const char *s = file; *s; s++) depth += *s == '/';
    target[0] = 0;
    for (int i = 0; i < depth; i++) strcat(target, "../");
    strncat(target, "blobs/", sizeof target - strlen(target) - 1);
    strncat(target, etag, sizeof target - strlen(target) - 1);
    unlink(p);
    if (symlink(target, p)) {
        tk_err_set(err, TK_EIO, "%s: cannot link to %s: %s", p, target, strerror(errno));
        return TK_EIO;
    }
    return TK_OK;
}

/* huggingface_hub remembers a file a commit lacks in .no_exist/<commit>/<file>. */
static void mark_missing(const hub *h, const char *file) {
    char p[PATHN + 512];
    pathf(p, sizeof p, "%s/.no_exist/%s", h->dir, h->commit);
    tk_err ignore = {0};
    if (tk_mkdirs(p, &ignore) != TK_OK) return;
    pathf(p, sizeof p, "%s/.no_exist/%s/%s", h->dir, h->commit, file);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
}

static int known_missing(const hub *h, const char *file) {
    char p[PATHN + 512];
    pathf(p, sizeof p, "%s/.no_exist/%s/%s", h->dir, h->commit, file);
    return exists(p);
}

/* One writer per blob across processes: huggingface_hub takes flock on
 * <cache>/.locks/models--ORG--NAME/<etag>.lock (the filelock package), so
 * taking the same lock keeps a Python download and ours off one .incomplete
 * file. Waits, asking the progress callback whether to give up. Returns the
 * lock's fd (close releases it), or -1 with err. */
static int lock_blob(const hub *h, const char *file, const char *etag, tk_err *err) {
    char p[PATHN + 512];
    const char *repo_dir = strrchr(h->dir, '/') + 1;
    pathf(p, sizeof p, "%s/.locks/%s", h->cache, repo_dir);
    if (tk_mkdirs(p, err) != TK_OK) return -1;
    pathf(p, sizeof p, "%s/.locks/%s/%s.lock", h->cache, repo_dir, etag);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "%s: cannot open: %s", p, strerror(errno));
        return -1;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            tk_err_set(err, TK_EIO, "%s: cannot lock: %s", p, strerror(errno));
            close(fd);
            return -1;
        }
        if (h->o && h->o->progress && h->o->progress(h->o->ud, file, 0, 0)) {
            tk_err_set(err, TK_ECANCEL, "%s: cancelled while another process downloads %s (%s)", h->repo, file, p);
            close(fd);
            return -1;
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    return fd;
}

/* The bytes of one file into blobs/<etag>: the .incomplete part, resumed,
 * checked against the size and (LFS) the sha256, then renamed. */
static tk_status download_blob(hub *h, const head_info *hi, const char *file, const char *url, const char *blob,
                               tk_err *err) {
    tk_status st;
    int64_t total = hi->linked_size >= 0 ? hi->linked_size : hi->size;
    char part[PATHN + 300];
    pathf(part, sizeof part, "%s.incomplete", blob);
    char dir[PATHN + 16];
    pathf(dir, sizeof dir, "%s/blobs", h->dir);
    if (tk_mkdirs(dir, err) != TK_OK) return TK_EIO;
    /* the bytes: where an LFS redirect points (no token: it is a signed
     * URL on another host), else the resolve URL */
    int redirected = hi->code >= 300 && hi->code < 400 && hi->location[0];
    char get_url[4096];
    if (redirected && hi->location[0] == '/') pathf(get_url, sizeof get_url, "%s%s", h->endpoint, hi->location);
    else pathf(get_url, sizeof get_url, "%s", redirected ? hi->location : url);
    int same_host = !redirected || !strncmp(get_url, h->endpoint, strlen(h->endpoint));
    /* a whole part left by a run that stopped before the rename needs no request */
    if (!(total > 0 && file_size(part) == total) &&
        (st = http_get(h, get_url, same_host, part, file, total, err)) != TK_OK)
        return st;
    int64_t got = file_size(part);
    if (total >= 0 && got != total) {
        tk_err_set(err, TK_EIO, "%s: %s came with %lld bytes, the hub said %lld; %s keeps them and the next run resumes",
                   h->repo, file, (long long)got, (long long)total, part);
        return TK_EIO;
    }
    if (is_hex(hi->etag, 64)) { /* LFS: the etag is the sha256 */
        char hex[65];
        if ((st = sha256_file(part, hex, err)) != TK_OK) return st;
        if (strcasecmp(hex, hi->etag)) {
            unlink(part);
            tk_err_set(err, TK_EFORMAT,
                       "%s: %s downloaded from %s has sha256 %s, but the hub says %s: corrupted in transit; "
                       "deleted, run again",
                       h->repo, file, get_url, hex, hi->etag);
            return TK_EFORMAT;
        }
    }
    if (rename(part, blob)) {
        tk_err_set(err, TK_EIO, "%s: cannot rename to %s: %s", part, blob, strerror(errno));
        return TK_EIO;
    }
    if (h->info) {
        h->info->n_downloaded++;
        h->info->bytes_downloaded += got;
    }
    if (h->o && h->o->progress) h->o->progress(h->o->ud, file, got, got);
    return TK_OK;
}

/* Makes snapshots/<commit>/<file> exist. *found = 0 when an optional file
 * is not in the repo. */
static tk_status fetch(hub *h, const char *file, int optional, int *found, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    *found = 1;
    if (in_snapshot(h, file)) return TK_OK;
    if (optional && known_missing(h, file)) {
        *found = 0;
        return TK_OK;
    }
    if (listed(h, file) == 0) { /* the listing says it is not there: no request */
        *found = 0;
        if (optional) return TK_OK;
        head_info none = {.code = 404};
        pathf(none.error_code, sizeof none.error_code, "EntryNotFound");
        return http_error(h, file, h->commit, &none, err);
    }
    char url[4096];
    url_of(h, h->commit, file, url, sizeof url);
    head_info hi;
    tk_status st = http_head(h, url, &hi, err);
    if (st != TK_OK) return st;
    if (hi.code == 404 && optional && strcmp(hi.error_code, "RepoNotFound") && strcmp(hi.error_code, "RevisionNotFound")) {
        mark_missing(h, file);
        *found = 0;
        return TK_OK;
    }
    if (hi.code >= 400 || hi.code < 200) return http_error(h, file, h->commit, &hi, err);
    normalise_etag(hi.etag);
    if (!hi.etag[0] || strchr(hi.etag, '/') || strstr(hi.etag, "..")) {
        tk_err_set(err, TK_EFORMAT, "%s: the hub sent no usable ETag for %s (a proxy in between?)", url, file);
        return TK_EFORMAT;
    }
    char blob[PATHN + 256];
    pathf(blob, sizeof blob, "%s/blobs/%s", h->dir, hi.etag);
    int lock = exists(blob) ? -1 : lock_blob(h, file, hi.etag, err);
    if (!exists(blob) && lock < 0) return err->status;
    st = exists(blob) ? TK_OK : download_blob(h, &hi, file, url, blob, err);
    if (lock >= 0) close(lock);
    if (st != TK_OK) return st;
    return link_snapshot(h, file, hi.etag, err);
}

typedef struct mem_body {
    char *p;
    size_t n, cap;
} mem_body;

static size_t on_mem(char *buf, size_t sz, size_t n, void *ud) {
    mem_body *b = ud;
    size_t len = sz * n;
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        if (cap > (64u << 20)) return 0; /* a file list is small; this is not one */
        char *p = tk_realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, buf, len);
    b->n += len;
    b->p[b->n] = 0;
    return len;
}

/* The repo's file list at h->commit, as huggingface_hub's snapshot_download
 * asks for it: GET {endpoint}/api/models/{repo}/revision/{commit} answers
 * with the model info, whose "siblings" are [{"rfilename": ...}, ...].
 * Sets h->siblings. A hub that cannot answer it (an old mirror: 404 with no
 * error code, a 5xx, not JSON) leaves h->siblings NULL and the files are
 * asked one by one, as before; a missing repo or revision, or no access, is
 * the error it is. */
static tk_status list_files(hub *h, tk_err *err) {
    char url[4096];
    char *r = curl_easy_escape(NULL, h->commit, 0);
    pathf(url, sizeof url, "%s/api/models/%s/revision/%s", h->endpoint, h->repo, r ? r : h->commit);
    curl_free(r);
    CURL *c = curl_easy_init();
    if (!c) {
        tk_err_set(err, TK_EIO, "libcurl: cannot start a transfer");
        return TK_EIO;
    }
    head_info hi;
    memset(&hi, 0, sizeof hi);
    mem_body body = {0};
    char ebuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hd = auth_headers(h, 1);
    common_opts(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &hi);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &hi.code);
    curl_easy_cleanup(c);
    curl_slist_free_all(hd);
    tk_status st = TK_OK;
    if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR) {
        st = net_error(h, rc, url, ebuf, err);
    } else if (hi.code == 401 || hi.code == 403 || !strcmp(hi.error_code, "GatedRepo") ||
               !strcmp(hi.error_code, "RepoNotFound") || !strcmp(hi.error_code, "RevisionNotFound")) {
        st = http_error(h, "(the file list)", h->commit, &hi, err);
    } else if (hi.code == 200 && body.p) {
        json_t *root = json_loads(body.p, 0, NULL);
        json_t *sib = json_object_get(root, "siblings");
        if (json_is_array(sib)) h->siblings = json_incref(sib);
        json_decref(root);
    }
    free(body.p);
    return st;
}

static tk_status fetch_weights(hub *h, tk_err *err) {
    int found = 0;
    tk_status st = fetch(h, "model.safetensors", 1, &found, err);
    if (st != TK_OK || found) return st;
    if ((st = fetch(h, "model.safetensors.index.json", 1, &found, err)) != TK_OK) return st;
    if (found) {
        char p[PATHN + 512];
        snap_path(h, "model.safetensors.index.json", p, sizeof p);
        json_error_t je;
        json_t *root = json_load_file(p, 0, &je);
        json_t *map = root ? json_object_get(root, "weight_map") : NULL;
        if (!json_is_object(map)) {
            json_decref(root);
            tk_err_set(err, TK_EFORMAT, "%s: no \"weight_map\" object (%s)", p, root ? "" : je.text);
            return TK_EFORMAT;
        }
        const char *k;
        json_t *v;
        json_object_foreach(map, k, v) {
            const char *shard = json_string_value(v);
            if (!shard || strstr(shard, "..") || shard[0] == '/') {
                st = TK_EFORMAT;
                tk_err_set(err, st, "%s: weight_map[\"%s\"] is not a shard file name", p, k);
                break;
            }
            if ((st = fetch(h, shard, 0, &found, err)) != TK_OK) break;
        }
        json_decref(root);
        return st;
    }
    if ((st = fetch(h, "pytorch_model.bin", 1, &found, err)) != TK_OK || found) return st;
    tk_err_set(err, TK_EIO,
               "%s (revision %s) has no weights: none of model.safetensors, model.safetensors.index.json, "
               "pytorch_model.bin; set init: random to train this shape from random weights",
               h->repo, h->revision);
    return TK_EIO;
}

static tk_status write_ref(const hub *h, tk_err *err) {
    if (!strcmp(h->revision, h->commit)) return TK_OK;
    char p[PATHN + 256];
    pathf(p, sizeof p, "%s/refs/%s", h->dir, h->revision);
    char *slash = strrchr(p, '/');
    *slash = 0;
    if (tk_mkdirs(p, err) != TK_OK) return TK_EIO;
    *slash = '/';
    char tmp[PATHN + 300];
    pathf(tmp, sizeof tmp, "%s.tmp%d", p, (int)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(h->commit, f) >= 0;
    if (f && fclose(f)) ok = 0;
    if (!ok || rename(tmp, p)) {
        unlink(tmp);
        tk_err_set(err, TK_EIO, "%s: cannot write: %s", p, strerror(errno));
        return TK_EIO;
    }
    return TK_OK;
}

tk_status tk_hub_resolve(const char *model, const char *revision, const tk_hub_opts *o, char *dir, size_t n,
                         tk_hub_info *info, tk_err *err) {
    tk_hub_opts dflt = {.weights = 1};
    if (!o) o = &dflt;
    if (info) memset(info, 0, sizeof *info);
    if (exists(model)) {
        pathf(dir, n, "%s", model);
        if (info) info->local = 1;
        return TK_OK;
    }
    const char *repo = tk_hub_alias(model);
    if (!repo) repo = model;
    if (!tk_hub_is_repo_id(repo)) {
        tk_err_set(err, TK_EINVAL,
                   "model: '%s' is not a folder or file here, nor a hub id (org/name) or a preset (bert-tiny, "
                   "bert-base-cased, ...)",
                   model);
        return TK_EINVAL;
    }
    hub h = {.repo = repo, .revision = revision && *revision ? revision : "main", .o = o, .info = info};
    if (strstr(h.revision, "..")) {
        tk_err_set(err, TK_EINVAL, "revision: '%s' is not a branch, tag or commit", h.revision);
        return TK_EINVAL;
    }
    if (info) pathf(info->repo, sizeof info->repo, "%s", repo);
    pathf(h.endpoint, sizeof h.endpoint, "%s", env("HF_ENDPOINT") ? env("HF_ENDPOINT") : "https://huggingface.co");
    size_t el = strlen(h.endpoint);
    while (el && h.endpoint[el - 1] == '/') h.endpoint[--el] = 0;
    tk_hub_cache_dir(h.cache, sizeof h.cache);
    const char *slash = strchr(repo, '/');
    pathf(h.dir, sizeof h.dir, "%s/models--%.*s--%s", h.cache, (int)(slash - repo), repo, slash + 1);

    if (is_hex(h.revision, 40)) pathf(h.commit, sizeof h.commit, "%s", h.revision);
    else read_ref(&h, h.commit, sizeof h.commit);

    /* The cache first: a whole snapshot is used with no request. */
    const char *missing = snapshot_missing(&h, o->weights);
    int offline = o->offline || env_true("HF_HUB_OFFLINE");
    if (missing && offline) {
        if (!h.commit[0])
            tk_err_set(err, TK_EIO,
                       "%s (revision %s) is not in the HF cache %s and HF_HUB_OFFLINE=1 forbids downloading it: unset "
                       "HF_HUB_OFFLINE, or set model: to a local folder",
                       repo, h.revision, h.cache);
        else
            tk_err_set(err, TK_EIO,
                       "%s (revision %s, commit %s) lacks %s in the HF cache %s and HF_HUB_OFFLINE=1 forbids "
                       "downloading it: unset HF_HUB_OFFLINE, or set model: to a local folder",
                       repo, h.revision, h.commit, missing, h.cache);
        return TK_EIO;
    }
    tk_status st = TK_OK;
    if (missing) {
        static int curl_ready;
        if (!curl_ready) {
            if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                tk_err_set(err, TK_EIO, "libcurl: initialisation failed");
                return TK_EIO;
            }
            curl_ready = 1;
        }
        if (sodium_init() < 0) {
            tk_err_set(err, TK_EIO, "libsodium: initialisation failed");
            return TK_EIO;
        }
        token(h.token, sizeof h.token);
        if (tk_mkdirs(h.dir, err) != TK_OK) return TK_EIO;
        /* Which commit the revision is now: the hub says so in every answer. */
        if (!is_hex(h.revision, 40)) {
            char url[4096];
            url_of(&h, h.revision, "config.json", url, sizeof url);
            head_info hi;
            if ((st = http_head(&h, url, &hi, err)) != TK_OK) return st;
            if (hi.code >= 400) return http_error(&h, "config.json", h.revision, &hi, err);
            if (!is_hex(hi.commit, 40)) {
                tk_err_set(err, TK_EFORMAT, "%s: no X-Repo-Commit header in the answer (is HF_ENDPOINT %s a hub?)", url,
                           h.endpoint);
                return TK_EFORMAT;
            }
            pathf(h.commit, sizeof h.commit, "%s", hi.commit);
            if ((st = write_ref(&h, err)) != TK_OK) return st;
        }
        int found, tokenizer = 0;
        st = list_files(&h, err);
        if (st == TK_OK) st = fetch(&h, "config.json", 0, &found, err);
        for (int i = 0; TOKENIZER_FILES[i] && st == TK_OK; i++) {
            st = fetch(&h, TOKENIZER_FILES[i], 1, &found, err);
            tokenizer |= found;
        }
        if (st == TK_OK && !tokenizer) {
            tk_err_set(err, TK_EIO,
                       "%s (revision %s, commit %s) has neither vocab.txt nor tokenizer.json: no tokenizer to read; "
                       "set vocab: to a vocab.txt or tokenizer.json of your own",
                       repo, h.revision, h.commit);
            st = TK_EIO;
        }
        for (int i = 0; OPTIONAL[i] && st == TK_OK; i++) st = fetch(&h, OPTIONAL[i], 1, &found, err);
        if (st == TK_OK && o->weights && !cached_weights(&h)) st = fetch_weights(&h, err);
        json_decref(h.siblings);
        h.siblings = NULL;
        if (st != TK_OK) return st;
    }
    /* What the cache holds is checked against its name before it is used. */
    const char *w = o->weights ? cached_weights(&h) : NULL;
    if (w && !strcmp(w, "model.safetensors.index.json")) {
        char p[PATHN + 512];
        snap_path(&h, w, p, sizeof p);
        json_t *root = json_load_file(p, 0, NULL);
        const char *k;
        json_t *v;
        const char *done[64];
        int nd = 0;
        json_object_foreach(json_object_get(root, "weight_map"), k, v) {
            const char *shard = json_string_value(v);
            int seen = 0;
            for (int i = 0; i < nd && !seen; i++) seen = !strcmp(done[i], shard);
            if (seen) continue; /* each tensor names its shard: hash each shard once */
            if ((st = verify_blob(&h, shard, err)) != TK_OK) break;
            if (nd < 64) done[nd++] = shard;
        }
        json_decref(root);
    } else if (w) {
        st = verify_blob(&h, w, err);
    }
    if (st != TK_OK) return st;
    if (info) {
        pathf(info->commit, sizeof info->commit, "%s", h.commit);
        pathf(info->weights, sizeof info->weights, "%s", w ? w : "");
    }
    pathf(dir, n, "%s/snapshots/%s", h.dir, h.commit);
    return TK_OK;
}

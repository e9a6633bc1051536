/* cuda_dynload.c — cuBLAS, cuBLASLt and CUPTI opened at run time, so one
 * plugin serves a runtime with CUDA 13 libraries and one with CUDA 12 (Colab's
 * torch brings nvidia-cublas-cu12; a torch built for CUDA 13 brings
 * nvidia/cu13/lib). The CUDA runtime itself is linked statically (module.mk),
 * so the driver (libcuda.so.1) is the only other CUDA library the plugin needs.
 *
 * Every function the plugin calls in these libraries is defined here under
 * its own name (hidden, so nothing else in the process binds to it) and
 * forwards to the pointer resolved with dlsym. A call added elsewhere to a
 * function not listed here fails the plugin's --no-undefined link: add its
 * line to the list below. Before the libraries are open every forwarder
 * returns the library's "not initialized" status.
 *
 * Where it looks, first match wins, CUDA 13 before 12 at each place
 * ($TXK_CUDA_MAJOR=12 or 13 allows one major only):
 *   1. a cuBLAS already in the process (torch imported first): its major;
 *   2. the folders in $TXK_CUDA_LIBDIRS (colon separated; the companion puts
 *      the nvidia pip wheels' folders of every sys.path entry there);
 *   3. the pip wheels beside the plugin's own package:
 *      <plugin dir>/../nvidia/cu13/lib, ../nvidia/cublas/lib and
 *      ../nvidia/cuda_cupti/lib (CUDA 12's wheels put each library apart);
 *   4. the loader's own search (LD_LIBRARY_PATH, ld.so.cache);
 *   5. $CUDA_HOME/lib64 and /usr/local/cuda/lib64 (and extras/CUPTI/lib64).
 * cuBLASLt and cuBLAS come from one folder and one major. CUPTI is looked
 * for in the same places, CUDA 13 first whatever cuBLAS's major: CUPTI
 * hooks the CUDA runtime, and the one linked in is 13. Where only CUDA 12's
 * CUPTI exists (Colab's cu12 torch) that one is taken; whether CUPTI 12
 * traces a process with the 13 runtime has not been seen on a GPU (when it
 * cannot, tk_cupti_acquire says why and tracing is off). A library that is found is
 * kept loaded for the life of the process (RTLD_NODELETE: CUPTI's worker
 * thread must not run into unmapped code, as for the plugin itself).
 *
 * The structs and enum values the plugin uses are the same in the CUDA 12.8
 * and 13.0 headers (tests/wheel/test_cuda_libs.py compiles them against both).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cupti.h>
#include "cuda_dynload.h"

/* X(library, return type, name, parameters, arguments) */
#define TK_LT_FUNCS(X)                                                                                       \
    X(LT, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t *h), (h))                                       \
    X(LT, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))                                       \
    X(LT, cublasStatus_t, cublasLtMatmul,                                                                   \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,                     \
       cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,         \
       const void *C, cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,                  \
       const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream),                   \
      (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, ws, ws_bytes, stream))           \
    X(LT, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                                   \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,                         \
       cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,            \
       cublasLtMatmulPreference_t pref, int want, cublasLtMatmulHeuristicResult_t res[], int *got),         \
      (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, want, res, got))                                          \
    X(LT, cublasStatus_t, cublasLtMatmulDescCreate,                                                         \
      (cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale), (d, compute, scale))    \
    X(LT, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))                         \
    X(LT, cublasStatus_t, cublasLtMatmulDescSetAttribute,                                                   \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n), (d, a, buf, n)) \
    X(LT, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *p), (p))             \
    X(LT, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))             \
    X(LT, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                             \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n),    \
      (p, a, buf, n))                                                                                       \
    X(LT, cublasStatus_t, cublasLtMatrixLayoutCreate,                                                       \
      (cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),            \
      (l, type, rows, cols, ld))                                                                            \
    X(LT, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))

#define TK_BLAS_FUNCS(X)                                                                                     \
    X(BLAS, cublasStatus_t, cublasCreate_v2, (cublasHandle_t *h), (h))                                      \
    X(BLAS, cublasStatus_t, cublasDestroy_v2, (cublasHandle_t h), (h))                                      \
    X(BLAS, cublasStatus_t, cublasSetWorkspace_v2, (cublasHandle_t h, void *ws, size_t n), (h, ws, n))      \
    X(BLAS, cublasStatus_t, cublasSetMathMode, (cublasHandle_t h, cublasMath_t mode), (h, mode))            \
    X(BLAS, cublasStatus_t, cublasGemmStridedBatchedEx,                                                     \
      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,  \
       const void *A, cudaDataType Atype, int lda, long long int sA, const void *B, cudaDataType Btype,      \
       int ldb, long long int sB, const void *beta, void *C, cudaDataType Ctype, int ldc, long long int sC,  \
       int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo),                                      \
      (h, ta, tb, m, n, k, alpha, A, Atype, lda, sA, B, Btype, ldb, sB, beta, C, Ctype, ldc, sC, batch,     \
       compute, algo))

#define TK_CUPTI_FUNCS(X)                                                                                    \
    X(CUPTI, CUptiResult, cuptiActivityEnable, (CUpti_ActivityKind k), (k))                                 \
    X(CUPTI, CUptiResult, cuptiActivityDisable, (CUpti_ActivityKind k), (k))                                \
    X(CUPTI, CUptiResult, cuptiActivityEnableAllocationSource, (uint8_t on), (on))                          \
    X(CUPTI, CUptiResult, cuptiActivityFlushAll, (uint32_t flag), (flag))                                   \
    X(CUPTI, CUptiResult, cuptiActivityGetNextRecord, (uint8_t *buf, size_t valid, CUpti_Activity **rec),   \
      (buf, valid, rec))                                                                                    \
    X(CUPTI, CUptiResult, cuptiActivityGetNumDroppedRecords, (CUcontext c, uint32_t stream, size_t *n),     \
      (c, stream, n))                                                                                       \
    X(CUPTI, CUptiResult, cuptiActivityPushExternalCorrelationId,                                           \
      (CUpti_ExternalCorrelationKind k, uint64_t id), (k, id))                                              \
    X(CUPTI, CUptiResult, cuptiActivityPopExternalCorrelationId,                                            \
      (CUpti_ExternalCorrelationKind k, uint64_t *id), (k, id))                                             \
    X(CUPTI, CUptiResult, cuptiActivityRegisterCallbacks,                                                   \
      (CUpti_BuffersCallbackRequestFunc req, CUpti_BuffersCallbackCompleteFunc done), (req, done))

/* the pointers, one per function, named as the function */
#define TK_SLOT(lib, ret, name, params, args) ret (*name) params;
static struct {
    TK_LT_FUNCS(TK_SLOT)
    TK_BLAS_FUNCS(TK_SLOT)
    TK_CUPTI_FUNCS(TK_SLOT)
    CUptiResult (*cuptiGetResultString)(CUptiResult, const char **);
} P;
#undef TK_SLOT

/* the forwarders */
#define TK_FAIL_LT CUBLAS_STATUS_NOT_INITIALIZED
#define TK_FAIL_BLAS CUBLAS_STATUS_NOT_INITIALIZED
#define TK_FAIL_CUPTI CUPTI_ERROR_NOT_INITIALIZED
#define TK_FWD(lib, ret, name, params, args) \
    __attribute__((visibility("hidden"))) ret name params { return P.name ? P.name args : TK_FAIL_##lib; }
TK_LT_FUNCS(TK_FWD)
TK_BLAS_FUNCS(TK_FWD)
TK_CUPTI_FUNCS(TK_FWD)
#undef TK_FWD

static char cupti_why[512] = "CUPTI was not opened";

/* Without CUPTI the plugin still asks for its error strings: say why it is off. */
__attribute__((visibility("hidden"))) CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult r, const char **s) {
    if (P.cuptiGetResultString) return P.cuptiGetResultString(r, s);
    *s = cupti_why;
    return CUPTI_SUCCESS;
}

/* ---- finding the libraries ------------------------------------------------------ */

#define MAX_DIRS 32
typedef struct {
    int n;
    char dir[MAX_DIRS][PATH_MAX]; /* "" is the loader's own search */
} dir_list;

static void add_dir(dir_list *l, const char *d, size_t len) {
    if (l->n >= MAX_DIRS || len >= PATH_MAX) return;
    for (int i = 0; i < l->n; i++)
        if (strlen(l->dir[i]) == len && strncmp(l->dir[i], d, len) == 0) return;
    memcpy(l->dir[l->n], d, len);
    l->dir[l->n][len] = 0;
    l->n++;
}

static void add_path(dir_list *l, const char *base, const char *tail) {
    char p[PATH_MAX];
    int k = snprintf(p, sizeof p, "%s%s", base, tail);
    if (k > 0 && (size_t)k < sizeof p && access(p, R_OK | X_OK) == 0) add_dir(l, p, (size_t)k);
}

static void search_dirs(dir_list *l) {
    memset(l, 0, sizeof *l);
    const char *env = getenv("TXK_CUDA_LIBDIRS");
    for (const char *s = env; s && *s;) {
        const char *e = strchr(s, ':');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len) add_dir(l, s, len);
        s = e ? e + 1 : s + len;
    }
    Dl_info info;
    if (dladdr((void *)search_dirs, &info) && info.dli_fname) {
        char here[PATH_MAX];
        snprintf(here, sizeof here, "%s", info.dli_fname);
        char *slash = strrchr(here, '/');
        if (slash) {
            *slash = 0;
            add_path(l, here, "/../nvidia/cu13/lib");
            add_path(l, here, "/../nvidia/cublas/lib");
            add_path(l, here, "/../nvidia/cuda_cupti/lib");
        }
    }
    add_dir(l, "", 0);
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        add_path(l, home, "/lib64");
        add_path(l, home, "/extras/CUPTI/lib64");
    }
    add_path(l, "/usr/local/cuda", "/lib64");
    add_path(l, "/usr/local/cuda", "/extras/CUPTI/lib64");
}

/* The majors allowed, in order: {13, 12}, or the one $TXK_CUDA_MAJOR names. */
static int majors(int out[2]) {
    const char *m = getenv("TXK_CUDA_MAJOR");
    if (m && (strcmp(m, "12") == 0 || strcmp(m, "13") == 0)) {
        out[0] = atoi(m);
        return 1;
    }
    out[0] = 13;
    out[1] = 12;
    return 2;
}

/* dlopen of dir/name (or name alone for the loader's search); NULL when the
 * file is not there, and the loader's message in err when it is there but
 * does not load. */
static void *open_in(const char *dir, const char *name, char *err, size_t n) {
    char p[PATH_MAX];
    if (*dir) {
        snprintf(p, sizeof p, "%s/%s", dir, name);
        if (access(p, R_OK) != 0) return NULL;
    } else {
        snprintf(p, sizeof p, "%s", name);
    }
    void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!h && *dir) {
        const char *e = dlerror();
        snprintf(err, n, "%.700s", e ? e : p);
    }
    return h;
}

/* Keeps h loaded for good and returns the real path of the file it came from. */
static void keep(void *h, void *sym, char *path, size_t n) {
    Dl_info info;
    if (dladdr(sym, &info) && info.dli_fname) {
        snprintf(path, n, "%s", info.dli_fname);
        void *again = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        if (again) dlclose(again);
    }
    (void)h;
}

#define TK_RESOLVE(lib, ret, name, params, args)                        \
    if (ok) {                                                           \
        *(void **)&P.name = dlsym(h_##lib, #name);                      \
        if (!P.name) {                                                  \
            snprintf(miss, sizeof miss, "%s lacks %s", file_##lib, #name); \
            ok = 0;                                                     \
        }                                                               \
    }

static struct {
    pthread_once_t once;
    int rc, major;
    char why[1024];
    char lt_path[PATH_MAX], blas_path[PATH_MAX];
} B = { .once = PTHREAD_ONCE_INIT, .rc = -1 };

/* One try: cuBLASLt and cuBLAS of one major from one place. 1 on success;
 * 0 and a line in lack when they are there but unusable; -1 when absent. */
static int try_blas(const char *dir, int major, int noload, char *lack, size_t lack_n) {
    char file_LT[64], file_BLAS[64];
    snprintf(file_LT, sizeof file_LT, "libcublasLt.so.%d", major);
    snprintf(file_BLAS, sizeof file_BLAS, "libcublas.so.%d", major);
    void *h_LT, *h_BLAS;
    if (noload) {
        h_LT = dlopen(file_LT, RTLD_NOW | RTLD_NOLOAD);
        h_BLAS = h_LT ? dlopen(file_BLAS, RTLD_NOW | RTLD_NOLOAD) : NULL;
        if (!h_BLAS) {
            if (h_LT) dlclose(h_LT);
            return -1;
        }
    } else {
        h_LT = open_in(dir, file_LT, lack, lack_n);
        if (!h_LT) return lack[0] ? 0 : -1;
        h_BLAS = open_in(dir, file_BLAS, lack, lack_n);
        if (!h_BLAS) {
            /* Lt without cuBLAS beside it */
            if (!lack[0]) snprintf(lack, lack_n, "%s/%s is there but not %s", *dir ? dir : "(loader path)",
                                   file_LT, file_BLAS);
            dlclose(h_LT);
            return 0;
        }
    }
    char miss[256];
    int ok = 1;
    TK_LT_FUNCS(TK_RESOLVE)
    TK_BLAS_FUNCS(TK_RESOLVE)
    if (!ok) {
        snprintf(lack, lack_n, "%s/%s", *dir ? dir : "(loader path)", miss);
#define TK_CLEAR(lib, ret, name, params, args) P.name = NULL;
        TK_LT_FUNCS(TK_CLEAR)
        TK_BLAS_FUNCS(TK_CLEAR)
#undef TK_CLEAR
        dlclose(h_BLAS);
        dlclose(h_LT);
        return 0;
    }
    keep(h_LT, (void *)P.cublasLtCreate, B.lt_path, sizeof B.lt_path);
    keep(h_BLAS, (void *)P.cublasCreate_v2, B.blas_path, sizeof B.blas_path);
    B.major = major;
    return 1;
}

static void dirs_said(const dir_list *l, char *out, size_t n) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < l->n && k + 1 < n; i++) {
        int w = snprintf(out + k, n - k, "%s%s", i ? ", " : "", l->dir[i][0] ? l->dir[i] : "the loader's path");
        if (w < 0) break;
        k += (size_t)w;
    }
}

static void blas_load(void) {
    int m[2], nm = majors(m);
    char lack[768] = "";
    for (int i = 0; i < nm; i++)
        if (try_blas("", m[i], 1, lack, sizeof lack) == 1) {
            B.rc = 0;
            return;
        }
    dir_list l;
    search_dirs(&l);
    for (int d = 0; d < l.n; d++)
        for (int i = 0; i < nm; i++) {
            char this_lack[768] = "";
            int r = try_blas(l.dir[d], m[i], 0, this_lack, sizeof this_lack);
            if (r == 1) {
                B.rc = 0;
                return;
            }
            if (r == 0 && !lack[0]) snprintf(lack, sizeof lack, "%s", this_lack);
        }
    char where[512];
    dirs_said(&l, where, sizeof where);
    if (lack[0])
        snprintf(B.why, sizeof B.why, "cuBLAS unusable: %.400s (looked in %.400s)", lack, where);
    else
        snprintf(B.why, sizeof B.why,
                 "cuBLAS not found: no libcublasLt.so.%d%s with libcublas beside it in %.400s; it comes with "
                 "torch's CUDA wheels (nvidia-cublas-cu12, or nvidia/cu13 for CUDA 13) or the CUDA toolkit, "
                 "or set TXK_CUDA_LIBDIRS to its folder",
                 m[0], nm > 1 ? " or .so.12" : "", where);
}

int tk_cuda_blas_open(char *why, size_t n) {
    pthread_once(&B.once, blas_load);
    if (B.rc != 0) snprintf(why, n, "%s", B.why);
    return B.rc;
}

static struct {
    pthread_once_t once;
    int rc, major;
    char path[PATH_MAX];
} C = { .once = PTHREAD_ONCE_INIT, .rc = -1 };

static int try_cupti(const char *dir, int major, char *lack, size_t lack_n) {
    char file_CUPTI[64];
    snprintf(file_CUPTI, sizeof file_CUPTI, "libcupti.so.%d", major);
    void *h_CUPTI = open_in(dir, file_CUPTI, lack, lack_n);
    if (!h_CUPTI) return lack[0] ? 0 : -1;
    char miss[256];
    int ok = 1;
    TK_CUPTI_FUNCS(TK_RESOLVE)
    *(void **)&P.cuptiGetResultString = ok ? dlsym(h_CUPTI, "cuptiGetResultString") : NULL;
    if (ok && !P.cuptiGetResultString) {
        snprintf(miss, sizeof miss, "%s lacks cuptiGetResultString", file_CUPTI);
        ok = 0;
    }
    if (!ok) {
        snprintf(lack, lack_n, "%s/%s", *dir ? dir : "(loader path)", miss);
#define TK_CLEAR(lib, ret, name, params, args) P.name = NULL;
        TK_CUPTI_FUNCS(TK_CLEAR)
#undef TK_CLEAR
        P.cuptiGetResultString = NULL;
        dlclose(h_CUPTI);
        return 0;
    }
    keep(h_CUPTI, (void *)P.cuptiActivityEnable, C.path, sizeof C.path);
    C.major = major;
    return 1;
}

static void cupti_load(void) {
    int m[2], nm = majors(m);
    char lack[768] = "";
    dir_list l;
    search_dirs(&l);
    for (int i = 0; i < nm; i++)
        for (int d = 0; d < l.n; d++) {
            char this_lack[768] = "";
            int r = try_cupti(l.dir[d], m[i], this_lack, sizeof this_lack);
            if (r == 1) {
                C.rc = 0;
                return;
            }
            if (r == 0 && !lack[0]) snprintf(lack, sizeof lack, "%s", this_lack);
        }
    char where[512];
    dirs_said(&l, where, sizeof where);
    if (lack[0])
        snprintf(cupti_why, sizeof cupti_why, "CUPTI unusable: %.300s (looked in %.180s)", lack, where);
    else
        snprintf(cupti_why, sizeof cupti_why,
                 "CUPTI not found: no libcupti.so.%d%s in %.300s; it comes with torch's CUDA wheels "
                 "(nvidia-cuda-cupti-cu12) or the CUDA toolkit",
                 m[0], nm > 1 ? (m[0] == 13 ? " or .so.12" : " or .so.13") : "", where);
}

int tk_cuda_cupti_open(char *why, size_t n) {
    pthread_once(&C.once, cupti_load);
    if (C.rc != 0) snprintf(why, n, "%s", cupti_why);
    return C.rc;
}

const char *tk_cuda_libs_where(void) {
    static char s[3 * PATH_MAX + 64];
    if (B.rc != 0) return "cuBLAS not open";
    int k = snprintf(s, sizeof s, "cuBLAS %d (%s, %s)", B.major, B.blas_path, B.lt_path);
    if (C.rc == 0 && k > 0 && (size_t)k < sizeof s)
        snprintf(s + k, sizeof s - (size_t)k, "; CUPTI %d (%s)", C.major, C.path);
    return s;
}

/* For tests and diagnosis without a GPU: opens cuBLAS and CUPTI as the plugin
 * would and writes where they came from, or why not, to out (one line).
 * 0: both open; 1: cuBLAS open, CUPTI not; -1: cuBLAS not. */
__attribute__((visibility("default"))) int tk_cuda_libs_probe(char *out, size_t n) {
    char why[1024];
    if (tk_cuda_blas_open(why, sizeof why) != 0) {
        snprintf(out, n, "%s", why);
        return -1;
    }
    if (tk_cuda_cupti_open(why, sizeof why) != 0) {
        snprintf(out, n, "%s; %s", tk_cuda_libs_where(), why);
        return 1;
    }
    snprintf(out, n, "%s", tk_cuda_libs_where());
    return 0;
}

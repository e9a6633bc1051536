/* cuda_cupti.c — CUPTI activity tracing for the cuda plugin.
 *
 * One session per process (CUPTI's activity API is process-wide), reference
 * counted by the plugin contexts that use it. It records:
 *  - every device allocation and release in the process (MEMORY2), with the
 *    library that asked (allocation source on), so bytes cuBLAS or anyone
 *    else takes outside our allocator are seen and named;
 *  - every kernel's duration (CONCURRENT_KERNEL), and through external
 *    correlation ids the owner scope it was launched in.
 *
 * Guarantees: when CUPTI cannot be enabled (no libcupti support, another
 * profiler such as Nsight already subscribed) acquire returns 0 with the
 * reason and everything else keeps working; records are only read in CUPTI's
 * buffer-completion callback and in flush, both under one mutex.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <cupti.h>
#include "cuda_internal.h"

#define BUF_BYTES ((size_t)8 << 20)
#define CORR_SLOTS ((size_t)1 << 20) /* external-id table, indexed by correlation id */
#define MAX_PENDING ((size_t)1 << 20)
#define MAX_LIVE_HINT 4096

typedef struct { uint64_t addr, bytes; int src; } live_rec;
typedef struct { uint32_t corr; double ns; } pending_kernel;

static struct {
    pthread_mutex_t lock;
    int refs, active;
    /* memory */
    uint64_t live, peak, n_alloc, n_free, dropped;
    live_rec *lives; size_t n_lives, cap_lives;   /* live allocations, for releases */
    int n_src;
    struct { char name[64]; uint64_t live, peak; } src[TK_CUDA_MAX_SOURCES];
    /* kernels */
    uint64_t n_kernels; double kernel_ns;
    uint32_t *corr_key; int32_t *corr_ext;         /* correlation id -> owner scope */
    pending_kernel *pending; size_t n_pending;
    uint64_t scope_n[TK_CUDA_MAX_SCOPES + 1];      /* [0] is "no scope" (-1) */
    double scope_ns[TK_CUDA_MAX_SCOPES + 1];
} S = { .lock = PTHREAD_MUTEX_INITIALIZER };

static const char *base_name(const char *path) {
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : (path && *path ? path : "(unknown)");
}

static int source_index(const char *path) {
    const char *b = base_name(path);
    for (int i = 0; i < S.n_src; i++)
        if (strcmp(S.src[i].name, b) == 0) return i;
    if (S.n_src < TK_CUDA_MAX_SOURCES) {
        snprintf(S.src[S.n_src].name, sizeof S.src[0].name, "%s", b);
        return S.n_src++;
    }
    return TK_CUDA_MAX_SOURCES - 1; /* the last slot collects the overflow */
}

static void on_memory(const CUpti_ActivityMemory4 *r) {
    if (r->memoryKind != CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) return;
    if (r->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
        int si = source_index(r->source);
        if (S.n_lives == S.cap_lives) {
            size_t cap = S.cap_lives ? S.cap_lives * 2 : MAX_LIVE_HINT;
            live_rec *p = realloc(S.lives, cap * sizeof *p);
            if (!p) { S.dropped++; return; } /* host OOM: counted as a dropped record */
            S.lives = p;
            S.cap_lives = cap;
        }
        S.lives[S.n_lives++] = (live_rec){ r->address, r->bytes, si };
        S.n_alloc++;
        S.live += r->bytes;
        if (S.live > S.peak) S.peak = S.live;
        S.src[si].live += r->bytes;
        if (S.src[si].live > S.src[si].peak) S.src[si].peak = S.src[si].live;
    } else if (r->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
        /* Match by address, newest first (an address is reused only after
         * its release, which comes in order). */
        for (size_t i = S.n_lives; i-- > 0;) {
            if (S.lives[i].addr != r->address) continue;
            S.live -= S.lives[i].bytes;
            S.src[S.lives[i].src].live -= S.lives[i].bytes;
            S.lives[i] = S.lives[--S.n_lives];
            S.n_free++;
            return;
        }
    }
}

static void count_kernel(int32_t scope, double ns) {
    int i = (scope >= 0 && scope < TK_CUDA_MAX_SCOPES) ? scope + 1 : 0;
    S.scope_n[i]++;
    S.scope_ns[i] += ns;
}

static int32_t scope_of(uint32_t corr) {
    size_t slot = corr & (CORR_SLOTS - 1);
    return (S.corr_key[slot] == corr) ? S.corr_ext[slot] : INT32_MIN;
}

static void on_kernel(const CUpti_ActivityKernel10 *k) {
    double ns = (double)(k->end - k->start);
    S.n_kernels++;
    S.kernel_ns += ns;
    int32_t sc = scope_of(k->correlationId);
    if (sc != INT32_MIN) count_kernel(sc, ns);
    else if (S.n_pending < MAX_PENDING) S.pending[S.n_pending++] = (pending_kernel){ k->correlationId, ns };
    else count_kernel(-1, ns);
}

static void on_external(const CUpti_ActivityExternalCorrelation *x) {
    if (x->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return;
    size_t slot = x->correlationId & (CORR_SLOTS - 1);
    S.corr_key[slot] = x->correlationId;
    S.corr_ext[slot] = (int32_t)x->externalId;
}

static void CUPTIAPI buf_request(uint8_t **buffer, size_t *size, size_t *max_records) {
    /* CUPTI wants 8-byte aligned buffers. */
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext cctx, uint32_t stream, uint8_t *buffer, size_t size,
                                  size_t valid) {
    (void)size;
    CUpti_Activity *rec = NULL;
    size_t dropped = 0;
    pthread_mutex_lock(&S.lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_MEMORY2: on_memory((const CUpti_ActivityMemory4 *)rec); break;
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: on_kernel((const CUpti_ActivityKernel10 *)rec); break;
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
            on_external((const CUpti_ActivityExternalCorrelation *)rec);
            break;
        default: break; /* RUNTIME/DRIVER records only carry the external ids */
        }
    }
    if (cuptiActivityGetNumDroppedRecords(cctx, stream, &dropped) == CUPTI_SUCCESS)
        S.dropped += dropped;
    pthread_mutex_unlock(&S.lock);
    free(buffer);
}

static const char *cupti_str(CUptiResult r) {
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    return s;
}

#define CUPTI_TRY(call) do { CUptiResult _r = (call); if (_r != CUPTI_SUCCESS) { \
    snprintf(why, n, "%s: %s", #call, cupti_str(_r)); goto fail; } } while (0)

int tk_cupti_acquire(int kernels, char *why, size_t n) {
    pthread_mutex_lock(&S.lock);
    if (S.refs > 0) {
        S.refs++;
        pthread_mutex_unlock(&S.lock);
        return 1;
    }
    S.corr_key = calloc(CORR_SLOTS, sizeof *S.corr_key);
    S.corr_ext = calloc(CORR_SLOTS, sizeof *S.corr_ext);
    S.pending = malloc(MAX_PENDING * sizeof *S.pending);
    pthread_mutex_unlock(&S.lock);
    if (!S.corr_key || !S.corr_ext || !S.pending) {
        snprintf(why, n, "out of host memory for the CUPTI tables");
        goto fail;
    }
    /* Empty slots hold an id CUPTI does not reach in one process. */
    for (size_t i = 0; i < CORR_SLOTS; i++) S.corr_key[i] = UINT32_MAX;
    CUPTI_TRY(cuptiActivityRegisterCallbacks(buf_request, buf_complete));
    CUPTI_TRY(cuptiActivityEnableAllocationSource(1));
    CUPTI_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2));
    /* Kernel records only when asked (TXK_CUPTI=kernels): concurrent-kernel
     * tracing and the runtime and driver API records behind owner scopes
     * cost every launch host time, and a timed step is launch bound at
     * small shapes (issue 43); the memory records, which name the bytes a
     * library takes outside the allocator, stay on. */
    if (kernels) CUPTI_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    /* Owner scopes are a bonus: external correlation records are only
     * emitted for API calls that are themselves recorded, so runtime and
     * driver API records go on too. If any of that fails, memory and kernel
     * totals still work and every kernel counts as unscoped. */
    if (kernels && (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS)) {
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
    }
    pthread_mutex_lock(&S.lock);
    S.refs = 1;
    S.active = 1;
    pthread_mutex_unlock(&S.lock);
    return 1;
fail:
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
    pthread_mutex_lock(&S.lock);
    free(S.corr_key); free(S.corr_ext); free(S.pending);
    S.corr_key = NULL; S.corr_ext = NULL; S.pending = NULL;
    pthread_mutex_unlock(&S.lock);
    return 0;
}

void tk_cupti_release(void) {
    pthread_mutex_lock(&S.lock);
    int last = S.refs > 0 && --S.refs == 0;
    pthread_mutex_unlock(&S.lock);
    if (!last) return;
    /* Disable first, then flush: afterwards CUPTI holds no buffer and will
     * not call back, so the plugin can be unloaded. */
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&S.lock);
    S.active = 0;
    free(S.corr_key); free(S.corr_ext); free(S.pending); free(S.lives);
    S.corr_key = NULL; S.corr_ext = NULL; S.pending = NULL; S.lives = NULL;
    S.n_lives = S.cap_lives = S.n_pending = 0;
    /* A later session starts from zero: frees made while tracing was off
     * were not seen, so the old totals would be wrong. */
    S.live = S.peak = S.n_alloc = S.n_free = S.dropped = 0;
    S.n_src = 0;
    memset(S.src, 0, sizeof S.src);
    S.n_kernels = 0;
    S.kernel_ns = 0.0;
    memset(S.scope_n, 0, sizeof S.scope_n);
    memset(S.scope_ns, 0, sizeof S.scope_ns);
    pthread_mutex_unlock(&S.lock);
}

tk_status tk_cupti_flush(void) {
    if (cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != CUPTI_SUCCESS) return TK_EDEVICE;
    /* Every record of work finished so far is in now: kernels whose
     * external record came later are resolved, the rest had no scope. */
    pthread_mutex_lock(&S.lock);
    for (size_t i = 0; i < S.n_pending; i++) {
        int32_t sc = scope_of(S.pending[i].corr);
        count_kernel(sc == INT32_MIN ? -1 : sc, S.pending[i].ns);
    }
    S.n_pending = 0;
    pthread_mutex_unlock(&S.lock);
    return TK_OK;
}

void tk_cupti_reset_peak(void) {
    pthread_mutex_lock(&S.lock);
    S.peak = S.live;
    for (int i = 0; i < S.n_src; i++) S.src[i].peak = S.src[i].live;
    pthread_mutex_unlock(&S.lock);
}

void tk_cupti_fill(tk_cuda_mem_totals *out) {
    pthread_mutex_lock(&S.lock);
    out->cupti_active = S.active;
    out->device_live = S.live;
    out->device_peak = S.peak;
    out->n_alloc_records = S.n_alloc;
    out->n_free_records = S.n_free;
    out->dropped_records = S.dropped;
    out->n_kernels = S.n_kernels;
    out->kernel_ns = S.kernel_ns;
    out->n_sources = S.n_src;
    for (int i = 0; i < S.n_src; i++) {
        memcpy(out->sources[i].name, S.src[i].name, sizeof out->sources[i].name);
        out->sources[i].live = S.src[i].live;
        out->sources[i].peak = S.src[i].peak;
    }
    pthread_mutex_unlock(&S.lock);
}

__attribute__((visibility("default")))
void tk_cuda_scope_push(void *ctx, int owner) {
    tk_cuda_ctx *c = ctx;
    if (c && c->cupti_on)
        cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, (uint64_t)owner);
}

__attribute__((visibility("default")))
void tk_cuda_scope_pop(void *ctx) {
    tk_cuda_ctx *c = ctx;
    uint64_t last = 0;
    if (c && c->cupti_on)
        cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

__attribute__((visibility("default")))
void tk_cuda_scope_kernel_time(void *ctx, int owner, uint64_t *n_kernels, double *ns) {
    (void)ctx;
    int i = (owner >= 0 && owner < TK_CUDA_MAX_SCOPES) ? owner + 1 : 0;
    pthread_mutex_lock(&S.lock);
    if (n_kernels) *n_kernels = S.scope_n[i];
    if (ns) *ns = S.scope_ns[i];
    pthread_mutex_unlock(&S.lock);
}

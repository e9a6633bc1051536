/* device.c — the device report behind `%txdevice` and `txk mem` (capacity,
 * free, what this session holds, what other processes hold, driver and
 * CUDA versions), moved from magics/txdevice.c (issue 39: the front doors
 * only parse and show).
 *
 * NVML is loaded with dlopen("libnvidia-ml.so.1") at the moment it is asked
 * for: it ships with the driver, so a machine without a GPU simply has none
 * and the report says so. Only the handful of entry points used are declared
 * here, with the layouts of nvml.h (v2 memory info, v3 process info).
 *
 * Guarantees: the report never allocates on the device; on cpu and meta it
 * says plainly that the capacity is simulated.
 */
#include <dlfcn.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_attn_kernel.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_app.h"

typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvml_process;
typedef void *nvml_device;

typedef struct {
    char driver[80];
    int cuda_version; /* 12040 = 12.4 */
    int ndev;
    struct {
        char name[96];
        unsigned long long total, free, used;
        int nproc;
        nvml_process proc[16];
    } dev[8];
} nvml_info;

/* 0 and *out filled when NVML answered; -1 (and why) otherwise. */
static int nvml_query(nvml_info *out, char *why, size_t why_n) {
    memset(out, 0, sizeof *out);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        snprintf(why, why_n, "NVML not available (no libnvidia-ml.so.1: no NVIDIA driver on this machine)");
        return -1;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(h, "nvmlShutdown");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*byidx)(unsigned, nvml_device *) = (int (*)(unsigned, nvml_device *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*meminfo)(nvml_device, nvml_memory *) = (int (*)(nvml_device, nvml_memory *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*name)(nvml_device, char *, unsigned) = (int (*)(nvml_device, char *, unsigned))dlsym(h, "nvmlDeviceGetName");
    int (*procs)(nvml_device, unsigned *, nvml_process *) =
        (int (*)(nvml_device, unsigned *, nvml_process *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    int (*drv)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(h, "nvmlSystemGetDriverVersion");
    int (*cudav)(int *) = (int (*)(int *))dlsym(h, "nvmlSystemGetCudaDriverVersion");
    if (!init || !count || !byidx || !meminfo) {
        snprintf(why, why_n, "NVML is too old (missing nvmlInit_v2 / nvmlDeviceGetCount_v2)");
        dlclose(h);
        return -1;
    }
    if (init() != 0) {
        snprintf(why, why_n, "NVML could not initialise (driver not loaded?)");
        dlclose(h);
        return -1;
    }
    if (drv) drv(out->driver, sizeof out->driver);
    if (cudav) cudav(&out->cuda_version);
    unsigned n = 0;
    count(&n);
    for (unsigned i = 0; i < n && i < 8; i++) {
        nvml_device d;
        if (byidx(i, &d) != 0) continue;
        int k = out->ndev++;
        nvml_memory mi;
        if (meminfo(d, &mi) == 0) {
            out->dev[k].total = mi.total;
            out->dev[k].free = mi.free;
            out->dev[k].used = mi.used;
        }
        if (name) name(d, out->dev[k].name, sizeof out->dev[k].name);
        if (procs) {
            unsigned np = 16;
            if (procs(d, &np, out->dev[k].proc) == 0) out->dev[k].nproc = (int)(np < 16 ? np : 16);
        }
    }
    if (shutdown) shutdown();
    dlclose(h);
    return 0;
}

/* "Fused attention on <card> (<precision>): <which kernel and why>" for a
 * card of compute capability major.minor, into text and json[key]. The
 * head size is the model's (not known here): the line gives the rule. */
static void attention_kernel_line(tk_sb *text, json_t *j, const char *key, const char *card, int major, int minor,
                                  const tk_config *c) {
    const tk_precision prec = c ? c->precision : TK_PREC_FP16;
    const tk_dtype dt = prec == TK_PREC_FP16 ? TK_F16 : prec == TK_PREC_BF16 ? TK_BF16 : TK_F32;
    char line[192];
    tk_attn_kernel_line(line, sizeof line, major, minor, dt, 0, tk_attn_kernel_ask(getenv(TK_ATTN_KERNEL_ENV)));
    tk_sb_addf(text, "Fused attention on %s (%s): %s\n", card, tk_dtype_name(dt), line);
    json_object_set_new(j, key, json_string(line));
}

json_t *tk_device_report(tk_dev *d, const tk_config *c) {
    tk_sb text = {0}, html = {0};
    char a[32], b[32], u[32], r2[32];
    json_t *j = json_object();
    if (d) {
        tk_dev_info info;
        tk_dev_info_get(d, &info);
        tk_alloc_stats st;
        tk_alloc_stats_get(tk_dev_alloc(d), &st);
        const char *kind = tk_dev_kind_of(d) == TK_DEV_CUDA ? "cuda" : tk_dev_kind_of(d) == TK_DEV_CPU ? "cpu" : "meta";
        tk_sb_addf(&text, "Session device: %s (%s)\n", info.name, kind);
        tk_sb_addf(&text, "Capacity %s, free %s; this session holds %s allocated, %s reserved\n",
                   tk_format_bytes(info.total, a, sizeof a), tk_format_bytes(info.free_bytes, b, sizeof b),
                   tk_format_bytes(st.allocated, u, sizeof u), tk_format_bytes(st.reserved, r2, sizeof r2));
        if (info.simulated)
            tk_sb_addf(&text, "The capacity is simulated: the allocator refuses anything past %s, as a GPU of that "
                              "size would%s.\n", tk_format_bytes(info.total, a, sizeof a),
                       tk_dev_kind_of(d) == TK_DEV_CPU ? "; the arithmetic runs on the cpu" : "; meta does no arithmetic");
        if (info.cc_major) tk_sb_addf(&text, "Compute capability %d.%d\n", info.cc_major, info.cc_minor);
        if (tk_dev_kind_of(d) == TK_DEV_CUDA && info.cc_major)
            attention_kernel_line(&text, j, "attention_kernel", "this card", info.cc_major, info.cc_minor, c);
        if (info.driver[0] || info.runtime[0])
            tk_sb_addf(&text, "Driver %s, runtime %s\n", info.driver[0] ? info.driver : "?",
                       info.runtime[0] ? info.runtime : "?");
        json_object_set_new(j, "kind", json_string(kind));
        json_object_set_new(j, "name", json_string(info.name));
        json_object_set_new(j, "capacity", json_integer((json_int_t)info.total));
        json_object_set_new(j, "free", json_integer((json_int_t)info.free_bytes));
        json_object_set_new(j, "simulated", json_boolean(info.simulated));
        json_object_set_new(j, "allocated", json_integer((json_int_t)st.allocated));
        json_object_set_new(j, "reserved", json_integer((json_int_t)st.reserved));
        json_object_set_new(j, "driver", json_string(info.driver));
        json_object_set_new(j, "runtime", json_string(info.runtime));
    } else {
        size_t cap = c ? tk_session_capacity_of(c) : 0;
        tk_sb_addf(&text, "No device opened yet in this session (the first %%%%txtrain opens one).\n");
        if (cap)
            tk_sb_addf(&text, "The current config asks for a simulated capacity of %s.\n", tk_format_bytes(cap, a, sizeof a));
        json_object_set_new(j, "kind", json_string("none"));
    }
    if (c && c->gpu[0]) {
        const tk_gpu_profile *p = tk_gpu_profile_find(c->gpu);
        if (p) {
            char e[32], w[32], o[32];
            const char *own_src = NULL;
            size_t own = tk_cuda_library_own_bytes(p->cc_major, p->cc_minor, &own_src);
            tk_sb_addf(&text, "Planning profile %s: %s, %s as PyTorch reports it, context ~%s (the profile's "
                              "default, not measured), libraries' own %s (%s): %s usable%s; of that, the cuBLAS "
                              "workspace takes %s (an allocator block, in every plan)\n",
                       p->name, p->long_name, tk_format_bytes(p->capacity, a, sizeof a),
                       tk_format_bytes(p->context_overhead, b, sizeof b), tk_format_bytes(own, o, sizeof o),
                       own_src, tk_format_bytes(tk_gpu_profile_budget(p), e, sizeof e),
                       c->capacity ? " (capacity: overrides it)" : "",
                       tk_format_bytes(TK_CUDA_WORKSPACE_BYTES, w, sizeof w));
            attention_kernel_line(&text, j, "profile_attention_kernel", p->name, p->cc_major, p->cc_minor, c);
        }
    }
    nvml_info nv;
    char why[160];
    if (nvml_query(&nv, why, sizeof why) == 0) {
        tk_sb_addf(&text, "NVML: driver %s, CUDA %d.%d, %d GPU(s)\n", nv.driver, nv.cuda_version / 1000,
                   nv.cuda_version % 1000 / 10, nv.ndev);
        json_t *gpus = json_array();
        for (int i = 0; i < nv.ndev; i++) {
            tk_sb_addf(&text, "  GPU %d %s: total %s, free %s, used %s\n", i, nv.dev[i].name,
                       tk_format_bytes(nv.dev[i].total, a, sizeof a), tk_format_bytes(nv.dev[i].free, b, sizeof b),
                       tk_format_bytes(nv.dev[i].used, u, sizeof u));
            json_t *pr = json_array();
            for (int k = 0; k < nv.dev[i].nproc; k++) {
                tk_sb_addf(&text, "    process %u uses %s%s\n", nv.dev[i].proc[k].pid,
                           tk_format_bytes(nv.dev[i].proc[k].usedGpuMemory, a, sizeof a),
                           nv.dev[i].proc[k].pid == (unsigned)getpid() ? " (this kernel)" : "");
                json_array_append_new(pr, json_pack("{s:i, s:I}", "pid", (int)nv.dev[i].proc[k].pid, "used",
                                                    (json_int_t)nv.dev[i].proc[k].usedGpuMemory));
            }
            json_array_append_new(gpus, json_pack("{s:s, s:I, s:I, s:I, s:o}", "name", nv.dev[i].name, "total",
                                                  (json_int_t)nv.dev[i].total, "free", (json_int_t)nv.dev[i].free,
                                                  "used", (json_int_t)nv.dev[i].used, "processes", pr));
        }
        json_object_set_new(j, "nvml", json_pack("{s:s, s:i, s:o}", "driver", nv.driver, "cuda", nv.cuda_version,
                                                 "gpus", gpus));
        if (nv.ndev) tk_sb_add(&text, "(process ids are host pids inside containers)\n");
    } else {
        tk_sb_addf(&text, "%s\n", why);
        json_object_set_new(j, "nvml", json_null());
    }
    char *t = tk_sb_take(&text);
    tk_sb_add(&html, "<pre>");
    tk_sb_add_html(&html, t ? t : "");
    tk_sb_add(&html, "</pre>");
    json_t *bundle = tk_bundle_new(t ? t : "");
    free(t);
    tk_bundle_take(bundle, "text/html", tk_sb_take(&html));
    json_object_set_new(bundle, "application/json", j);
    return bundle;
}


json_t *tk_app_device(tk_session *s) {
    json_t *b = tk_device_report(tk_session_current_device(s), tk_session_config(s));
    tk_report_add_host_rss(b);
    tk_report_add_holder(b, tk_session_holder(s), 1);
    return b;
}

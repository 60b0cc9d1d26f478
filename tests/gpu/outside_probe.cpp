// Issue 47, research: where a PyTorch process's device memory goes outside
// the caching allocator. Every driver allocation, free, VMM handle and
// module load of the process, each with the library that asked for it (the
// first frame of its stack outside CUDA's own libraries), through CUPTI's
// callback API; the device's free memory (cuMemGetInfo) read after each,
// so a load's cost in device memory shows as the drop since the read
// before. Not part of the agent: tests/gpu/outside_probe.py loads it with
// ctypes before torch initialises CUDA and reads its tables at set points.
//
// Built by tests/gpu/outside_probe.sh against the CUPTI torch loads.

#include <cupti.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

typedef int (*MemGetInfo)(size_t*, size_t*);

std::mutex mu;
CUpti_SubscriberHandle sub = nullptr;
bool on = false;
MemGetInfo mem_get_info = nullptr;
size_t last_free = 0;

struct Live {
    size_t bytes;
    std::string lib;
    std::string what;
};
std::map<unsigned long long, Live> live;      // device or host pointer
std::map<unsigned long long, Live> handles;   // cuMemCreate handles
std::map<std::string, long long> held;        // "lib\twhat" -> live bytes
std::map<std::string, long long> drops;       // "lib\twhat" -> free-memory drop
std::map<std::string, long long> calls;       // "lib\twhat" -> calls
std::map<std::string, long long> rises;       // "lib\twhat" -> free memory gained at its calls (a drop below 0)
std::string first_error;

const char* base(const char* path) {
    const char* s = strrchr(path, '/');
    return s ? s + 1 : path;
}

// The first library on the stack that is not CUDA's (the driver, the
// runtime, CUPTI) nor this probe.
std::string caller() {
    void* frames[64];
    int n = backtrace(frames, 64);
    for (int i = 0; i < n; i++) {
        Dl_info info;
        if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
        const char* f = base(info.dli_fname);
        if (strstr(f, "libcupti") || strstr(f, "libcuda.so") || strstr(f, "libcudart") ||
            strstr(f, "outside_probe") || strstr(f, "libc.so") || strstr(f, "libstdc++"))
            continue;
        return f;
    }
    return "?";
}

// The free-memory drop since the last read (negative: memory came back).
long long drop() {
    if (!mem_get_info) return 0;
    size_t free_b = 0, total = 0;
    if (mem_get_info(&free_b, &total) != 0) return 0;
    long long d = (long long)last_free - (long long)free_b;
    if (last_free == 0) d = 0;
    last_free = free_b;
    return d;
}

void note(const std::string& lib, const std::string& what, long long bytes, long long d) {
    std::string k = lib + "\t" + what;
    held[k] += bytes;
    drops[k] += d;
    if (d < 0) rises[k] += -d;
    calls[k] += 1;
}

struct AllocParams {  // cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocAsync(_ptsz), cuMemAllocFromPoolAsync(_ptsz)
    unsigned long long* dptr;
    size_t bytesize;
};
struct PitchParams {  // cuMemAllocPitch_v2
    unsigned long long* dptr;
    size_t* pitch;
    size_t width;
    size_t height;
};
struct FreeParams {  // cuMemFree_v2, cuMemFreeAsync(_ptsz)
    unsigned long long dptr;
};
struct HostAllocParams {  // cuMemAllocHost_v2, cuMemHostAlloc
    void** pp;
    size_t bytesize;
};
struct HostFreeParams {  // cuMemFreeHost
    void* p;
};
struct CreateParams {  // cuMemCreate
    unsigned long long* handle;
    size_t size;
};
struct ReleaseParams {  // cuMemRelease
    unsigned long long handle;
};

void CUPTIAPI callback(void*, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void* data) {
    std::lock_guard<std::mutex> g(mu);
    if (!on) return;
    if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
        const CUpti_ResourceData* r = (const CUpti_ResourceData*)data;
        if (id == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
            const CUpti_ModuleResourceData* m = (const CUpti_ModuleResourceData*)r->resourceDescriptor;
            note(caller(), "module", m ? (long long)m->cubinSize : 0, drop());
        } else if (id == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
            note(caller(), "context", 0, drop());
        }
        return;
    }
    if (dom != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData* d = (const CUpti_CallbackData*)data;
    if (d->callbackSite != CUPTI_API_EXIT) return;
    if (d->functionReturnValue && *(const int*)d->functionReturnValue != 0) return;
    const char* fn = d->functionName ? d->functionName : "";
    const void* p = d->functionParams;
    std::string f(fn);
    if (f == "cuMemAlloc_v2" || f == "cuMemAllocManaged" || f.rfind("cuMemAllocAsync", 0) == 0 ||
        f.rfind("cuMemAllocFromPoolAsync", 0) == 0) {
        const AllocParams* a = (const AllocParams*)p;
        std::string what = f == "cuMemAlloc_v2" ? "cuMemAlloc" : f == "cuMemAllocManaged" ? "managed" : "async";
        std::string lib = caller();
        live[*a->dptr] = Live{a->bytesize, lib, what};
        note(lib, what, (long long)a->bytesize, drop());
    } else if (f == "cuMemAllocPitch_v2") {
        const PitchParams* a = (const PitchParams*)p;
        size_t bytes = *a->pitch * a->height;
        std::string lib = caller();
        live[*a->dptr] = Live{bytes, lib, "cuMemAlloc"};
        note(lib, "cuMemAlloc", (long long)bytes, drop());
    } else if (f == "cuMemFree_v2" || f.rfind("cuMemFreeAsync", 0) == 0) {
        const FreeParams* a = (const FreeParams*)p;
        auto it = live.find(a->dptr);
        if (it != live.end()) {
            note(it->second.lib, it->second.what, -(long long)it->second.bytes, drop());
            live.erase(it);
        }
    } else if (f == "cuMemAllocHost_v2" || f == "cuMemHostAlloc") {
        const HostAllocParams* a = (const HostAllocParams*)p;
        std::string lib = caller();
        live[(unsigned long long)*a->pp] = Live{a->bytesize, lib, "host"};
        note(lib, "host", (long long)a->bytesize, 0);
    } else if (f == "cuMemFreeHost") {
        const HostFreeParams* a = (const HostFreeParams*)p;
        auto it = live.find((unsigned long long)a->p);
        if (it != live.end()) {
            note(it->second.lib, "host", -(long long)it->second.bytes, 0);
            live.erase(it);
        }
    } else if (f == "cuMemCreate") {
        const CreateParams* a = (const CreateParams*)p;
        std::string lib = caller();
        handles[*a->handle] = Live{a->size, lib, "vmm"};
        note(lib, "vmm", (long long)a->size, drop());
    } else if (f == "cuMemRelease") {
        const ReleaseParams* a = (const ReleaseParams*)p;
        auto it = handles.find(a->handle);
        if (it != handles.end()) {
            note(it->second.lib, "vmm", -(long long)it->second.bytes, drop());
            handles.erase(it);
        }
    } else if (f.rfind("cuModuleLoad", 0) == 0 || f.rfind("cuLibraryLoad", 0) == 0) {
        note(caller(), "load-call", 0, drop());
    } else {
        // Every other enabled call: a drop in free memory there is named by
        // the call (a launch that loaded its module lazily, say).
        long long dd = drop();
        if (dd != 0) note(caller(), std::string("drop@") + fn, 0, dd);
    }
}

const char* WATCHED[] = {
    "cuMemAlloc_v2",        "cuMemAllocPitch_v2",       "cuMemAllocManaged",
    "cuMemAllocAsync",      "cuMemAllocAsync_ptsz",     "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz", "cuMemFree_v2",     "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",  "cuMemAllocHost_v2",        "cuMemHostAlloc",
    "cuMemFreeHost",        "cuMemCreate",              "cuMemRelease",
    "cuModuleLoad",         "cuModuleLoadData",         "cuModuleLoadDataEx",
    "cuModuleLoadFatBinary", "cuLibraryLoadData",       "cuLibraryLoadFromFile",
    "cuLaunchKernel",       "cuLaunchKernel_ptsz",      "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz", "cuCtxCreate_v2",          "cuDevicePrimaryCtxRetain",
    "cuStreamCreate",       "cuStreamCreateWithPriority", "cuEventCreate",
    "cuGraphInstantiateWithFlags", "cuGraphLaunch",     "cuGraphLaunch_ptsz",
    // What NCCL does with its peers (a two-rank job's unnamed 192 MiB).
    "cuMemImportFromShareableHandle", "cuMemExportToShareableHandle", "cuMemMap",
    "cuMemUnmap",           "cuMemAddressReserve",     "cuIpcOpenMemHandle_v2",
    "cuIpcGetMemHandle",    "cuMulticastCreate",       "cuMulticastBindMem",
    "cuMemSetAccess",       "cuEventCreate",           "cuMemHostRegister_v2",
};

}  // namespace

extern "C" {

// Subscribes (multi-subscriber mode where CUPTI has it) and enables the
// watched driver calls and module and context resources. 0 on success,
// else the CUPTI result; `why` gets a line.
int probe_start(char* why, int why_len) {
    std::lock_guard<std::mutex> g(mu);
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda) mem_get_info = (MemGetInfo)dlsym(cuda, "cuMemGetInfo_v2");
    CUptiResult r;
#if defined(PROBE_V2)
    // cuptiSubscribe_v2 (CUPTI 13): named, and (PROBE_MULTI, 13.2 on)
    // asking for multi-subscriber mode, beside torch.profiler's.
    CUpti_SubscriberParams params;
    memset(&params, 0, sizeof params);
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "vramscope outside probe";
    char old[256] = {0};
    params.oldSubscriberName = old;
    params.oldSubscriberSize = sizeof old;
#if defined(PROBE_MULTI)
    params.allowMultipleSubscribers = 1;
#endif
    r = cuptiSubscribe_v2(&sub, (CUpti_CallbackFunc)callback, nullptr, &params);
    if (r != CUPTI_SUCCESS) snprintf(why, why_len, "cuptiSubscribe_v2: %d (old: %s)", (int)r, old);
#else
    r = cuptiSubscribe(&sub, (CUpti_CallbackFunc)callback, nullptr);
    if (r != CUPTI_SUCCESS) snprintf(why, why_len, "cuptiSubscribe: %d", (int)r);
#endif
    if (r != CUPTI_SUCCESS) return (int)r;
    int enabled = 0;
    for (unsigned id = 1; id < 4096; id++) {
        const char* name = nullptr;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) != CUPTI_SUCCESS || !name)
            continue;
        for (const char* w : WATCHED) {
            if (strcmp(name, w) == 0) {
                if (cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id) == CUPTI_SUCCESS) enabled++;
            }
        }
    }
    cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
    cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    uint32_t version = 0;
    cuptiGetVersion(&version);
    snprintf(why, why_len, "CUPTI API %u, header %d, %d driver callbacks enabled%s", version,
             (int)CUPTI_API_VERSION, enabled,
#if defined(PROBE_MULTI)
             ", multi-subscriber asked"
#elif defined(PROBE_V2)
             ", subscribe_v2"
#else
             ""
#endif
    );
    on = true;
    return 0;
}

// Unsubscribes (the profiler's turn), or subscribes again.
int probe_stop() {
    std::lock_guard<std::mutex> g(mu);
    on = false;
    if (!sub) return 0;
    int r = (int)cuptiUnsubscribe(sub);
    sub = nullptr;
    return r;
}

// The tables as tab-separated lines (lib, what, live bytes, free-memory
// drop, calls, free memory gained: the drops below 0) into `out`; the bytes written (cut at `len`).
int probe_dump(char* out, int len) {
    std::lock_guard<std::mutex> g(mu);
    std::string s;
    char line[512];
    for (auto& kv : held) {
        snprintf(line, sizeof line, "%s\t%lld\t%lld\t%lld\t%lld\n", kv.first.c_str(), kv.second,
                 drops[kv.first], calls[kv.first], rises[kv.first]);
        s += line;
    }
    for (auto& kv : drops) {
        if (held.count(kv.first)) continue;
        snprintf(line, sizeof line, "%s\t0\t%lld\t%lld\t%lld\n", kv.first.c_str(), kv.second,
                 calls[kv.first], rises[kv.first]);
        s += line;
    }
    int n = (int)s.size() < len - 1 ? (int)s.size() : len - 1;
    memcpy(out, s.data(), n);
    out[n] = 0;
    return n;
}

// The device's free bytes now (and resets the drop baseline to it).
long long probe_free() {
    std::lock_guard<std::mutex> g(mu);
    if (!mem_get_info) return -1;
    size_t f = 0, t = 0;
    if (mem_get_info(&f, &t) != 0) return -1;
    last_free = f;
    return (long long)f;
}
}

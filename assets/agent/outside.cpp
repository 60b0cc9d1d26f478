// outside.cpp — the agent's accounting of device memory outside PyTorch's
// caching allocator (FORMAT.md, "Outside the caching allocator", 1.3).
// Built by vramscope/_build.py (build_outside) against the CUPTI torch
// itself loads, only where one is found, and loaded with ctypes beside the
// tracker (never dlclose'd).
//
// What it does:
//   * subscribes to CUPTI's callback API for the driver's allocation calls
//     (cuMemAlloc*, cuMemCreate/cuMemRelease, cuMemAllocAsync, managed and
//     pinned host memory and their frees), stream creation, module loads
//     (explicit, and the resource callback for lazily loaded ones);
//   * names each call by the library that made it: the first frame of its
//     stack outside CUDA's own libraries (libcuda, libcudart, libcupti),
//     classified from the mappings read at start (no lock), dladdr only for
//     a library loaded since. The caching allocator's own calls (libc10_cuda)
//     are the tracker's business and are not recorded;
//   * writes OUTSIDE_ALLOC and OUTSIDE_FREE for allocations (address and
//     bytes) into the agent ring through the tracker (vs_agent_write_record,
//     handed over at start), and OUTSIDE_TOTAL for what is measured rather
//     than allocated: the device memory a stream's creation or a module's
//     loading took, as the drop in the device's free memory
//     (cuMemGetInfo) across the call (streams, explicit loads), or since
//     the reading before (lazy loads: every recorded call, the caching
//     allocator's included, takes a reading); where another process
//     shares the device, the readings are NVML's bytes for this process
//     instead (free_now: another's allocations would move free memory);
//     a drop larger than 256 MiB is not counted, nor a rise (memory given
//     back by a call not followed);
//   * a thread sends every total again every 10 s (a reader that lost
//     records or began late has them), and within a second of records
//     left out;
//   * at most kRecordsPerSecond records a second (after a burst of as
//     many): past it a call is still followed (the totals stay true) but
//     not written; what is left out or refused is counted in DROPPED
//     `what` 8, sent when it changes, at most once a second.
//
// The context is measured by the Python side when it starts this (NVML's
// bytes for the process − the allocator's reserved − what is named here)
// and handed over with vs_outside_context: as the context where this was
// subscribed as CUDA started (nothing else can have taken memory yet), as
// "before the accounting" (kind 9) where it started later (a tracker
// built while the job ran, an attach): then libraries' memory from before
// is in it too, and is not called the context.
//
// CUPTI takes one client at a time before CUPTI 13.2: torch.profiler's
// Kineto cannot start while this is subscribed, and keeps CUPTI once it has
// run. The Python side calls vs_outside_stop before a profile starts and
// vs_outside_start again after it; when that fails it says so. Built
// against CUPTI 13.2 or later, this subscribes with multiple subscribers
// allowed (cuptiSubscribe_v2's allowMultipleSubscribers): where the
// profiler's client asks for it too, coming back after a profile works.
//
// Bounded: at most kMaxLive allocations followed (more are counted as
// refused), kMaxTotals totals, 8 devices; never throws into the caller.

#include <cupti.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "vramscope_ring.h"

namespace {

typedef int (*WriteFn)(const uint64_t*);
typedef int (*MemGetInfoFn)(size_t*, size_t*);
typedef int (*CtxGetDeviceFn)(int*);
struct NvmlProc {  // nvmlProcessInfo_t (v2)
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
};
typedef int (*NvmlProcsFn)(void*, unsigned int*, NvmlProc*);

constexpr size_t kMaxLive = 65536;
constexpr double kRecordsPerSecond = 10000;
constexpr size_t kMaxTotals = 512;
constexpr long long kMaxDrop = 256ll << 20;
// A reading on a shared device is kShared - NVML's bytes for this process:
// it falls as the process takes memory, as free memory does, and is so far
// from any device's free memory that a difference between a reading of
// each kind is out of bounds (over kMaxDrop, or a rise) and never counted.
constexpr size_t kShared = size_t{1} << 62;

struct Lib {
  uint64_t lo, hi;
  std::string name;
};

struct Live {
  uint16_t device;
  uint8_t lib, kind;
  uint64_t bytes;
  char name[24];
};

struct TotalKey {
  uint16_t device;
  uint8_t lib, kind;
  bool operator<(const TotalKey& o) const {
    return std::tie(device, lib, kind) < std::tie(o.device, o.lib, o.kind);
  }
};

struct Total {
  long long bytes = 0;
  char name[24] = {0};
};

// Everything below but the free-memory readings; taken in the callbacks of
// calls other libraries make, and by the thread (briefly): never in a call
// of the caching allocator's own, which only updates a reading.
std::mutex g_mu;
CUpti_SubscriberHandle g_sub = nullptr;
bool g_shared = false;  // subscribed with multiple subscribers allowed
std::atomic<int> g_on{0};
WriteFn g_write = nullptr;
[[maybe_unused]] MemGetInfoFn g_mem_get_info = nullptr;  // (the test build has stand-ins)
[[maybe_unused]] CtxGetDeviceFn g_ctx_get_device = nullptr;
std::vector<Lib> g_libs;                           // executable mappings at start
std::unordered_map<uint64_t, Live> g_live;         // device pointer or handle
std::map<TotalKey, Total> g_totals;
// The (device, library, kind) of every allocation followed (at most
// kMaxTotals): a total is sent for each, 0 once all are freed.
std::map<TotalKey, std::array<char, 24>> g_alloc_keys;
uint64_t g_dropped_sent = 0;  // the DROPPED count last sent
std::atomic<size_t> g_last_free[8];                // per device, 0: no reading
std::atomic<int> g_alone[8];                       // per device: this process is its only one (NVML)
std::atomic<void*> g_nvml_device[8];               // per device: its NVML handle (null: unknown)
[[maybe_unused]] std::atomic<NvmlProcsFn> g_nvml_procs{nullptr};  // nvmlDeviceGetComputeRunningProcesses_v3
std::atomic<int> g_in_flight[8];                   // per device: followed calls between entry and exit
thread_local size_t t_enter_free = 0;              // at a stream creation's entry
std::atomic<uint64_t> g_refused{0};  // past a bound, or left out by the rate
// The rate's bucket (under g_mu): records it may write now, and when it
// was last filled; whether a record was left out since the totals were
// last sent.
double g_tokens = kRecordsPerSecond;
uint64_t g_filled_ns = 0;
bool g_left_out = false;
std::atomic<int> g_thread{0};

const char* base(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}

void read_maps() {
  g_libs.clear();
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {0};
    int off = 0;
    if (std::sscanf(line, "%llx-%llx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) < 3) continue;
    if (perms[2] != 'x' || off <= 0) continue;
    char* path = line + off;
    path[std::strcspn(path, "\n")] = 0;
    if (path[0] != '/') continue;
    g_libs.push_back(Lib{lo, hi, base(path)});
  }
  std::fclose(f);
  std::sort(g_libs.begin(), g_libs.end(), [](const Lib& a, const Lib& b) { return a.lo < b.lo; });
}

// The file name of the library holding `pc`: from the mappings read at
// start, else dladdr (a library loaded since).
[[maybe_unused]] std::string lib_of(void* pc) {
  uint64_t a = reinterpret_cast<uint64_t>(pc);
  auto it = std::upper_bound(g_libs.begin(), g_libs.end(), a, [](uint64_t v, const Lib& l) { return v < l.lo; });
  if (it != g_libs.begin()) {
    --it;
    if (a < it->hi) return it->name;
  }
  Dl_info info;
  if (dladdr(pc, &info) && info.dli_fname) return base(info.dli_fname);
  return "";
}

[[maybe_unused]] bool cuda_own(const std::string& f) {
  return f.rfind("libcupti", 0) == 0 || f.rfind("libcuda.so", 0) == 0 || f.rfind("libcudart", 0) == 0 ||
         f.find("outside") != std::string::npos || f.rfind("libc.so", 0) == 0 ||
         f.rfind("libstdc++", 0) == 0 || f.rfind("libgcc", 0) == 0;
}

uint8_t lib_code(const std::string& f) {
  auto has = [&](const char* p) { return f.find(p) != std::string::npos; };
  if (has("libnccl")) return VS_LIB_NCCL;
  if (has("libcublas")) return VS_LIB_CUBLAS;
  if (has("libcudnn")) return VS_LIB_CUDNN;
  if (has("libcufft")) return VS_LIB_CUFFT;
  if (has("triton") || has("cuda_utils") || has("__triton_launcher")) return VS_LIB_TRITON;
  if (has("libnvinfer")) return VS_LIB_TENSORRT;
  if (has("cupy")) return VS_LIB_CUPY;
  if (has("libtorch") || has("libc10")) return VS_LIB_TORCH;
  return VS_LIB_OTHER;
}

// The caching allocator's own device memory: the tracker's business.
bool torch_allocator(const std::string& f) { return f.rfind("libc10_cuda", 0) == 0; }

#ifdef VS_OUTSIDE_TEST
// The test's stand-ins (tests/agent_cpp/outside_test.cpp): the library on
// the stack, the current device and its free memory.
std::string vs_test_caller;
int vs_test_device = 0;
size_t vs_test_free = 0;
std::string caller() { return vs_test_caller; }
int current_device() { return vs_test_device; }
uint64_t vs_test_used = 0;
size_t device_free() { return vs_test_free; }
uint64_t nvml_used(int) { return vs_test_used; }
#else
// The library that made the call: the first frame outside CUDA's own.
std::string caller() {
  void* frames[24];
  int n = backtrace(frames, 24);
  for (int i = 0; i < n; i++) {
    std::string f = lib_of(frames[i]);
    if (f.empty() || cuda_own(f)) continue;
    return f;
  }
  return "";
}

int current_device() {
  int d = 0;
  if (!g_ctx_get_device || g_ctx_get_device(&d) != 0 || d < 0 || d >= 8) return -1;
  return d;
}

size_t device_free() {
  size_t f = 0, t = 0;
  if (!g_mem_get_info || g_mem_get_info(&f, &t) != 0) return 0;
  return f;
}

// NVML's bytes for this process on `dev` (0: unknown: no handle, NVML
// failing or listing more than 256 processes, or not this pid).
uint64_t nvml_used(int dev) {
  void* h = g_nvml_device[dev].load(std::memory_order_relaxed);
  NvmlProcsFn procs_of = g_nvml_procs.load(std::memory_order_acquire);
  if (!h || !procs_of) return 0;
  NvmlProc procs[256];
  unsigned int n = 256;
  if (procs_of(h, &n, procs) != 0) return 0;
  const unsigned int me = static_cast<unsigned int>(getpid());
  for (unsigned int i = 0; i < n && i < 256; i++)
    if (procs[i].pid == me) return procs[i].used == ~0ull ? 0 : procs[i].used;
  return 0;
}
#endif

// A reading of what `dev` has free, for this process's drops: the device's
// free memory where NVML lists this process alone there; where it shares
// the device (another process's allocations move that figure too),
// kShared - NVML's bytes for this process. 0: no reading.
size_t free_now(int dev) {
  if (dev < 0) return 0;
  if (g_alone[dev].load(std::memory_order_relaxed)) return device_free();
  const uint64_t used = nvml_used(dev);
  return used == 0 || used >= kShared ? 0 : static_cast<size_t>(kShared - used);
}

void put_name(char out[24], const std::string& s) {
  std::memset(out, 0, 24);
  std::memcpy(out, s.data(), std::min<size_t>(24, s.size()));
}

// One record written as is. Under g_mu.
void put(uint16_t kind, uint16_t device, uint8_t lib, uint8_t what, uint64_t addr, uint64_t bytes,
         const char name[24], uint64_t now) {
  char z[25] = {0};
  std::memcpy(z, name, 24);
  uint64_t w[7];
  vs_rec_outside(w, kind, now, device, lib, what, addr, bytes, z);
  g_write(w);
}

// One record through the rate (left out and counted past it). Under g_mu.
void write(uint16_t kind, uint16_t device, uint8_t lib, uint8_t what, uint64_t addr, uint64_t bytes,
           const char name[24]) {
  if (!g_write) return;
  const uint64_t now = vs_monotonic_ns();
  if (g_filled_ns != 0 && now > g_filled_ns)
    g_tokens = std::min(kRecordsPerSecond, g_tokens + (now - g_filled_ns) * 1e-9 * kRecordsPerSecond);
  g_filled_ns = now;
  if (g_tokens < 1) {
    g_refused.fetch_add(1);
    g_left_out = true;
    return;
  }
  g_tokens -= 1;
  put(kind, device, lib, what, addr, bytes, name, now);
}

// A drop in free memory measured for (device, library, kind): added to its
// total, sent at once. Only a drop: free memory that rose meanwhile was
// given back by a call not followed (cuMemUnmap, a module unloaded, a
// stream destroyed), not by a stream's creation or a module's loading, and
// taking it off their totals would hide what they hold.
void add_total(int device, uint8_t lib, const std::string& f, uint8_t what, long long drop) {
  if (device < 0 || drop <= 0 || drop > kMaxDrop) return;
  TotalKey k{static_cast<uint16_t>(device), lib, what};
  auto it = g_totals.find(k);
  if (it == g_totals.end()) {
    if (g_totals.size() >= kMaxTotals) {
      g_refused.fetch_add(1);
      return;
    }
    it = g_totals.emplace(k, Total{}).first;
    put_name(it->second.name, f);
  }
  it->second.bytes += drop;
  write(VS_K_OUTSIDE_TOTAL, k.device, k.lib, k.kind, 0, static_cast<uint64_t>(it->second.bytes), it->second.name);
}

void add_total(int device, const std::string& f, uint8_t what, long long drop) {
  add_total(device, lib_code(f), f, what, drop);
}

// As a followed call begins on `dev`, with free memory `fr`: what free
// memory lost since the last reading was taken by no call followed: local
// memory the driver grew for a launch (NCCL's kernels: 190 MiB a rank on
// an H200), code loaded lazily at a launch, a graph instantiated. It is
// the driver's, named CUDA kernels. Counted only while no other followed
// call is under way on the device (its memory may be gone before its
// reading); on a shared device the readings are NVML's for this process
// (free_now), so another process's allocation is not counted.
void between(int dev, size_t fr) {
  if (dev < 0) return;
  const bool others = g_in_flight[dev].fetch_add(1) > 0;
  if (fr == 0) return;
  const size_t before = g_last_free[dev].exchange(fr, std::memory_order_relaxed);
  if (before == 0 || others) return;
  std::lock_guard<std::mutex> g(g_mu);
  add_total(dev, VS_LIB_CUDA, "libcuda.so", VS_OUT_KERNELS,
            static_cast<long long>(before) - static_cast<long long>(fr));
}

// A followed call on `dev` ended (never below 0: one that began before the
// subscription was not counted in).
void call_ended(int dev) {
  if (dev < 0) return;
  int n = g_in_flight[dev].load();
  while (n > 0 && !g_in_flight[dev].compare_exchange_weak(n, n - 1)) {
  }
}

struct Ptr1 {  // cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync (+_ptsz)
  unsigned long long* dptr;
  size_t bytesize;
};
struct Pitch {  // cuMemAllocPitch_v2
  unsigned long long* dptr;
  size_t* pitch;
  size_t width;
  size_t height;
};
struct Free1 {  // cuMemFree_v2, cuMemFreeAsync (+_ptsz)
  unsigned long long dptr;
};
struct Host1 {  // cuMemAllocHost_v2, cuMemHostAlloc
  void** pp;
  size_t bytesize;
};
struct HostFree {  // cuMemFreeHost
  void* p;
};
struct Create {  // cuMemCreate
  unsigned long long* handle;
  size_t size;
};
struct Release {  // cuMemRelease
  unsigned long long handle;
};

// A reading of `device`'s free memory after a call that changed it: the
// baseline the next lazy module load is measured from.
void reading(int dev) {
  if (dev >= 0) g_last_free[dev].store(free_now(dev), std::memory_order_relaxed);
}

void on_alloc(const std::string& f, int dev, uint64_t key, uint64_t bytes, uint8_t what, bool host) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_live.size() >= kMaxLive && !g_live.count(key)) {
    g_refused.fetch_add(1);
    return;
  }
  Live l{static_cast<uint16_t>(host ? VS_NO_DEVICE : (dev < 0 ? 0 : dev)), lib_code(f), what, bytes, {0}};
  put_name(l.name, f);
  g_live[key] = l;
  TotalKey k{l.device, l.lib, l.kind};
  if (g_alloc_keys.size() < kMaxTotals && !g_alloc_keys.count(k))
    std::memcpy(g_alloc_keys[k].data(), l.name, sizeof l.name);
  write(VS_K_OUTSIDE_ALLOC, l.device, l.lib, l.kind, key, bytes, l.name);
}

void on_free(uint64_t key) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_live.find(key);
  if (it == g_live.end()) return;
  const Live& l = it->second;
  write(VS_K_OUTSIDE_FREE, l.device, l.lib, l.kind, key, l.bytes, l.name);
  g_live.erase(it);
}

void CUPTIAPI callback(void*, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void* data) {
  if (g_on.load(std::memory_order_acquire) == 0) return;
  try {
    if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
      if (id != CUPTI_CBID_RESOURCE_MODULE_LOADED) return;
      // A module loaded (lazily, in a launch, or explicitly): what free
      // memory lost since the last reading.
      int dev = current_device();
      if (dev < 0) return;
      size_t fr = free_now(dev);
      size_t before = g_last_free[dev].exchange(fr, std::memory_order_relaxed);
      if (before != 0 && fr != 0) {
        std::string f = caller();
        std::lock_guard<std::mutex> g(g_mu);
        add_total(dev, f, VS_OUT_KERNELS, static_cast<long long>(before) - static_cast<long long>(fr));
      }
      return;
    }
    if (dom != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData* d = static_cast<const CUpti_CallbackData*>(data);
    const char* fn = d->functionName ? d->functionName : "";
    const bool stream = std::strncmp(fn, "cuStreamCreate", 14) == 0;
    const bool host = !std::strcmp(fn, "cuMemAllocHost_v2") || !std::strcmp(fn, "cuMemHostAlloc") ||
                      !std::strcmp(fn, "cuMemFreeHost");
    if (d->callbackSite == CUPTI_API_ENTER) {
      if (host) return;
      const int dev = current_device();
      const size_t fr = free_now(dev);
      if (stream) t_enter_free = fr;
      between(dev, fr);
      return;
    }
    const int dev = current_device();
    if (!host) call_ended(dev);
    if (d->functionReturnValue && *static_cast<const int*>(d->functionReturnValue) != 0) {
      if (!host) reading(dev);
      return;
    }
    const void* p = d->functionParams;
    const std::string f = caller();
    if (stream) {
      size_t fr = free_now(dev);
      if (dev >= 0) g_last_free[dev].store(fr, std::memory_order_relaxed);
      if (t_enter_free != 0 && fr != 0 && !f.empty()) {
        std::lock_guard<std::mutex> g(g_mu);
        add_total(dev, f, VS_OUT_STREAMS, static_cast<long long>(t_enter_free) - static_cast<long long>(fr));
      }
      return;
    }
    if (!host) reading(dev);
    // The caching allocator's own memory is the tracker's: only the
    // reading above.
    if (f.empty() || torch_allocator(f)) return;
    if (!std::strcmp(fn, "cuMemAlloc_v2")) {
      auto a = static_cast<const Ptr1*>(p);
      on_alloc(f, dev, *a->dptr, a->bytesize, VS_OUT_ALLOCATION, false);
    } else if (!std::strcmp(fn, "cuMemAllocManaged")) {
      auto a = static_cast<const Ptr1*>(p);
      on_alloc(f, dev, *a->dptr, a->bytesize, VS_OUT_MANAGED, false);
    } else if (!std::strncmp(fn, "cuMemAllocAsync", 15) || !std::strncmp(fn, "cuMemAllocFromPoolAsync", 23)) {
      auto a = static_cast<const Ptr1*>(p);
      on_alloc(f, dev, *a->dptr, a->bytesize, VS_OUT_STREAM_ORDERED, false);
    } else if (!std::strcmp(fn, "cuMemAllocPitch_v2")) {
      auto a = static_cast<const Pitch*>(p);
      on_alloc(f, dev, *a->dptr, *a->pitch * a->height, VS_OUT_ALLOCATION, false);
    } else if (!std::strcmp(fn, "cuMemAllocHost_v2") || !std::strcmp(fn, "cuMemHostAlloc")) {
      auto a = static_cast<const Host1*>(p);
      on_alloc(f, dev, reinterpret_cast<uint64_t>(*a->pp), a->bytesize, VS_OUT_HOST, true);
    } else if (!std::strcmp(fn, "cuMemCreate")) {
      auto a = static_cast<const Create*>(p);
      on_alloc(f, dev, *a->handle, a->size, VS_OUT_PHYSICAL, false);
    } else if (!std::strcmp(fn, "cuMemFree_v2") || !std::strncmp(fn, "cuMemFreeAsync", 14)) {
      on_free(static_cast<const Free1*>(p)->dptr);
    } else if (!std::strcmp(fn, "cuMemFreeHost")) {
      on_free(reinterpret_cast<uint64_t>(static_cast<const HostFree*>(p)->p));
    } else if (!std::strcmp(fn, "cuMemRelease")) {
      on_free(static_cast<const Release*>(p)->handle);
    }
  } catch (...) {
    // Never into the driver's caller.
  }
}

const char* kWatched[] = {
    "cuMemAlloc_v2",         "cuMemAllocPitch_v2",      "cuMemAllocManaged",     "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",  "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFree_v2",          "cuMemFreeAsync",          "cuMemFreeAsync_ptsz",   "cuMemAllocHost_v2",
    "cuMemHostAlloc",        "cuMemFreeHost",           "cuMemCreate",           "cuMemRelease",
    "cuStreamCreate",        "cuStreamCreateWithPriority",
};

// Every total again every 10 s: a reader that lost records or began late
// has them (allocations' totals summed from what is live).
// Sends every total (each allocation kind's summed from what is live, 0
// for one emptied since), written as is (not through the rate), and the
// count of what was dropped when it changed. Under g_mu.
void resend() {
  if (!g_write) return;
  std::map<TotalKey, std::pair<uint64_t, const char*>> sums;
  for (auto& kv : g_alloc_keys) sums[kv.first] = {0, kv.second.data()};
  for (auto& kv : g_live) {
    const Live& l = kv.second;
    auto& s = sums[TotalKey{l.device, l.lib, l.kind}];
    s.first += l.bytes;
    s.second = l.name;
  }
  g_left_out = false;
  const uint64_t now = vs_monotonic_ns();
  for (auto& kv : sums)
    put(VS_K_OUTSIDE_TOTAL, kv.first.device, kv.first.lib, kv.first.kind, 0, kv.second.first, kv.second.second, now);
  for (auto& kv : g_totals)
    put(VS_K_OUTSIDE_TOTAL, kv.first.device, kv.first.lib, kv.first.kind, 0, static_cast<uint64_t>(kv.second.bytes),
        kv.second.name, now);
  const uint64_t dropped = g_refused.load();
  if (dropped != g_dropped_sent) {
    uint64_t w[7];
    vs_rec_dropped(w, VS_NO_DEVICE, VS_DROP_OUTSIDE, now, dropped, 0);
    g_write(w);
    g_dropped_sent = dropped;
  }
}

// Every second: the totals again where records were left out, or 10 s
// went by.
void resend_loop() {
  for (unsigned tick = 1; g_thread.load() != 0; tick++) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (g_on.load() == 0) continue;
    try {
      std::lock_guard<std::mutex> g(g_mu);
      if (g_left_out || tick % 10 == 0 || g_refused.load() != g_dropped_sent) resend();
    } catch (...) {
    }
  }
}

// Whether CUPTI's subscriber parameters have allowMultipleSubscribers
// (CUPTI 13.2 and later).
template <typename P, typename = void>
struct HasMulti : std::false_type {};
template <typename P>
struct HasMulti<P, std::void_t<decltype(std::declval<P&>().allowMultipleSubscribers)>> : std::true_type {};

// cuptiSubscribe_v2 with multiple subscribers allowed, where this CUPTI has
// it (`*shared` then true); else the one-client cuptiSubscribe.
#if defined(CUPTI_API_VERSION) && CUPTI_API_VERSION >= 130000
template <typename P = CUpti_SubscriberParams>
CUptiResult subscribe(CUpti_SubscriberHandle* sub, CUpti_CallbackFunc f, bool* shared) {
  *shared = false;
  if constexpr (HasMulti<P>::value) {
    P p{};
    p.structSize = sizeof p;
    p.subscriberName = "vramscope";
    p.allowMultipleSubscribers = 1;
    CUptiResult r = cuptiSubscribe_v2(sub, f, nullptr, &p);
    *shared = r == CUPTI_SUCCESS;
    return r;
  } else {
    return cuptiSubscribe(sub, f, nullptr);
  }
}
#else
CUptiResult subscribe(CUpti_SubscriberHandle* sub, CUpti_CallbackFunc f, bool* shared) {
  *shared = false;
  return cuptiSubscribe(sub, f, nullptr);
}
#endif

}  // namespace

extern "C" {

int vs_outside_api_version(void) { return 4; }

// Whether this process is the only one on `device` (NVML's processes, read
// by the Python side every second): the device's free memory is read only
// then; else NVML's bytes for this process (free_now).
void vs_outside_alone(int device, int alone) {
  if (device >= 0 && device < 8) g_alone[device].store(alone ? 1 : 0, std::memory_order_relaxed);
}

// `device`'s NVML handle (nvmlDevice_t, from the Python side, which has
// initialised NVML in this process): readings on a shared device ask NVML
// for this process's bytes. Without one, nothing is measured there while
// it is shared.
void vs_outside_nvml_device(int device, void* handle) {
  if (device < 0 || device >= 8) return;
#ifndef VS_OUTSIDE_TEST
  if (!g_nvml_procs.load()) {
    void* nv = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (nv) g_nvml_procs.store(reinterpret_cast<NvmlProcsFn>(dlsym(nv, "nvmlDeviceGetComputeRunningProcesses_v3")));
  }
#endif
  g_nvml_device[device].store(handle, std::memory_order_relaxed);
}

// 1 when subscribed with multiple subscribers allowed (CUPTI 13.2+): a
// profiler that asks for it too can run beside this, and this comes back
// after it; 0 otherwise.
int vs_outside_shared(void) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_sub && g_shared ? 1 : 0;
}

// Subscribes to CUPTI (a name in `why` on failure: another client holds
// it) and enables the calls above; `write` is the tracker's
// vs_agent_write_record. 0 on success, else CUPTI's result (-1: bad
// arguments, -2: libcuda not found).
int vs_outside_start(WriteFn write, char* why, int why_len) {
  try {
    std::lock_guard<std::mutex> g(g_mu);
    if (why && why_len > 0) why[0] = 0;
    if (!write) return -1;
    g_write = write;
#ifndef VS_OUTSIDE_TEST
    if (!g_mem_get_info) {
      void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
      if (!cuda) cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      if (!cuda) return -2;
      g_mem_get_info = reinterpret_cast<MemGetInfoFn>(dlsym(cuda, "cuMemGetInfo_v2"));
      g_ctx_get_device = reinterpret_cast<CtxGetDeviceFn>(dlsym(cuda, "cuCtxGetDevice"));
      if (!g_mem_get_info || !g_ctx_get_device) return -2;
    }
#endif
    if (g_sub) return 0;
    read_maps();
    CUptiResult r = subscribe(&g_sub, reinterpret_cast<CUpti_CallbackFunc>(callback), &g_shared);
    if (r != CUPTI_SUCCESS) {
      g_sub = nullptr;
      const char* s = nullptr;
      cuptiGetResultString(r, &s);
      if (why && why_len > 0) std::snprintf(why, why_len, "%s", s ? s : "CUPTI refused a subscriber");
      return static_cast<int>(r);
    }
    for (unsigned id = 1; id < 4096; id++) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) != CUPTI_SUCCESS || !name) continue;
      for (const char* w : kWatched)
        if (!std::strcmp(name, w)) cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
    }
    cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
    // Readings start now: what happens before is the context's.
    for (auto& f : g_last_free) f.store(0);
    for (auto& n : g_in_flight) n.store(0);
    g_on.store(1, std::memory_order_release);
    if (g_thread.exchange(1) == 0) std::thread(resend_loop).detach();
    return 0;
  } catch (...) {
    return -1;
  }
}

// Steps aside (another CUPTI client, torch.profiler, needs it): 0 on success.
int vs_outside_stop(void) {
  try {
    g_on.store(0, std::memory_order_release);
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_sub) return 0;
    CUptiResult r = cuptiUnsubscribe(g_sub);
    g_sub = nullptr;
    return static_cast<int>(r);
  } catch (...) {
    return -1;
  }
}

// What `device` held outside the allocator when the accounting began,
// measured by the caller, sent as a total of `kind`: VS_OUT_CONTEXT (it
// began as CUDA started) or VS_OUT_BEFORE (it began later); other kinds
// are ignored.
void vs_outside_context(int device, uint64_t bytes, int kind) {
  try {
    std::lock_guard<std::mutex> g(g_mu);
    if (device < 0 || device >= 8 || !g_write) return;
    if (kind != VS_OUT_CONTEXT && kind != VS_OUT_BEFORE) return;
    TotalKey k{static_cast<uint16_t>(device), VS_LIB_CUDA, static_cast<uint8_t>(kind)};
    Total& t = g_totals[k];
    t.bytes = static_cast<long long>(bytes);
    write(VS_K_OUTSIDE_TOTAL, k.device, k.lib, k.kind, 0, bytes, t.name);
  } catch (...) {
  }
}

// The bytes named on `device` now (allocations and totals; the context,
// or what was there before, left out): what the caller takes off NVML's
// figure to measure it.
uint64_t vs_outside_named(int device) {
  try {
    std::lock_guard<std::mutex> g(g_mu);
    long long s = 0;
    for (auto& kv : g_live)
      if (kv.second.device == device) s += static_cast<long long>(kv.second.bytes);
    for (auto& kv : g_totals)
      if (kv.first.device == device && kv.first.kind != VS_OUT_CONTEXT && kv.first.kind != VS_OUT_BEFORE)
        s += kv.second.bytes;
    return s > 0 ? static_cast<uint64_t>(s) : 0;
  } catch (...) {
    return 0;
  }
}

// Records refused (past the bounds).
uint64_t vs_outside_refused(void) { return g_refused.load(); }

}  // extern "C"

// outside.cpp without a GPU (tests/agent_cpp.rs): built with
// -DVS_OUTSIDE_TEST against the stand-in CUPTI (fake_cupti/cupti.h), whose
// kept callback this calls as CUPTI would, with the library on the stack,
// the device and its free memory set by hand; the records outside.cpp
// writes are checked word by word (FORMAT.md, "Outside the caching
// allocator"). Prints "ok WHAT" per check; exits 1 at the first failure.

#define VS_OUTSIDE_TEST 1
#include "outside.cpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::vector<std::array<uint64_t, 7>> recs;

int keep(const uint64_t* w) {
  std::array<uint64_t, 7> a;
  std::memcpy(a.data(), w, sizeof a);
  recs.push_back(a);
  return 1;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL %s (%zu records)\n", what, recs.size());
    std::exit(1);
  }
  std::printf("ok %s\n", what);
}

void call(const char* fn, const void* params, int rc = 0, CUpti_ApiCallbackSite site = CUPTI_API_EXIT) {
  CUpti_CallbackData d{site, fn, params, &rc};
  fake_cupti_callback(nullptr, CUPTI_CB_DOMAIN_DRIVER_API, 1, &d);
}

void loaded() {
  fake_cupti_callback(nullptr, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, nullptr);
}

uint16_t kind(const std::array<uint64_t, 7>& w) { return static_cast<uint16_t>(w[0]); }
uint16_t device(const std::array<uint64_t, 7>& w) { return static_cast<uint16_t>(w[0] >> 16); }
uint32_t aux(const std::array<uint64_t, 7>& w) { return static_cast<uint32_t>(w[0] >> 32); }
std::string name(const std::array<uint64_t, 7>& w) {
  char b[25] = {0};
  std::memcpy(b, &w[4], 24);
  return b;
}

constexpr uint64_t MIB = 1ull << 20;

}  // namespace

int main() {
  char why[128];
  check(vs_outside_start(keep, why, sizeof why) == 0, "starts");
  check(fake_cupti_subscribers == 1 && fake_cupti_enabled >= 7, "subscribes and enables the calls it follows");

  vs_test_caller = "libnccl.so.2";
  vs_test_device = 1;
  unsigned long long handle = 0xabc;
  Create create{&handle, 64 * MIB};
  call("cuMemCreate", &create);
  check(recs.size() == 1 && kind(recs[0]) == VS_K_OUTSIDE_ALLOC && device(recs[0]) == 1 &&
            aux(recs[0]) == (VS_LIB_NCCL | VS_OUT_PHYSICAL << 8) && recs[0][2] == 0xabc &&
            recs[0][3] == 64 * MIB && name(recs[0]) == "libnccl.so.2",
        "NCCL's physical memory is named, with its handle and bytes");
  Release release{0xabc};
  call("cuMemRelease", &release);
  check(recs.size() == 2 && kind(recs[1]) == VS_K_OUTSIDE_FREE && recs[1][3] == 64 * MIB,
        "its release frees the bytes it held");

  vs_test_caller = "libc10_cuda.so";
  vs_test_device = 0;
  unsigned long long p = 0x7f0000000000ull;
  Ptr1 alloc{&p, 2 * MIB};
  call("cuMemAlloc_v2", &alloc);
  check(recs.size() == 2, "the caching allocator's own memory is the tracker's: no record");

  vs_test_caller = "libcublas.so.13";
  call("cuMemAlloc_v2", &alloc, /*CUDA_ERROR_OUT_OF_MEMORY*/ 2);
  check(recs.size() == 2, "a failed call is not recorded");
  p = 0x7f1000000000ull;
  Ptr1 ws{&p, 32 * MIB};
  call("cuMemAlloc_v2", &ws);
  check(recs.size() == 3 && aux(recs[2]) == (VS_LIB_CUBLAS | VS_OUT_ALLOCATION << 8) && device(recs[2]) == 0,
        "a cuBLAS workspace is named");

  vs_test_caller = "libcudnn_graph.so.9";
  void* host = reinterpret_cast<void*>(0x5500);
  Host1 h{&host, 4096};
  call("cuMemHostAlloc", &h);
  check(recs.size() == 4 && device(recs[3]) == VS_NO_DEVICE && aux(recs[3]) == (VS_LIB_CUDNN | VS_OUT_HOST << 8),
        "pinned host memory is the host's (device 0xffff)");

  // A stream's creation: what free memory lost across the call (the
  // process alone on the device: its free memory is read).
  vs_outside_alone(0, 1);
  vs_test_free = 100 * MIB;
  call("cuStreamCreate", nullptr, 0, CUPTI_API_ENTER);
  vs_test_free = 98 * MIB;
  call("cuStreamCreate", nullptr);
  check(recs.size() == 5 && kind(recs[4]) == VS_K_OUTSIDE_TOTAL &&
            aux(recs[4]) == (VS_LIB_CUDNN | VS_OUT_STREAMS << 8) && recs[4][3] == 2 * MIB,
        "a stream's creation is measured and sent as a total");

  // A lazily loaded module: the drop since the last reading (the stream's).
  vs_test_caller = "libtorch_cuda.so";
  vs_test_free = 90 * MIB;
  loaded();
  check(recs.size() == 6 && aux(recs[5]) == (VS_LIB_TORCH | VS_OUT_KERNELS << 8) && recs[5][3] == 8 * MIB,
        "a module's loading is measured since the last reading");
  // Another process's gigabyte between two readings is not a module's.
  vs_test_free = 90 * MIB - 1024 * MIB;
  loaded();
  check(recs.size() == 6, "a drop over 256 MiB is not counted");
  // Memory given back by a call not followed (a cuMemUnmap) before the
  // next module: not taken off the kernels' total.
  vs_test_free += 40 * MIB;
  loaded();
  check(recs.size() == 6, "free memory that rose before a module's loading is not taken off its total");
  call("cuStreamCreate", nullptr, 0, CUPTI_API_ENTER);
  vs_test_free += 4 * MIB;
  call("cuStreamCreate", nullptr);
  check(recs.size() == 6, "nor free memory that rose across a stream's creation");
  vs_test_free -= 44 * MIB;

  // The caller measures the context and hands it over.
  vs_outside_context(0, 500 * MIB, VS_OUT_CONTEXT);
  check(recs.size() == 7 && aux(recs[6]) == (VS_LIB_CUDA | VS_OUT_CONTEXT << 8) && recs[6][3] == 500 * MIB,
        "the context is sent as a total");
  // A device the accounting began on late: what it held then, not called
  // the context.
  vs_outside_context(1, 700 * MIB, VS_OUT_BEFORE);
  check(recs.size() == 8 && aux(recs[7]) == (VS_LIB_CUDA | VS_OUT_BEFORE << 8) && recs[7][3] == 700 * MIB &&
            device(recs[7]) == 1,
        "what a device held before a late start is sent as its own kind");
  vs_outside_context(1, 9 * MIB, VS_OUT_KERNELS);
  check(recs.size() == 8, "no other kind is taken as measured at the start");
  check(vs_outside_named(0) == 32 * MIB + 2 * MIB + 8 * MIB,
        "named on device 0: the workspace, the stream and the kernels, not the context");
  check(vs_outside_named(1) == 0, "named on device 1: nothing (what was there before is left out)");

  // Memory taken between followed calls (local memory the driver grew for
  // a launch): the driver's, CUDA kernels, seen as the next call begins,
  // while no other call is under way there; on a shared device only by
  // NVML's bytes for this process, never while those are unknown. The
  // caching allocator's calls: readings, no record.
  vs_outside_alone(0, 0);
  vs_test_caller = "libc10_cuda.so";
  vs_test_device = 0;
  vs_test_free = 200 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  call("cuMemAlloc_v2", &alloc);
  const size_t n0 = recs.size();
  vs_test_free = 190 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  call("cuMemAlloc_v2", &alloc);
  check(recs.size() == n0, "shared, with NVML's bytes for this process unknown: nothing is measured");
  vs_outside_alone(0, 1);
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  call("cuMemAlloc_v2", &alloc);
  vs_test_free = 180 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  check(recs.size() == n0 + 1 && kind(recs[n0]) == VS_K_OUTSIDE_TOTAL &&
            aux(recs[n0]) == (VS_LIB_CUDA | VS_OUT_KERNELS << 8) && recs[n0][3] == 10 * MIB &&
            device(recs[n0]) == 0,
        "alone, what was taken between two calls is CUDA's kernels");
  vs_test_free = 170 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  check(recs.size() == n0 + 1, "not while another followed call is under way on the device");
  call("cuMemAlloc_v2", &alloc);
  call("cuMemAlloc_v2", &alloc);
  call("cuMemAlloc_v2", &alloc);  // an exit whose entry came before the subscription
  vs_test_free = 160 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  check(recs.size() == n0 + 2 && recs[n0 + 1][3] == 20 * MIB, "once the calls have ended, counted again");
  call("cuMemAlloc_v2", &alloc);

  // Another process comes: the readings are NVML's bytes for this process.
  // The first after the change is not compared with the device's last.
  vs_outside_alone(0, 0);
  vs_test_used = 600 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  call("cuMemAlloc_v2", &alloc);
  const size_t n1 = recs.size();
  check(n1 == n0 + 2, "a reading of NVML's after one of the device's is not a drop");
  // The other process takes 500 MiB and this one 6 MiB between two calls.
  vs_test_free -= 500 * MIB;
  vs_test_used += 6 * MIB;
  call("cuMemAlloc_v2", &alloc, 0, CUPTI_API_ENTER);
  check(recs.size() == n1 + 1 && aux(recs[n1]) == (VS_LIB_CUDA | VS_OUT_KERNELS << 8) &&
            recs[n1][3] == 26 * MIB,
        "shared, what this process took between calls is counted by NVML, another's is not");
  call("cuMemAlloc_v2", &alloc);
  // A module loaded while the other process allocates: only this one's.
  vs_test_caller = "libtorch_cuda.so";
  vs_test_free -= 300 * MIB;
  vs_test_used += 4 * MIB;
  loaded();
  check(recs.size() == n1 + 2 && aux(recs[n1 + 1]) == (VS_LIB_TORCH | VS_OUT_KERNELS << 8) &&
            recs[n1 + 1][3] == 12 * MIB,
        "shared, a module's loading is measured by NVML's bytes for this process");
  vs_test_used = 0;
  vs_test_free -= 100 * MIB;
  loaded();
  check(recs.size() == n1 + 2, "shared, with NVML failing, nothing is measured");
  // A figure past any device (a hostile or broken NVML) is no reading.
  vs_test_used = 1ull << 63;
  loaded();
  vs_test_used = (1ull << 63) + 8 * MIB;
  loaded();
  vs_outside_nvml_device(-1, nullptr);
  vs_outside_nvml_device(8, nullptr);
  check(recs.size() == n1 + 2, "shared, NVML's bytes past any device are no reading; a device out of range is ignored");
  vs_test_used = 0;
  // Alone again: the first device reading is not compared with NVML's.
  vs_outside_alone(0, 1);
  loaded();
  check(recs.size() == n1 + 2, "a reading of the device's after one of NVML's is not a drop");
  vs_outside_alone(0, 0);

  // A flood of tiny allocations: bounded, and counted.
  vs_test_caller = "libfoo.so";
  const size_t before = recs.size();
  const uint64_t flood_from = vs_monotonic_ns();
  for (size_t i = 0; i < kMaxLive + 5; i++) {
    unsigned long long q = 0x100000 + i;
    Ptr1 tiny{&q, 1};
    call("cuMemAlloc_v2", &tiny);
  }
  check(vs_outside_refused() >= 5 && recs.size() - before <= kMaxLive, "a flood of allocations is bounded and counted");
  const double flood_s = (vs_monotonic_ns() - flood_from) * 1e-9;
  check(recs.size() - before <= static_cast<size_t>(kRecordsPerSecond * (1 + flood_s)) + 1 &&
            recs.size() - before < kMaxLive / 2,
        "written at most at the rate: a burst of a second's, then what the time refills");

  // The thread (called here at once) sends the totals the rate left out,
  // 0 for a part emptied since, and the count of what was dropped.
  auto sent_now = [&]() {
    const size_t n = recs.size();
    std::lock_guard<std::mutex> g(g_mu);
    resend();
    return std::vector<std::array<uint64_t, 7>>(recs.begin() + n, recs.end());
  };
  auto total = [](const std::vector<std::array<uint64_t, 7>>& rs, uint16_t dev, uint32_t a) -> long long {
    for (auto& r : rs)
      if (kind(r) == VS_K_OUTSIDE_TOTAL && device(r) == dev && aux(r) == a) return static_cast<long long>(r[3]);
    return -1;
  };
  long long foo = 0;  // libfoo's live bytes: 1 each, as many as the bound left room for
  for (auto& kv : g_live)
    if (kv.second.lib == VS_LIB_OTHER && kv.second.device == 0) foo += static_cast<long long>(kv.second.bytes);
  auto sent = sent_now();
  check(foo > static_cast<long long>(kMaxLive) - 4 && total(sent, 0, VS_LIB_OTHER | VS_OUT_ALLOCATION << 8) == foo &&
            total(sent, 0, VS_LIB_CUBLAS | VS_OUT_ALLOCATION << 8) == static_cast<long long>(32 * MIB) &&
            total(sent, 1, VS_LIB_NCCL | VS_OUT_PHYSICAL << 8) == 0,
        "the totals: what is live, 0 for a part emptied since");
  size_t drops = 0;
  for (auto& r : sent)
    if (kind(r) == VS_K_DROPPED && aux(r) == VS_DROP_OUTSIDE && device(r) == VS_NO_DEVICE &&
        r[2] == vs_outside_refused())
      drops++;
  check(drops == 1, "the count of what was dropped, as DROPPED what 8");
  sent = sent_now();
  bool again = false;
  for (auto& r : sent) again = again || kind(r) == VS_K_DROPPED;
  check(!again, "the count is not sent again unchanged");

  // Taking turns with another client (the profiler). A callback already
  // under way as it steps aside records nothing.
  CUpti_CallbackFunc late = fake_cupti_callback;
  check(vs_outside_stop() == 0 && fake_cupti_subscribers == 0, "steps aside");
  fake_cupti_other_client = 1;
  check(vs_outside_start(keep, why, sizeof why) == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED &&
            std::string(why).find("MULTIPLE_SUBSCRIBERS") != std::string::npos,
        "a CUPTI held by another client is said, by CUPTI's name for it");
  const size_t n = recs.size();
  int rc = 0;
  CUpti_CallbackData d{CUPTI_API_EXIT, "cuMemAlloc_v2", &ws, &rc};
  late(nullptr, CUPTI_CB_DOMAIN_DRIVER_API, 1, &d);
  check(recs.size() == n, "nothing is recorded while stepped aside");
  fake_cupti_other_client = 0;
  check(vs_outside_start(keep, why, sizeof why) == 0, "comes back when CUPTI is free again");
  return 0;
}

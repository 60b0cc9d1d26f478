// tracker.cpp — vramscope's in-process tracker for PyTorch's CUDA caching
// allocator. Compiled on first use against the user's own torch headers by
// vramscope/_build.py and loaded with ctypes (never dlclose'd).
//
// What it does (see crates/wire/src/ring/FORMAT.md for the wire):
//   * creates the process's segment (producer 1, "TorchExact"): ring 0 for the
//     agent (statistics, snapshots, markers), ring 1 + d for device d;
//   * attaches ONE allocator trace tracker. The callback runs under the
//     allocator's per-device lock: it is noexcept, takes no lock, calls no
//     torch API, allocates nothing and makes no system call — it packs the
//     TraceEntry into seven words and calls vs_ring_write. Trackers cannot be
//     detached, so an atomic flag turns it off (exit, fork, failure);
//   * stamps each event with the time the allocator already took for it
//     (TraceEntry::time_, c10::getApproximateTime(): the TSC on x86),
//     converted to CLOCK_MONOTONIC ns with a line the agent thread fits and
//     publishes through a seqlock every 100 ms (see "Clock" below), instead
//     of calling clock_gettime in the callback;
//   * runs a native agent thread (no Python, no GIL) that refreshes the
//     heartbeat, samples getDeviceStats() every 100 ms, writes a full state
//     snapshot right after attach and on command, and answers commands from
//     the control block (empty_cache, reset peaks, snapshot, ping) every 20 ms.
//
// Environment: VRAMSCOPE_CLOCK=monotonic stamps events with clock_gettime in
// the callback, as before the converted clock (also vs_agent_set_clock(1)).
//
// Build flags: -DVS_EMPTY_TRACKER makes the callback return at once (the
// overhead benchmark's "empty tracker" variant).
//
// Portability across torch releases (2.2 .. 2.15): TraceEntry moved namespace
// and changed the type of stream_ (an int or cudaStream_t before 2.11, void*
// since); mempool_ appeared later; snapshot() grew arguments. Everything that
// differs is reached through the c10::cuda::CUDACachingAllocator aliases and
// small templates below, so one source compiles against each release.

#include "vramscope_ring.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
// -DVS_HAVE_APPROX_CLOCK=0 builds the clock_gettime-only callback.
#ifndef VS_HAVE_APPROX_CLOCK
#if __has_include(<c10/util/ApproximateClock.h>)
#define VS_HAVE_APPROX_CLOCK 1
#else
#define VS_HAVE_APPROX_CLOCK 0
#endif
#endif
#if VS_HAVE_APPROX_CLOCK
#include <c10/util/ApproximateClock.h>
#endif

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace alloc = c10::cuda::CUDACachingAllocator;

namespace {

using Entry = alloc::TraceEntry;
using Segment = std::remove_cv_t<
    std::remove_reference_t<decltype(std::declval<alloc::SnapshotInfo>().segments[0])>>;

constexpr int kMaxDevices = VS_MAX_RINGS - 1;

// What the callback reads, on its own cache line(s), apart from anything the
// agent thread writes often (only the clock line changes, every 100 ms).
struct Calib {
  std::atomic<uint64_t> seq{0};          // seqlock: odd while being written
  std::atomic<uint64_t> base_approx{0};  // approximate-clock value ...
  std::atomic<uint64_t> base_ns{0};      // ... and the CLOCK_MONOTONIC ns it maps to
  std::atomic<int64_t> mult{0};          // ns per tick << 32; 0: clock_gettime and
                                         // a verification sample; < 0: clock_gettime
};
struct alignas(64) Hot {
  std::atomic<int> enabled{0};  // callback writes only when 1
  int devices = 0;
  std::atomic<int> attrib{0};       // 1: tag events with the thread's context and the step tag
  std::atomic<int> exclusive{1};    // 1: device rings take the exclusive write path
  std::atomic<uint32_t> step_tag{0};  // (step mod 255) + 1 of the counted step; 0 none yet
  Calib calib;
};
Hot g_hot;
alignas(64) vs_ring g_dev_rings[VS_MAX_RINGS - 1];  // copies of g_seg.rings[1 + d]

vs_segment g_seg;                      // valid while g_live
std::atomic<int>& g_enabled = g_hot.enabled;
std::atomic<int> g_live{0};            // segment mapped (not closed, not forgotten)
std::atomic<int> g_capturing{0};       // CUDA graph captures underway (set from Python)
std::atomic<int> g_stop{0};
std::atomic<int> g_thread_done{0};
std::atomic<uint32_t> g_snapshot_id{0};
int& g_devices = g_hot.devices;
pid_t g_owner_pid = 0;
uint32_t g_sample = 0;                 // agent thread only
std::atomic<uint64_t> g_stats_period_ns{100000000ull};
std::timed_mutex g_start_mu;           // start/stop from Python and exit, never in the callback
std::atomic<int> g_exiting{0};         // exit() has begun: never start again
std::atomic<int> g_started{0};
std::atomic<int> g_attached{0};        // the tracker callback is attached (forever)

// ---- version-tolerant accessors -------------------------------------------

template <typename S>
uint64_t word_of(S s) {
  if constexpr (std::is_pointer_v<S>) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s));
  } else if constexpr (std::is_enum_v<S>) {
    return static_cast<uint64_t>(static_cast<std::underlying_type_t<S>>(s));
  } else {
    return static_cast<uint64_t>(s);
  }
}

template <typename T, typename = void>
struct has_mempool : std::false_type {};
template <typename T>
struct has_mempool<T, std::void_t<decltype(std::declval<const T&>().mempool_)>> : std::true_type {};

template <typename T>
std::pair<uint64_t, uint64_t> pool_of(const T& e) {
  if constexpr (has_mempool<T>::value) {
    return {static_cast<uint64_t>(e.mempool_.first), static_cast<uint64_t>(e.mempool_.second)};
  } else {
    return {0, 0};
  }
}

template <typename T, typename = void>
struct has_owner_pool : std::false_type {};
template <typename T>
struct has_owner_pool<T, std::void_t<decltype(std::declval<const T&>().owner_private_pool_id)>>
    : std::true_type {};

template <typename T, typename = void>
struct has_expandable : std::false_type {};
template <typename T>
struct has_expandable<T, std::void_t<decltype(std::declval<const T&>().is_expandable)>>
    : std::true_type {};

// snapshot(): 2.11 takes (mempool_id, include_traces); older releases take
// nothing. Prefer not copying the trace history when we can say so.
template <typename Pool = decltype(std::declval<Segment>().owner_private_pool_id)>
auto take_snapshot(int) -> decltype(alloc::snapshot(Pool{0, 0}, false)) {
  return alloc::snapshot(Pool{0, 0}, false);
}
template <typename = void>
auto take_snapshot(long) -> decltype(alloc::snapshot()) {
  return alloc::snapshot();
}

inline bool live() { return g_live.load(std::memory_order_acquire) != 0; }

inline vs_ring* agent_ring() { return &g_seg.rings[0]; }

// ---- Clock ----------------------------------------------------------------
//
// The allocator takes c10::getApproximateTime() for every TraceEntry right
// before it calls the trackers (DeviceCachingAllocator::record_trace): the
// TSC (__rdtsc) on x86 builds, the CLOCK_REALTIME ns of c10::getTime()
// elsewhere (torch 2.11). The callback converts that value instead of calling
// clock_gettime:
//
//     ns = base_ns + (((approx - base_approx) as signed) * mult) >> 32
//
// The agent thread measures (approx, CLOCK_MONOTONIC) pairs (the tightest of
// a few bracketed reads) every 100 ms, fits the slope over the last second
// and publishes the line through the seqlock in g_hot.calib. A new line
// starts where the old one is at that moment and corrects the old line's
// error over the next 100 ms, so stamps stay continuous and non-decreasing;
// only an error over 20 us (a paused VM, a stepped CLOCK_REALTIME) re-anchors
// the line and may step back.
//
// Until the line is trusted, the callback stamps with clock_gettime and
// leaves (approx, ns) samples; the agent thread checks that the allocator's
// time_ lies on its own line (the same clock: both are the inline
// getApproximateTime of the same headers, but the allocator was compiled
// elsewhere) and only then publishes it. A torch without TraceEntry::time_
// .approx_t_ or c10/util/ApproximateClock.h stamps with clock_gettime as
// before, at compile time; so does VRAMSCOPE_CLOCK=monotonic at run time.

template <typename T, typename = void>
struct has_approx_time : std::false_type {};
template <typename T>
struct has_approx_time<T, std::void_t<decltype(std::declval<const T&>().time_.approx_t_)>>
    : std::bool_constant<std::is_integral_v<std::remove_cv_t<
                             std::remove_reference_t<decltype(std::declval<const T&>().time_.approx_t_)>>> &&
                         sizeof(std::declval<const T&>().time_.approx_t_) == 8> {};

constexpr bool kApproxClock = VS_HAVE_APPROX_CLOCK && has_approx_time<Entry>::value;

template <typename T>
inline uint64_t raw_time_of(const T& e) {
  if constexpr (has_approx_time<T>::value) {
    return static_cast<uint64_t>(e.time_.approx_t_);
  } else {
    (void)e;
    return 0;
  }
}

inline uint64_t approx_now() {
#if VS_HAVE_APPROX_CLOCK
  return static_cast<uint64_t>(c10::getApproximateTime());
#else
  return 0;
#endif
}

inline uint64_t convert(uint64_t raw, uint64_t base_approx, uint64_t base_ns, int64_t mult) {
  const int64_t d = static_cast<int64_t>(raw - base_approx);
  return base_ns + static_cast<uint64_t>(static_cast<int64_t>((static_cast<__int128>(d) * mult) >> 32));
}

// Verification samples left by the callback while mult == 0 (one writer per
// device: the callback runs under that device's allocator lock).
struct alignas(64) Sample {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> raw{0};
  std::atomic<uint64_t> mono{0};
};
Sample g_samples[VS_MAX_RINGS - 1];

[[gnu::noinline]] uint64_t stamp_slow(int device, uint64_t raw, int64_t mult) noexcept {
  const uint64_t now = vs_monotonic_ns();
  if (mult == 0) {
    Sample& s = g_samples[device];
    const uint64_t q = s.seq.load(std::memory_order_relaxed);
    s.seq.store(q + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.raw.store(raw, std::memory_order_relaxed);
    s.mono.store(now, std::memory_order_relaxed);
    s.seq.store(q + 2, std::memory_order_release);
  }
  return now;
}

// CLOCK_MONOTONIC ns of the event: never blocks, never calls the kernel once
// the line is published (4 reads of one cache line and a multiply).
inline uint64_t stamp(uint64_t raw, int device) noexcept {
  if constexpr (kApproxClock) {
    const Calib& c = g_hot.calib;
    for (int i = 0; i < 4; i++) {
      const uint64_t s1 = c.seq.load(std::memory_order_acquire);
      const uint64_t ba = c.base_approx.load(std::memory_order_relaxed);
      const uint64_t bn = c.base_ns.load(std::memory_order_relaxed);
      const int64_t m = c.mult.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (c.seq.load(std::memory_order_relaxed) != s1 || (s1 & 1)) continue;  // torn: retry
      if (__builtin_expect(m > 0, 1)) return convert(raw, ba, bn, m);
      return stamp_slow(device, raw, m);
    }
    return vs_monotonic_ns();  // writer kept interrupting: read the clock
  } else {
    (void)raw;
    (void)device;
    return vs_monotonic_ns();
  }
}

// Agent side of the clock: the agent thread, and vs_agent_set_clock from a
// Python thread, under g_clock_mu (never taken by the callback).
struct Pair {
  uint64_t approx;
  uint64_t ns;
};

struct ClockState {
  enum { VERIFYING = 1, ACTIVE = 2, REJECTED = 3 };
  int state = VERIFYING;
  bool forced_mono = false;
  int good = 0, bad = 0;
  uint64_t worst_dev_ns = 0;  // largest |sample - line| seen in verification
  uint64_t seen[VS_MAX_RINGS - 1] = {};
  Pair hist[16] = {};  // pairs of the last calibrations, oldest first
  int nhist = 0;
  double ns_per_tick = 0;  // fitted slope
  bool published = false;  // a line (pub_*) is published or was before forcing
  uint64_t pub_ba = 0, pub_bn = 0;
  int64_t pub_mult = 0;
  uint64_t next_cal_ns = 0;
  uint64_t calibrations = 0, steps = 0, max_abs_err = 0;
  int64_t last_err = 0;
};
std::mutex g_clock_mu;
ClockState g_clock;

constexpr uint64_t kCalPeriodNs = 100000000ull;  // recalibrate every 100 ms
constexpr uint64_t kFitWindowNs = 1000000000ull; // slope over about 1 s
constexpr int64_t kSlewLimitNs = 20000;          // larger errors re-anchor the line

Pair measure_pair() {
  Pair best{0, 0};
  uint64_t width = ~0ull;
  for (int i = 0; i < 7; i++) {
    const uint64_t a0 = approx_now();
    const uint64_t ns = vs_monotonic_ns();
    const uint64_t a1 = approx_now();
    if (a1 >= a0 && a1 - a0 < width) {
      width = a1 - a0;
      best = {a0 + (a1 - a0) / 2, ns};
    }
  }
  return best;
}

void publish(uint64_t ba, uint64_t bn, int64_t mult) {
  Calib& c = g_hot.calib;
  const uint64_t s = c.seq.load(std::memory_order_relaxed);
  c.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c.base_approx.store(ba, std::memory_order_relaxed);
  c.base_ns.store(bn, std::memory_order_relaxed);
  c.mult.store(mult, std::memory_order_relaxed);
  c.seq.store(s + 2, std::memory_order_release);
}

// Checks the callback's samples against the fitted line (g_clock_mu held).
void verify_samples(ClockState& cs) {
  if (cs.state != ClockState::VERIFYING || cs.nhist < 2) return;
  const Pair& last = cs.hist[cs.nhist - 1];
  for (int d = 0; d < g_hot.devices; d++) {
    Sample& s = g_samples[d];
    const uint64_t s1 = s.seq.load(std::memory_order_acquire);
    if ((s1 & 1) || s1 == cs.seen[d]) continue;
    const uint64_t raw = s.raw.load(std::memory_order_relaxed);
    const uint64_t mono = s.mono.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != s1) continue;
    cs.seen[d] = s1;
    // The callback read the clock after the allocator took time_: mono is
    // at or a little after the line's value for raw.
    const double pred = static_cast<double>(last.ns) +
                        static_cast<double>(static_cast<int64_t>(raw - last.approx)) * cs.ns_per_tick;
    const double dev = static_cast<double>(mono) - pred;
    const double mag = std::fabs(dev);
    if (mag < 1e12 && static_cast<uint64_t>(mag) > cs.worst_dev_ns) cs.worst_dev_ns = static_cast<uint64_t>(mag);
    if (dev > -50000.0 && dev < 10000000.0) {
      cs.good++;
    } else {
      cs.bad++;
    }
  }
  if (cs.bad >= 3 && cs.bad > cs.good) {
    cs.state = ClockState::REJECTED;  // not our clock: clock_gettime for good
    publish(0, 0, -1);
  } else if (cs.good >= 3 + 4 * cs.bad) {
    cs.state = ClockState::ACTIVE;  // published at the next calibration
  }
}

// Takes a pair, refits, publishes (g_clock_mu held).
void calibrate(ClockState& cs, bool force_now) {
  const Pair p = measure_pair();
  if (!force_now && p.ns < cs.next_cal_ns) return;
  cs.next_cal_ns = p.ns + (cs.nhist < 3 ? kCalPeriodNs / 5 : kCalPeriodNs);
  // History: keep the oldest pair within the fit window (and at least one).
  if (cs.nhist == 16) {
    for (int i = 1; i < 16; i++) cs.hist[i - 1] = cs.hist[i];
    cs.nhist = 15;
  }
  if (cs.nhist > 0 && (p.approx <= cs.hist[cs.nhist - 1].approx || p.ns <= cs.hist[cs.nhist - 1].ns)) {
    cs.nhist = 0;  // the approximate clock went back or stood still: start over
  }
  cs.hist[cs.nhist++] = p;
  while (cs.nhist > 2 && p.ns - cs.hist[1].ns >= kFitWindowNs) {
    for (int i = 1; i < cs.nhist; i++) cs.hist[i - 1] = cs.hist[i];
    cs.nhist--;
  }
  if (cs.nhist < 2) return;
  const Pair& o = cs.hist[0];
  cs.ns_per_tick = static_cast<double>(p.ns - o.ns) / static_cast<double>(p.approx - o.approx);
  cs.calibrations++;
  verify_samples(cs);
  if (cs.state != ClockState::ACTIVE || cs.forced_mono || p.ns - o.ns < kCalPeriodNs) return;
  // Ticks in one period, and the slope that takes the old line's error back
  // to zero over that period.
  const double ticks = static_cast<double>(kCalPeriodNs) / cs.ns_per_tick;
  if (!(ticks > 0) || !(ticks < 1e15)) return;
  uint64_t bn = p.ns;
  double slope = cs.ns_per_tick;
  if (cs.published) {
    const uint64_t at = convert(p.approx, cs.pub_ba, cs.pub_bn, cs.pub_mult);
    const int64_t err = static_cast<int64_t>(at - p.ns);
    cs.last_err = err;
    const uint64_t mag = static_cast<uint64_t>(err < 0 ? -err : err);
    if (mag > cs.max_abs_err) cs.max_abs_err = mag;
    if (err > -kSlewLimitNs && err < kSlewLimitNs) {
      bn = at;
      slope = cs.ns_per_tick - static_cast<double>(err) / ticks;
    } else {
      cs.steps++;
    }
  }
  const double m = slope * 4294967296.0;
  if (!(m >= 1.0) || !(m < 9.0e18)) return;
  cs.pub_ba = p.approx;
  cs.pub_bn = bn;
  cs.pub_mult = static_cast<int64_t>(std::llround(m));
  cs.published = true;
  publish(cs.pub_ba, cs.pub_bn, cs.pub_mult);
}

// Agent thread, every loop (20 ms).
void clock_tick() {
  if constexpr (kApproxClock) {
    std::lock_guard<std::mutex> lock(g_clock_mu);
    ClockState& cs = g_clock;
    if (cs.state == ClockState::REJECTED) return;
    calibrate(cs, false);
    verify_samples(cs);
  }
}

// ---- attribution (FORMAT.md, "Contexts, strings, frames and stacks") -------
//
// The context id of the calling thread: Python's module, backward and
// optimizer hooks store it (through the address vs_agent_context_slot gives
// each thread) and the callback reads its low 24 bits (the agent's native
// call path keeps a flag in the top bit). Initial-exec TLS: a general-dynamic
// thread-local of a dlopen'ed library may allocate on a thread's first
// access, which the callback must never do.
thread_local uint32_t t_context __attribute__((tls_model("initial-exec"))) = 0;

// The tag of each live block, per device, for SNAP_BLOCK: an open-addressing
// table (linear probing, backward-shift deletion). The callback never
// touches it: its events already carry their tags in the ring, and the
// agent thread applies them (ALLOC puts, FREE_COMPLETED erases) every pass,
// and a snapshot up to exactly the position its state reflects (see
// follow_tags). Preallocated at start; when 3/4 full a new block's tag is
// not kept and is counted (DROPPED 6).
// An entry is one word: the key (bits 9..40 of the block's address; blocks
// are 512-byte aligned) above the tag; 0 is empty. Two live blocks of one
// device share a key only when their addresses differ by a multiple of
// 2 TiB; the one found then lends its tag (an attribution slip, nothing
// else). (Kept in the callback, one cold line per ALLOC and free cost a
// host-bound ResNet-50 step about 0.4 % of its CPU time.)
constexpr uint64_t kTagBits = 15;
constexpr uint64_t kTagSlots = 1u << kTagBits;  // per device: 32,768
constexpr uint64_t kTagMask = kTagSlots - 1;
constexpr uint64_t kTagLimit = kTagSlots / 4 * 3;
struct TagTable {
  std::atomic<uint64_t>* slots = nullptr;  // kTagSlots entries
  uint64_t used = 0;
  uint64_t pos = 0;      // the device ring's next position to apply
  uint64_t waited = 0;   // 1 + a position found unwritten at the last pass (0: none)
};
TagTable g_tags[kMaxDevices];  // under g_tags_mu (never taken by the callback)
std::mutex g_tags_mu;

// Counts for DROPPED records (FORMAT.md, DROPPED `what`), written by the
// agent thread when they change.
constexpr int kDropKinds = 8;
std::atomic<uint64_t> g_drop[kDropKinds];
uint64_t g_drop_written[kDropKinds];  // agent thread only

inline uint32_t tag_key(uint64_t addr) { return static_cast<uint32_t>(addr >> 9); }
inline uint64_t tag_home(uint32_t key) { return (key * 0x9E3779B97F4A7C15ull) >> (64 - kTagBits); }

inline void tag_put(TagTable& t, uint64_t addr, uint32_t tag) noexcept {
  const uint32_t key = tag_key(addr);
  if (t.slots == nullptr || key == 0) return;
  const uint64_t entry = (static_cast<uint64_t>(key) << 32) | tag;
  for (uint64_t i = tag_home(key);; i = (i + 1) & kTagMask) {
    const uint64_t w = t.slots[i].load(std::memory_order_relaxed);
    if ((w >> 32) == key) {
      t.slots[i].store(entry, std::memory_order_relaxed);
      return;
    }
    if (w == 0) {
      if (t.used >= kTagLimit) {
        g_drop[VS_DROP_BLOCK_TAGS].fetch_add(1, std::memory_order_relaxed);
        return;
      }
      t.slots[i].store(entry, std::memory_order_relaxed);
      t.used++;
      return;
    }
  }
}

inline void tag_erase(TagTable& t, uint64_t addr) noexcept {
  const uint32_t key = tag_key(addr);
  if (t.slots == nullptr || key == 0) return;
  uint64_t i = tag_home(key);
  for (;; i = (i + 1) & kTagMask) {
    const uint64_t w = t.slots[i].load(std::memory_order_relaxed);
    if (w == 0) return;  // not kept
    if ((w >> 32) == key) break;
  }
  // Backward-shift deletion: move later entries of the run into the hole
  // unless their home lies cyclically in (hole, j].
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & kTagMask;; j = (j + 1) & kTagMask) {
    const uint64_t w = t.slots[j].load(std::memory_order_relaxed);
    if (w == 0) break;
    const uint64_t home = tag_home(static_cast<uint32_t>(w >> 32));
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    t.slots[hole].store(w, std::memory_order_relaxed);
    hole = j;
  }
  t.slots[hole].store(0, std::memory_order_relaxed);
  t.used--;
}

inline uint32_t tag_get(const std::atomic<uint64_t>* slots, uint64_t addr) noexcept {
  const uint32_t key = tag_key(addr);
  if (slots == nullptr || key == 0) return 0;
  uint64_t i = tag_home(key);
  for (uint64_t n = 0; n < kTagSlots; n++, i = (i + 1) & kTagMask) {
    const uint64_t w = slots[i].load(std::memory_order_relaxed);
    if ((w >> 32) == key) return static_cast<uint32_t>(w);
    if (w == 0) return 0;
  }
  return 0;
}

// Applies device d's ring events from the table's position up to `until`
// (exclusive) to its tag table: ALLOC puts its block's tag, FREE_COMPLETED
// erases it. A slot is read as any reader does (FORMAT.md, "Slots": its
// sequence word before and after the words). `settled`: every position
// below `until` was written or lost for good (a snapshot's exact position,
// taken under the allocator's lock), so an unwritten slot is lost; else
// an unwritten slot among the last kWaitSlots is waited for one pass (a
// writer between its claim and its stores), then counted lost (the
// any-writer path drops a record when its slot is still held), and one
// further back is lost at once (no writer is that far behind the head:
// only a head moved by another process puts it there). An event overwritten before it was read (the
// ring went round between two passes) is lost too. Lost events are counted
// in DROPPED 6: a block whose ALLOC was lost has no tag. g_tags_mu held.
constexpr uint64_t kWaitSlots = 64;
void follow_tags(int d, uint64_t until, bool settled) noexcept {
  TagTable& t = g_tags[d];
  const vs_ring& r = g_dev_rings[d];
  if (t.slots == nullptr || r.slots == nullptr) return;
  uint64_t p = t.pos, lost = 0;
  if (until > p + r.mask + 1) {  // already overwritten
    lost += until - (r.mask + 1) - p;
    p = until - (r.mask + 1);
  }
  for (; p < until; p++) {
    const uint64_t* slot = r.slots + 8 * (p & r.mask);
    const uint64_t want = 2 * p + 2;
    const uint64_t s = __atomic_load_n(&slot[0], __ATOMIC_ACQUIRE);
    if (s < want && !settled && until - p <= kWaitSlots && t.waited != p + 1) {
      t.waited = p + 1;  // not written yet: again next pass
      break;
    }
    if (s != want) {
      lost++;
      continue;
    }
    const uint64_t head = __atomic_load_n(&slot[1], __ATOMIC_RELAXED);
    const uint64_t addr = __atomic_load_n(&slot[3], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&slot[0], __ATOMIC_RELAXED) != s) {  // overwritten while read
      lost++;
      continue;
    }
    const uint16_t kind = static_cast<uint16_t>(head);
    if (kind == VS_K_ALLOC) {
      tag_put(t, addr, static_cast<uint32_t>(head >> 32));
    } else if (kind == VS_K_FREE_COMPLETED) {
      tag_erase(t, addr);
    }
  }
  t.pos = p;
  if (lost != 0) g_drop[VS_DROP_BLOCK_TAGS].fetch_add(lost, std::memory_order_relaxed);
}

// The agent thread's pass: every device's table up to its ring's head.
void follow_all_tags() noexcept {
  std::lock_guard<std::mutex> lock(g_tags_mu);
  for (int d = 0; d < g_hot.devices; d++) follow_tags(d, __atomic_load_n(g_dev_rings[d].head, __ATOMIC_ACQUIRE), false);
}

// ---- the allocator callback ----------------------------------------------

// Where each device's part of our own snapshot() ended in its ring.
// snapshot() reads the devices in order, each under its own lock, and ends
// each with a SNAPSHOT entry; PyTorch labels every such entry device 0, so
// the k-th entry seen while our call runs is device k's. Another thread's
// snapshot() at the same time adds entries: then the count is off and
// write_snapshot gives windows instead.
struct alignas(64) SnapMarks {
  std::atomic<int> taking{0};
  std::atomic<uint64_t> seen{0};
  std::atomic<uint64_t> head[kMaxDevices];
};
SnapMarks g_snap_marks;

inline void note_snapshot_position() noexcept {
  if (g_snap_marks.taking.load(std::memory_order_acquire) == 0) return;
  const uint64_t k = g_snap_marks.seen.fetch_add(1, std::memory_order_acq_rel);
  if (k < static_cast<uint64_t>(g_hot.devices)) {
    g_snap_marks.head[k].store(__atomic_load_n(g_dev_rings[k].head, __ATOMIC_ACQUIRE),
                               std::memory_order_relaxed);
  }
}

// One allocator event into its device's ring (the callback's work after it
// read the TraceEntry; the benchmark calls it directly).
inline void emit(int action, int device, uint64_t addr, uint64_t size, uint64_t stream, uint64_t pool0,
                 uint64_t pool1, uint64_t raw_time) noexcept {
  vs_ring* ring = &g_dev_rings[device];
  // Positions are claimed in order: warm the slot a few positions ahead so
  // the next events do not wait for its cache line (a 4 MiB ring does not
  // stay in cache). A prefetch is only a hint: no ordering, no fault.
  __builtin_prefetch(ring->slots + 8 * ((__atomic_load_n(ring->head, __ATOMIC_RELAXED) + 4) & ring->mask), 1, 3);
  // (The block tag table learns this tag from the ring: follow_tags.)
  const uint32_t tag = g_hot.attrib.load(std::memory_order_relaxed) != 0
                           ? (t_context & VS_CONTEXT_MAX) | (g_hot.step_tag.load(std::memory_order_relaxed) << 24)
                           : 0;
  uint64_t w[7] = {
      vs_head_word(static_cast<uint16_t>(action + 1), static_cast<uint16_t>(device), tag),
      stamp(raw_time, device),
      addr,
      size,
      stream,
      pool0,
      pool1,
  };
  // A device's events arrive under that device's allocator lock: one writer
  // at a time, so the exclusive path (plain stores, FORMAT.md "Slots") is
  // sound. VRAMSCOPE_RING_WRITE=shared keeps the any-writer path.
  if (g_hot.exclusive.load(std::memory_order_relaxed) != 0) {
    vs_ring_write_exclusive(ring, w);
  } else {
    vs_ring_write(ring, w);
  }
}

void on_trace(const Entry& e) noexcept {
#ifdef VS_EMPTY_TRACKER
  (void)e;
  return;
#else
  if (g_hot.enabled.load(std::memory_order_acquire) == 0) return;
  const int action = static_cast<int>(e.action_);
  if (action == static_cast<int>(Entry::SNAPSHOT)) {
    // snapshot() ends each device's part with this entry, still inside that
    // device's critical section: the ring's head now splits the device's
    // events exactly into those the state reflects and those it does not
    // (FORMAT.md, "Positions").
    note_snapshot_position();
    return;
  }
  const int device = static_cast<int>(e.device_);
  if (device < 0 || device >= g_hot.devices) return;
  const auto pool = pool_of(e);
  emit(action, device, static_cast<uint64_t>(e.addr_), static_cast<uint64_t>(e.size_), word_of(e.stream_),
       pool.first, pool.second, raw_time_of(e));
#endif
}

// ---- agent-side writers (agent thread, or Python threads via the C API) ----

// One statistics sample of device `d`: STATS_A, STATS_B, then STATS_C with
// the device ring's positions around the read (FORMAT.md, "Positions").
// getDeviceStats takes the device's allocator lock, under which every event
// of the device is counted and written: when no position was claimed
// between the two reads of the head, the sample reflects exactly the events
// before it.
void write_stats(int d) {
  const uint64_t before = __atomic_load_n(g_dev_rings[d].head, __ATOMIC_ACQUIRE);
  const auto s = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(d));
  const uint64_t after = __atomic_load_n(g_dev_rings[d].head, __ATOMIC_ACQUIRE);
  constexpr size_t all = 0;  // StatType::AGGREGATE
  const uint32_t sample = ++g_sample;
  const uint16_t dev = static_cast<uint16_t>(d);
  uint64_t a[7] = {
      vs_head_word(VS_K_STATS_A, dev, sample),
      vs_monotonic_ns(),
      static_cast<uint64_t>(s.allocated_bytes[all].current),
      static_cast<uint64_t>(s.reserved_bytes[all].current),
      static_cast<uint64_t>(s.active_bytes[all].current),
      static_cast<uint64_t>(s.inactive_split_bytes[all].current),
      static_cast<uint64_t>(s.requested_bytes[all].current),
  };
  uint64_t b[7] = {
      vs_head_word(VS_K_STATS_B, dev, sample),
      a[1],
      static_cast<uint64_t>(s.allocated_bytes[all].peak),
      static_cast<uint64_t>(s.reserved_bytes[all].peak),
      static_cast<uint64_t>(s.active_bytes[all].peak),
      static_cast<uint64_t>(s.num_alloc_retries),
      (static_cast<uint64_t>(s.num_ooms) & 0xffffffffull) |
          (static_cast<uint64_t>(s.segment[all].current) << 32),
  };
  vs_ring_write(agent_ring(), a);
  vs_ring_write(agent_ring(), b);
  uint64_t c[7];
  vs_rec_stats_c(c, dev, sample, a[1], static_cast<uint8_t>(1 + d), before, after, before == after);
  vs_ring_write(agent_ring(), c);
}

void write_all_stats() {
  for (int d = 0; d < g_devices; d++) write_stats(d);
}

uint64_t reserved_of(int d) {
  return static_cast<uint64_t>(
      alloc::getDeviceStats(static_cast<c10::DeviceIndex>(d)).reserved_bytes[0].current);
}

bool device_in_use(int d) {
  const auto s = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(d));
  return s.reserved_bytes[0].current > 0 || s.segment[0].allocated > 0 ||
         s.allocation[0].allocated > 0;
}

// Writes one snapshot: for each device (or only `only`), SNAP_BEGIN, its
// segments each followed by its blocks, SNAP_END, all with the same id.
// Where the state of device `d` sits in its ring (FORMAT.md, "Positions"):
// SNAP_BEGIN w4 (before), w5 (after), w6 (flags).
struct Span {
  uint64_t before, after, flags;
};

// `exact`: one SNAPSHOT entry per device arrived while ours ran (so the
// k-th was device k's), and their heads are in g_snap_marks.
Span span_of(int d, uint64_t before, uint64_t after, bool exact) {
  constexpr uint64_t kGiven = 1, kExact = 2, kAmbiguous = 4;
  const uint64_t ring = static_cast<uint64_t>(1 + d) << 8;
  if (exact) {
    const uint64_t at = g_snap_marks.head[d].load(std::memory_order_relaxed);
    if (before <= at && at <= after) return {at, at, kGiven | kExact | ring};
  }
  if (before == after) return {before, after, kGiven | kExact | ring};
  return {before, after, kGiven | kAmbiguous | ring};
}

// Definition records (STRING, FRAME, STACK, CONTEXT) the Python side wrote,
// kept to be sent again before each snapshot. Bounded; a definition not
// kept, or not re-sent for lack of room in the agent ring, is counted in
// DROPPED 5. Never touched by the callback.
using Record = std::array<uint64_t, 7>;
constexpr size_t kMaxDefinitions = 131072;  // 8 MiB
std::mutex g_defs_mu;
std::vector<Record> g_defs;

void define(const uint64_t w[7]) {
  vs_ring_write(agent_ring(), w);
  std::lock_guard<std::mutex> lock(g_defs_mu);
  if (g_defs.size() >= kMaxDefinitions) {
    g_drop[VS_DROP_DEFINITIONS].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Record r;
  std::memcpy(r.data(), w, sizeof r);
  g_defs.push_back(r);
}

void resend_definitions() {
  std::lock_guard<std::mutex> lock(g_defs_mu);
  // At most a quarter of the agent ring, so the snapshot after them fits.
  const size_t room = static_cast<size_t>((agent_ring()->mask + 1) / 4);
  const size_t n = g_defs.size() < room ? g_defs.size() : room;
  if (n < g_defs.size()) g_drop[VS_DROP_DEFINITIONS].fetch_add(g_defs.size() - n, std::memory_order_relaxed);
  const uint64_t now = vs_monotonic_ns();
  for (size_t i = 0; i < n; i++) {
    Record r = g_defs[i];
    r[1] = now;
    vs_ring_write(agent_ring(), r.data());
  }
}

// The latest role list (FORMAT.md, "Roles"), kept to be sent again with
// each snapshot so that a reader attaching mid-run has one. Five words a
// tensor: device, address, bytes, role, module path string id. Bounded to
// a quarter of the agent ring; what is left out is counted in DROPPED 7.
constexpr size_t kMaxRoles = 16384;
std::mutex g_roles_mu;
std::vector<uint64_t> g_roles;  // 5 words a tensor
uint32_t g_roles_list = 0;      // the last list number written

// Writes the kept list as list number `++g_roles_list` (under g_roles_mu).
void write_roles_locked() {
  const uint32_t list = ++g_roles_list;
  const uint64_t n = g_roles.size() / 5;
  const uint64_t now = vs_monotonic_ns();
  uint64_t w[7];
  vs_rec_roles(w, list, now, n, 0);
  vs_ring_write(agent_ring(), w);
  uint64_t written = 0;
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t* e = &g_roles[5 * i];
    vs_rec_role(w, list, now, static_cast<uint16_t>(e[0]), e[1], e[2], static_cast<uint8_t>(e[3]),
                static_cast<uint32_t>(e[4]));
    written += static_cast<uint64_t>(vs_ring_write(agent_ring(), w));
  }
  vs_rec_roles(w, list, now, written, 1);
  vs_ring_write(agent_ring(), w);
}

void resend_roles() {
  std::lock_guard<std::mutex> lock(g_roles_mu);
  if (g_roles_list != 0) write_roles_locked();
}

// DROPPED records for the counts that changed (agent thread).
void write_dropped() {
  for (int what = 1; what < kDropKinds; what++) {
    const uint64_t n = g_drop[what].load(std::memory_order_relaxed);
    if (n == g_drop_written[what]) continue;
    uint64_t w[7];
    const uint64_t bound = what == VS_DROP_BLOCK_TAGS    ? kTagLimit
                           : what == VS_DROP_DEFINITIONS ? kMaxDefinitions
                           : what == VS_DROP_ROLES       ? kMaxRoles
                                                         : 0;
    vs_rec_dropped(w, VS_NO_DEVICE, static_cast<uint32_t>(what), vs_monotonic_ns(), n, bound);
    if (vs_ring_write(agent_ring(), w)) g_drop_written[what] = n;
  }
}

std::mutex g_snapshot_mu;  // one write_snapshot at a time (agent thread, start)

uint32_t write_snapshot(int only) {
  std::lock_guard<std::mutex> one(g_snapshot_mu);
  // Held from before the state is read: no pass moves a table past it.
  std::lock_guard<std::mutex> tags_lock(g_tags_mu);
  const uint32_t id = g_snapshot_id.fetch_add(1, std::memory_order_relaxed) + 1;
  uint64_t before[kMaxDevices];
  for (int d = 0; d < g_devices; d++) before[d] = __atomic_load_n(g_dev_rings[d].head, __ATOMIC_ACQUIRE);
  g_snap_marks.seen.store(0, std::memory_order_relaxed);
  g_snap_marks.taking.store(1, std::memory_order_release);
  const auto info = take_snapshot(0);
  g_snap_marks.taking.store(0, std::memory_order_release);
  const bool exact = g_snap_marks.seen.load(std::memory_order_acquire) == static_cast<uint64_t>(g_devices);
  // Definitions first, so a reader that starts with this snapshot can name
  // every context the blocks' tags use (FORMAT.md, "Attaching mid-run").
  resend_definitions();
  for (int d = 0; d < g_devices; d++) {
    if (only >= 0 && d != only) continue;
    const uint16_t dev = static_cast<uint16_t>(d);
    const Span at = span_of(d, before[d], __atomic_load_n(g_dev_rings[d].head, __ATOMIC_ACQUIRE), exact);
    // Tags as they were when the state was read: the table brought up to
    // exactly that position; where the position is a window (another
    // snapshot() raced with ours), up to its end, which may be a little newer.
    const std::atomic<uint64_t>* tags = nullptr;
    if (g_hot.attrib.load(std::memory_order_relaxed) != 0) {
      follow_tags(d, at.after, (at.flags & VS_SPAN_EXACT) != 0);
      tags = g_tags[d].slots;
    }
    uint64_t nseg = 0, nblk = 0;
    for (const auto& seg : info.segments) {
      if (static_cast<int>(seg.device) != d) continue;
      nseg++;
      nblk += seg.blocks.size();
    }
    uint64_t now = vs_monotonic_ns();
    uint64_t begin[7] = {vs_head_word(VS_K_SNAP_BEGIN, dev, id), now, nseg, nblk, at.before, at.after, at.flags};
    vs_ring_write(agent_ring(), begin);
    for (const auto& seg : info.segments) {
      if (static_cast<int>(seg.device) != d) continue;
      uint64_t p0 = 0, p1 = 0;
      if constexpr (has_owner_pool<Segment>::value) {
        p0 = static_cast<uint64_t>(seg.owner_private_pool_id.first);
        p1 = static_cast<uint64_t>(seg.owner_private_pool_id.second);
      }
      uint64_t flags = seg.is_large ? 0 : 1;
      if constexpr (has_expandable<Segment>::value) {
        if (seg.is_expandable) flags |= 2;
      }
      uint64_t sw[7] = {
          vs_head_word(VS_K_SNAP_SEGMENT, dev, id),
          now,
          static_cast<uint64_t>(seg.address),
          static_cast<uint64_t>(seg.total_size),
          word_of(seg.stream),
          p0,
          (p1 << 8) | flags,
      };
      vs_ring_write(agent_ring(), sw);
      uint64_t addr = static_cast<uint64_t>(seg.address);
      for (const auto& b : seg.blocks) {
        const uint64_t state = b.allocated ? 0 : (b.active ? 1 : 2);
        uint64_t bw[7] = {
            vs_head_word(VS_K_SNAP_BLOCK, dev, id),
            now,
            addr,
            static_cast<uint64_t>(b.size),
            static_cast<uint64_t>(b.requested_size),
            state,
            state == 2 ? 0 : tag_get(tags, addr),
        };
        vs_ring_write(agent_ring(), bw);
        addr += static_cast<uint64_t>(b.size);
      }
    }
    uint64_t end[7] = {vs_head_word(VS_K_SNAP_END, dev, id), vs_monotonic_ns(), 0, 0, 0, 0, 0};
    vs_ring_write(agent_ring(), end);
  }
  // The role list after the state (FORMAT.md, "Roles"): a reader matches
  // a list to blocks allocated before it, and a snapshot's blocks are as
  // old as the snapshot to it.
  resend_roles();
  return id;
}

// ---- commands --------------------------------------------------------------

// A capture-stacks request (command 5) for the Python side, which reads
// these words through vs_agent_capture_request: seq changes per request.
struct CaptureRequest {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> depth{0};
};
CaptureRequest g_capture;
constexpr uint64_t kMaxCaptureSteps = 1000;

// The step the readers count (FORMAT.md, MARKER `source`: the user's
// markers, else the first optimizer's) and its tag for allocator events.
std::mutex g_mark_mu;
uint64_t g_mark_key = 0;  // rank of the source counted (0: none yet)
std::atomic<uint64_t> g_step_value{0};

void count_step(uint64_t value, uint64_t source, uint64_t arg) {
  uint64_t key;
  if (source == 0 || source == 1) {
    key = 3ull << 32;
  } else if (source == 2) {
    key = (2ull << 32) | (0xffffffffull - std::max<uint64_t>(std::min<uint64_t>(arg, 0xffffffffull), 1));
  } else if (source == 5) {
    key = 0;  // a new run: step 0, whichever source counts
    value = 0;
  } else {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mark_mu);
  if (key != 0) {
    if (key < g_mark_key) return;
    g_mark_key = key;
  }
  g_step_value.store(value, std::memory_order_relaxed);
  g_hot.step_tag.store(static_cast<uint32_t>(value % 255 + 1), std::memory_order_relaxed);
}

void answer(const vs_request& req, uint64_t status, uint64_t r0, uint64_t r1) {
  vs_command_answer(&g_seg, &req, status, r0, r1);
}

void handle(const vs_request& req) {
  try {
    switch (req.kind) {
      case VS_CMD_PING:
        answer(req, VS_STATUS_OK, req.arg, 0);
        return;
      case VS_CMD_SNAPSHOT: {
        const int only = req.arg < static_cast<uint64_t>(g_devices) ? static_cast<int>(req.arg) : -1;
        const uint32_t id = write_snapshot(only);
        answer(req, VS_STATUS_OK, id, 0);
        return;
      }
      case VS_CMD_RESET_PEAKS: {
        for (int d = 0; d < g_devices; d++) {
          if (req.arg < static_cast<uint64_t>(g_devices) && static_cast<uint64_t>(d) != req.arg) continue;
          alloc::resetPeakStats(static_cast<c10::DeviceIndex>(d));
        }
        write_all_stats();
        answer(req, VS_STATUS_OK, 0, 0);
        return;
      }
      case VS_CMD_EMPTY_CACHE: {
        // During a (global-mode) graph capture on any thread, cudaFree from
        // here would invalidate the capture: refuse.
        if (g_capturing.load(std::memory_order_acquire) > 0) {
          answer(req, VS_STATUS_REFUSED, 0, 0);
          return;
        }
        uint64_t before = 0;
        std::vector<int> used;
        for (int d = 0; d < g_devices; d++) {
          before += reserved_of(d);
          if (device_in_use(d)) used.push_back(d);
        }
        // emptyCache() releases every device's cache. Run it with a device
        // the process already uses as current, once per such device, so this
        // thread never creates a CUDA context on a GPU the job does not use.
        for (int d : used) {
          c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(d));
          alloc::emptyCache();
        }
        uint64_t after = 0;
        for (int d = 0; d < g_devices; d++) after += reserved_of(d);
        write_all_stats();
        answer(req, VS_STATUS_OK, before, after);
        return;
      }
      case VS_CMD_CAPTURE_STACKS: {
        // The Python hooks capture the stacks (at the next root module call
        // or step boundary); without them there is nothing to capture with.
        if (g_hot.attrib.load(std::memory_order_acquire) == 0) {
          answer(req, VS_STATUS_UNSUPPORTED, 0, 0);
          return;
        }
        const uint64_t steps = std::min<uint64_t>(req.arg & 0xffffffffull, kMaxCaptureSteps);
        const uint64_t depth = (req.arg >> 32) & 0xffff;
        g_capture.steps.store(steps, std::memory_order_relaxed);
        g_capture.depth.store(depth, std::memory_order_relaxed);
        g_capture.seq.fetch_add(1, std::memory_order_release);
        answer(req, VS_STATUS_OK, steps, g_step_value.load(std::memory_order_relaxed));
        return;
      }
      default:
        answer(req, VS_STATUS_UNSUPPORTED, 0, 0);
        return;
    }
  } catch (const std::exception& e) {
    const bool capture = std::strstr(e.what(), "captur") != nullptr;
    answer(req, capture ? VS_STATUS_REFUSED : VS_STATUS_FAILED, 0, 0);
  } catch (...) {
    answer(req, VS_STATUS_FAILED, 0, 0);
  }
}

// ---- the agent thread -------------------------------------------------------

void agent_loop() noexcept {
  uint64_t next_stats = 0;
  int failures = 0;
  while (g_stop.load(std::memory_order_acquire) == 0 && live()) {
    try {
      vs_heartbeat(&g_seg);
      clock_tick();
      vs_request req;
      if (vs_command_poll(&g_seg, &req)) handle(req);
      follow_all_tags();
      const uint64_t now = vs_monotonic_ns();
      if (now >= next_stats) {
        write_all_stats();
        write_dropped();
        next_stats = now + g_stats_period_ns.load(std::memory_order_relaxed);
      }
      failures = 0;
    } catch (...) {
      // Statistics failing repeatedly (e.g. allocator torn down at exit):
      // back off rather than spin; the heartbeat keeps the segment alive.
      if (++failures > 100) next_stats = vs_monotonic_ns() + 5000000000ull;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  g_thread_done.store(1, std::memory_order_release);
}

// The clock and tag mutexes are held around fork so that a child never
// inherits one locked by the agent thread (which does not exist in the child).
void atfork_prepare() {
  g_clock_mu.lock();
  g_tags_mu.lock();
}
void atfork_parent() {
  g_tags_mu.unlock();
  g_clock_mu.unlock();
}

void atfork_child() {
  g_tags_mu.unlock();
  g_clock_mu.unlock();
  // The child shares the parent's mapping but must never write into it:
  // silence the callback, then drop the mapping without unlinking.
  g_enabled.store(0, std::memory_order_release);
  if (g_live.exchange(0) != 0) vs_segment_forget(&g_seg);
  g_stop.store(1, std::memory_order_release);
  // No agent thread in the child: nothing for exit() to wait for.
  g_started.store(0);
  g_thread_done.store(1, std::memory_order_release);
}

void set_err(char* err, size_t len, const char* msg) {
  if (err && len) {
    std::snprintf(err, len, "%s", msg);
  }
}

}  // namespace

extern "C" {

// Version of the C API below; checked by vramscope/__init__.py.
int vs_agent_api_version(void) { return 1; }

// 1 when built with -DVS_EMPTY_TRACKER.
int vs_agent_is_empty_variant(void) {
#ifdef VS_EMPTY_TRACKER
  return 1;
#else
  return 0;
#endif
}

// Creates the segment, attaches the tracker, writes the first snapshot and
// starts the agent thread. Returns 0 on success; -1 segment creation failed;
// -2 the allocator refused the tracker (cudaMallocAsync, a pluggable
// allocator: the segment is closed again so the caller can fall back to
// sampled mode); -3 CUDA is not initialised; -4 already started; -5 other.
// Never throws.
int vs_agent_start(const char* framework, const char* label, const char* dir, uint32_t slots,
                   char* err, size_t errlen) {
  try {
    std::lock_guard<std::timed_mutex> lock(g_start_mu);
    if (g_exiting.load() != 0) {
      set_err(err, errlen, "vramscope: the process is exiting");
      return -5;
    }
    if (g_started.load() != 0) {
      set_err(err, errlen, "vramscope: tracker already started in this process");
      return -4;
    }
    if (alloc::get() == nullptr) {
      set_err(err, errlen, "vramscope: the CUDA allocator is not initialised");
      return -3;
    }
    int n = static_cast<int>(c10::cuda::device_count());
    if (n <= 0) {
      set_err(err, errlen, "vramscope: no CUDA device visible");
      return -3;
    }
    if (n > kMaxDevices) n = kMaxDevices;
    if (slots < 2 || slots > (1u << 24) || (slots & (slots - 1))) slots = 65536;
    vs_config cfg = vs_default_config();
    cfg.dir = (dir && *dir) ? dir : nullptr;
    cfg.producer = VS_PRODUCER_TORCH_EXACT;
    cfg.flags = VS_FLAG_EVENTS | VS_FLAG_STATS | VS_FLAG_POSITIONS;
    const char* attrib = std::getenv("VRAMSCOPE_ATTRIBUTION");
    const bool tagging = !(attrib && std::strcmp(attrib, "0") == 0);
    if (tagging) cfg.flags |= VS_FLAG_CONTEXTS;
    const char* path = std::getenv("VRAMSCOPE_RING_WRITE");
    g_hot.exclusive.store(path && std::strcmp(path, "shared") == 0 ? 0 : 1);
    cfg.framework = framework;
    cfg.label = label;
    cfg.ring_count = static_cast<uint32_t>(1 + n);
    for (uint32_t i = 0; i < cfg.ring_count; i++) {
      cfg.rings[i].slots = slots;
      cfg.rings[i].role = i == 0 ? VS_ROLE_AGENT : VS_ROLE_DEVICE;
      cfg.rings[i].device = i == 0 ? 0xffffffffu : i - 1;
    }
    g_devices = n;
    if (vs_segment_create(&g_seg, &cfg, err, errlen) != 0) return -1;
    g_owner_pid = getpid();
    // Map every page of the rings now (a no-op read-modify-write of one word
    // per page), so the callback never takes a page fault on first use.
    for (uint32_t i = 0; i < g_seg.ring_count; i++) {
      const vs_ring& r = g_seg.rings[i];
      for (uint64_t w = 0; w < 8 * (r.mask + 1); w += 4096 / 8) __atomic_fetch_or(r.slots + w, 0, __ATOMIC_RELAXED);
    }
    if (tagging) {
      // Block tag tables, allocated now, following the new rings from their start.
      std::lock_guard<std::mutex> tags_lock(g_tags_mu);
      for (int d = 0; d < n; d++) {
        if (g_tags[d].slots == nullptr) g_tags[d].slots = new std::atomic<uint64_t>[kTagSlots]();
        g_tags[d].pos = 0;
        g_tags[d].waited = 0;
      }
    }
    for (int d = 0; d < n; d++) g_dev_rings[d] = g_seg.rings[1 + d];
    if constexpr (kApproxClock) {
      std::lock_guard<std::mutex> clock_lock(g_clock_mu);
      const char* mode = std::getenv("VRAMSCOPE_CLOCK");
      g_clock.forced_mono = mode && std::strcmp(mode, "monotonic") == 0;
      if (g_clock.forced_mono) publish(0, 0, -1);
      calibrate(g_clock, true);
    }
    g_live.store(1, std::memory_order_release);
    if (g_attached.load() == 0) {
      try {
        alloc::attachAllocatorTraceTracker(
            [](const Entry& e) noexcept { on_trace(e); });
        g_attached.store(1);
      } catch (const std::exception& e) {
        g_live.store(0);
        vs_segment_close(&g_seg);
        std::snprintf(err, errlen, "vramscope: the allocator (%s) refused the tracker: %s",
                      alloc::name().c_str(), e.what());
        // Keep only the first line of torch's long messages.
        if (char* nl = std::strchr(err, '\n')) *nl = 0;
        return -2;
      }
    }
    // Events from here on, then the state as it is: segments made before the
    // attach appear in the snapshot; events racing with it appear in both,
    // and the snapshot's id orders them for the reader.
    g_enabled.store(1, std::memory_order_release);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    try {
      write_snapshot(-1);
      write_all_stats();
    } catch (...) {
      // The thread retries statistics; a failed first snapshot is not fatal.
    }
    g_stop.store(0);
    g_thread_done.store(0);
    std::thread(agent_loop).detach();
    g_started.store(1);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, e.what());
    return -5;
  } catch (...) {
    set_err(err, errlen, "vramscope: unknown failure starting the tracker");
    return -5;
  }
}

}  // extern "C"

namespace {

// Stops the thread (waits up to `wait_ms` for it), disables the callback,
// marks the segment closed and unlinks it. Only the process that created the
// segment does so. The mapping is kept: another thread may be inside the
// callback right now, and the process is about to exit anyway. g_start_mu held.
void stop_locked(int wait_ms) noexcept {
  g_enabled.store(0, std::memory_order_release);
  if (g_started.load() == 0) return;
  g_stop.store(1, std::memory_order_release);
  for (int i = 0; i < wait_ms && g_thread_done.load(std::memory_order_acquire) == 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (getpid() == g_owner_pid && g_live.exchange(0) != 0) {
    __atomic_store_n(reinterpret_cast<uint32_t*>(g_seg.base + VS_OFF_STATE), 2u, __ATOMIC_RELEASE);
    unlink(g_seg.path);
  }
}

// exit(): runs before the static destructors of torch's libraries, which
// were loaded (and their statics registered) before this one. The agent
// thread calls into the allocator: left running, it would call a
// half-destroyed allocator ("pure virtual method called", SIGABRT). So it
// is stopped here, after any start still under way (a build that finished
// while the job shut down) has finished; never started again after this.
// Bounded: two seconds for the start, one for the thread.
void at_exit() noexcept {
  g_exiting.store(1);
  g_enabled.store(0, std::memory_order_release);
  if (g_start_mu.try_lock_for(std::chrono::seconds(2))) {
    stop_locked(1000);
    g_start_mu.unlock();
  } else if (g_started.load() != 0) {
    g_stop.store(1, std::memory_order_release);
    for (int i = 0; i < 1000 && g_thread_done.load(std::memory_order_acquire) == 0; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

// Registered when the library is loaded, so before any start can begin.
__attribute__((constructor)) void register_at_exit() { std::atexit(at_exit); }

}  // namespace

extern "C" {

void vs_agent_stop(int wait_ms) {
  try {
    if (!g_start_mu.try_lock_for(std::chrono::milliseconds(wait_ms + 2000))) return;
    std::lock_guard<std::timed_mutex> lock(g_start_mu, std::adopt_lock);
    stop_locked(wait_ms);
  } catch (...) {
  }
}

// A MARKER record (a step boundary) in the agent ring: `source` 1 the
// user's mark(), 2 an optimizer step hook (`arg` numbers the optimizer),
// 5 a new run (FORMAT.md, MARKER `source`).
void vs_agent_mark_from(uint64_t value, uint64_t source, uint64_t arg) {
  if (!live() || g_enabled.load(std::memory_order_acquire) == 0) return;
  uint64_t w[7] = {vs_head_word(VS_K_MARKER, VS_NO_DEVICE, 0), vs_monotonic_ns(), value, source & 0xff, arg, 0, 0};
  vs_ring_write(agent_ring(), w);
  try {
    count_step(value, source & 0xff, arg);  // after the MARKER (FORMAT.md)
  } catch (...) {
  }
}

// The 1.0 entry point: a mark() from the user's code.
void vs_agent_mark(uint64_t value) { vs_agent_mark_from(value, 1, 0); }

// Turns the callback's writes off (0) or on (1) while the tracker stays
// attached: for the overhead benchmark, and for callers that want to pause.
void vs_agent_enable(int on) {
  if (live() && g_started.load() != 0) g_enabled.store(on ? 1 : 0, std::memory_order_release);
}

// Event timestamps: 0 (default) the allocator's own time converted (once
// verified), 1 clock_gettime in the callback (as before; for the benchmark
// and for diagnosis). Returns the mode now in force, or -1 when this build
// has only clock_gettime.
int vs_agent_set_clock(int mode) {
  if constexpr (!kApproxClock) {
    (void)mode;
    return -1;
  } else {
    try {
      std::lock_guard<std::mutex> lock(g_clock_mu);
      ClockState& cs = g_clock;
      cs.forced_mono = mode == 1;
      if (cs.forced_mono) {
        publish(0, 0, cs.state == ClockState::VERIFYING ? 0 : -1);
      } else if (cs.state == ClockState::ACTIVE) {
        cs.published = false;  // stamps were clock_gettime's: anchor afresh
        calibrate(cs, true);
      } else if (cs.state == ClockState::VERIFYING) {
        publish(0, 0, 0);
      }
      return cs.forced_mono ? 1 : 0;
    } catch (...) {
      return -1;
    }
  }
}

// Diagnostics for tests and the benchmark: up to n words of
//   0 state: 0 clock_gettime only (this torch), 1 verifying, 2 converted
//     clock in use, 3 rejected (time_ is not our clock), 4 forced monotonic
//   1 calibrations   2 largest |error| of a published line at recalibration, ns
//   3 last error (signed), ns   4 re-anchored lines (error over 20 us)
//   5 approximate-clock ticks per second   6 / 7 verification samples
//     agreeing / disagreeing   8 largest |sample - line| in verification, ns
// Returns the number of words written.
int vs_agent_clock_info(uint64_t* out, int n) {
  uint64_t v[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  if constexpr (kApproxClock) {
    try {
      std::lock_guard<std::mutex> lock(g_clock_mu);
      const ClockState& cs = g_clock;
      v[0] = cs.forced_mono ? 4 : static_cast<uint64_t>(cs.state);
      if (cs.state == ClockState::ACTIVE && !cs.published && !cs.forced_mono) v[0] = 1;
      v[1] = cs.calibrations;
      v[2] = cs.max_abs_err;
      v[3] = static_cast<uint64_t>(cs.last_err);
      v[4] = cs.steps;
      v[5] = cs.ns_per_tick > 0 ? static_cast<uint64_t>(std::llround(1e9 / cs.ns_per_tick)) : 0;
      v[6] = static_cast<uint64_t>(cs.good);
      v[7] = static_cast<uint64_t>(cs.bad);
      v[8] = cs.worst_dev_ns;
    } catch (...) {
    }
  }
  int k = 0;
  for (; out && k < n && k < 9; k++) out[k] = v[k];
  return k;
}

// ---- attribution API (the Python side, vramscope/_attrib.py) ----------------

// The address of the calling thread's context word: the thread stores its
// current context id there (a plain 32-bit store) and the callback reads
// it. Valid for the thread's lifetime.
uint32_t* vs_agent_context_slot(void) { return &t_context; }

// Tags events with contexts and step tags (1) or not (0). Returns the state
// now in force: 0 when the segment was created without tagging
// (VRAMSCOPE_ATTRIBUTION=0) or the tracker is not started.
int vs_agent_set_attribution(int on) {
  if (!live() || g_started.load() == 0 || g_tags[0].slots == nullptr) return 0;
  g_hot.attrib.store(on ? 1 : 0, std::memory_order_release);
  return on ? 1 : 0;
}

// One record into the agent ring, from another part of the agent (the
// accounting outside the caching allocator, outside.cpp, which is handed
// this function): 1 written, 0 not (the ring full, or no segment).
int vs_agent_write_record(const uint64_t* w) {
  if (!live() || w == nullptr) return 0;
  return vs_ring_write(agent_ring(), w);
}

// Definition records (FORMAT.md): written into the agent ring now and kept
// to be sent again before each snapshot. The caller assigns the ids and
// defines an id before it uses it.
void vs_agent_define_string(uint32_t id, const char* s, uint64_t n) {
  if (!live() || s == nullptr) return;
  try {
    const uint32_t len = vs_string_len(s, static_cast<size_t>(n));
    if (len < n) g_drop[VS_DROP_STRINGS].fetch_add(1, std::memory_order_relaxed);
    const uint64_t now = vs_monotonic_ns();
    uint32_t off = 0;
    do {
      uint64_t w[7];
      vs_rec_string(w, id, now, s, len, off);
      define(w);
      off += VS_STRING_CHUNK;
    } while (off < len);
  } catch (...) {
  }
}

void vs_agent_define_frame(uint32_t id, uint32_t file, uint32_t function, uint32_t line) {
  if (!live()) return;
  try {
    uint64_t w[7];
    vs_rec_frame(w, id, vs_monotonic_ns(), file, function, line);
    define(w);
  } catch (...) {
  }
}

void vs_agent_define_stack(uint32_t id, uint32_t frame, uint32_t parent) {
  if (!live()) return;
  try {
    uint64_t w[7];
    vs_rec_stack(w, id, vs_monotonic_ns(), frame, parent);
    define(w);
  } catch (...) {
  }
}

void vs_agent_define_context(uint32_t id, uint32_t module, uint32_t phase, uint32_t stack) {
  if (!live()) return;
  try {
    uint64_t w[7];
    vs_rec_context(w, id, vs_monotonic_ns(), module, static_cast<uint8_t>(phase), stack, 0, 0);
    define(w);
  } catch (...) {
  }
}

// A new role list from the Python side: `n` tensors of five words each
// (device, address, bytes, role, module path string id), replacing the
// last. Written at once and kept for snapshots. Never touched by the
// callback. Returns the list number, or 0.
uint32_t vs_agent_roles(const uint64_t* words, uint64_t n) {
  if (!live() || (words == nullptr && n != 0)) return 0;
  try {
    std::lock_guard<std::mutex> lock(g_roles_mu);
    const uint64_t keep = n < kMaxRoles ? n : kMaxRoles;
    if (keep < n) g_drop[VS_DROP_ROLES].fetch_add(n - keep, std::memory_order_relaxed);
    g_roles.assign(words, words + 5 * keep);
    write_roles_locked();
    return g_roles_list;
  } catch (...) {
    return 0;
  }
}

// Snapshots written so far: the Python side walks its role list again
// soon after one (a reader that attached is given a fresh list).
uint32_t vs_agent_snapshots(void) { return g_snapshot_id.load(std::memory_order_relaxed); }

// Adds to a DROPPED count (`what`, FORMAT.md) the Python side keeps.
void vs_agent_count_dropped(uint32_t what, uint64_t n) {
  if (what > 0 && what < static_cast<uint32_t>(kDropKinds)) g_drop[what].fetch_add(n, std::memory_order_relaxed);
}

// Three words the Python side polls for command 5: a sequence number that
// changes with each request, the steps asked for (0: stop) and the depth.
const uint64_t* vs_agent_capture_request(void) {
  static_assert(sizeof(std::atomic<uint64_t>) == 8, "lock-free 64-bit atomics");
  return reinterpret_cast<const uint64_t*>(&g_capture);
}

// The benchmark of the callback's own work (emit): `n` synthetic events,
// ALLOCs and FREE_COMPLETEDs of 1,024 addresses in turn, into device 0's
// ring (about 512 live), timed with CLOCK_MONOTONIC. `mode`: bit 0 the exclusive write path
// (else the any-writer one), bit 1 attribution on (context and step tags;
// the block tag table is the agent thread's: follow_tags). Only for a
// quiescent benchmark process: it writes into the real ring, from this
// thread. Returns ns per event, or -1.
double vs_agent_bench_callback(uint64_t n, int mode) {
  if (!live() || g_hot.devices < 1 || n == 0) return -1;
  if ((mode & 2) && g_tags[0].slots == nullptr) return -1;
  const int excl = g_hot.exclusive.load(), attr = g_hot.attrib.load();
  const uint32_t ctx = t_context;
  g_hot.exclusive.store(mode & 1);
  g_hot.attrib.store((mode >> 1) & 1);
  t_context = 7;
  const uint64_t base = 0x7f0000000000ull;
  const uint64_t raw0 = approx_now();
  const uint64_t t0 = vs_monotonic_ns();
  for (uint64_t i = 0; i < n; i++) {
    // About 512 blocks live at a time, as in a training step.
    const uint64_t k = ((i >> 1) + ((i & 1) ? 512 : 0)) & 1023;
    const int action = (i & 1) ? static_cast<int>(Entry::FREE_COMPLETED) : static_cast<int>(Entry::ALLOC);
    emit(action, 0, base + (k << 20), 4096, 0, 0, 0, raw0 + i);
  }
  const uint64_t t1 = vs_monotonic_ns();
  t_context = ctx;
  g_hot.exclusive.store(excl);
  g_hot.attrib.store(attr);
  return static_cast<double>(t1 - t0) / static_cast<double>(n);
}

// +1 when a CUDA graph capture begins, -1 when it ends (from Python hooks).
void vs_agent_capture(int delta) { g_capturing.fetch_add(delta, std::memory_order_acq_rel); }

// Statistics period in milliseconds (default 100).
void vs_agent_set_stats_period_ms(uint32_t ms) {
  if (ms >= 10) g_stats_period_ns.store(static_cast<uint64_t>(ms) * 1000000ull);
}

// Diagnostics for tests: the segment path, or "" when none.
const char* vs_agent_path(void) { return live() ? g_seg.path : ""; }

// Diagnostics for tests: positions claimed in ring i, or -1.
int64_t vs_agent_ring_head(uint32_t i) {
  if (!live() || i >= g_seg.ring_count) return -1;
  return static_cast<int64_t>(__atomic_load_n(g_seg.rings[i].head, __ATOMIC_ACQUIRE));
}

}  // extern "C"

// The tracker's own logic, with no GPU: tracker.cpp compiled against the
// stand-in torch headers in fake_torch/ (just the declarations the tracker
// uses), and a fake allocator defined here. Built and run by
// tests/agent_cpp.rs. Checks:
//   1. the block tag table against std::unordered_map under random
//      allocations and frees (backward-shift deletion, wrap-around, the
//      bound and its DROPPED count);
//   2. the whole callback path: events written through the real tracker
//      callback carry the thread's context and the step tag of the counted
//      step source (FORMAT.md "Contexts"), take the exclusive path, and a
//      snapshot carries each live block's tag and is preceded by the
//      definitions (FORMAT.md "Attaching mid-run");
//   3. the agent thread's passes keep the block tag table from the ring,
//      counting what it lost;
//   4. command 5 is answered with the steps granted and the current step.
// Prints "ok ..." lines, exits non-zero on the first failure.

#include "tracker.cpp"

#include <cstdio>
#include <random>
#include <unordered_map>

namespace fake {
c10::cuda::CUDACachingAllocator::AllocatorTraceTracker tracker;
c10::cuda::CUDACachingAllocator::SnapshotInfo state;
c10::cuda::CUDACachingAllocator::Allocator instance;
void (*after_snapshot_entry)() = nullptr;  // an event racing with the snapshot, after its state
}  // namespace fake

namespace c10::cuda::CUDACachingAllocator {
Allocator* get() { return &fake::instance; }
DeviceStats getDeviceStats(DeviceIndex) { return DeviceStats{}; }
void resetPeakStats(DeviceIndex) {}
void emptyCache() {}
SnapshotInfo snapshot(MempoolId_t, bool) {
  // As PyTorch does: each device's part ends with a SNAPSHOT trace entry,
  // inside that device's critical section.
  TraceEntry e{};
  e.action_ = TraceEntry::SNAPSHOT;
  e.device_ = 0;
  fake::tracker(e);
  if (fake::after_snapshot_entry) fake::after_snapshot_entry();
  return fake::state;
}
void attachAllocatorTraceTracker(AllocatorTraceTracker t) { fake::tracker = std::move(t); }
std::string name() { return "fake"; }
}  // namespace c10::cuda::CUDACachingAllocator

#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      std::printf("FAIL line %d: ", __LINE__);        \
      std::printf(__VA_ARGS__);                       \
      std::printf("\n");                              \
      std::exit(1);                                   \
    }                                                 \
  } while (0)

static void table() {
  TagTable t;
  t.slots = new std::atomic<uint64_t>[kTagSlots]();
  std::unordered_map<uint64_t, uint32_t> want;
  std::vector<uint64_t> live;
  std::mt19937_64 rng(42);
  // Addresses crowd a few homes (many share their low key bits' hash run)
  // and spread over 1 TiB, so runs wrap past the table's end too.
  uint64_t ops = 0;
  for (int round = 0; round < 40; round++) {
    const size_t target = (round % 4 == 3) ? 20000 : 3000;
    for (int i = 0; i < 20000; i++, ops++) {
      const bool add = live.empty() || (live.size() < target && rng() % 3 != 0) || rng() % 7 == 0;
      if (add) {
        const uint64_t addr = ((rng() % (1ull << 31)) + 1) << 9;
        const uint32_t tag = static_cast<uint32_t>(rng()) | 1;
        const bool fresh = want.find(addr) == want.end();
        if (fresh && t.used >= kTagLimit) continue;  // the bound: checked below
        tag_put(t, addr, tag);
        if (fresh) live.push_back(addr);
        want[addr] = tag;
      } else {
        const size_t k = rng() % live.size();
        const uint64_t addr = live[k];
        live[k] = live.back();
        live.pop_back();
        want.erase(addr);
        tag_erase(t, addr);
        CHECK(tag_get(t.slots, addr) == 0, "a freed block keeps a tag");
      }
    }
    CHECK(t.used == want.size(), "used %llu, live %zu", (unsigned long long)t.used, want.size());
    for (const auto& [addr, tag] : want) {
      CHECK(tag_get(t.slots, addr) == tag, "tag of 0x%llx lost after %llu operations", (unsigned long long)addr,
            (unsigned long long)ops);
    }
  }
  // Past the bound a new block's tag is not kept, and is counted.
  const uint64_t before = g_drop[VS_DROP_BLOCK_TAGS].load();
  uint64_t a = 1ull << 40;
  while (t.used < kTagLimit) tag_put(t, a += 512, 5);
  tag_put(t, a += 512, 6);
  CHECK(tag_get(t.slots, a) == 0, "a tag kept past the bound");
  CHECK(g_drop[VS_DROP_BLOCK_TAGS].load() == before + 1, "the block past the bound is not counted");
  std::printf("ok   tag table: %llu random operations agree with a map; the bound counts what it drops\n",
              (unsigned long long)ops);
}

// The records in ring `r` from position `from`, as words.
static std::vector<std::array<uint64_t, 7>> records(const vs_ring& r, uint64_t from) {
  std::vector<std::array<uint64_t, 7>> out;
  const uint64_t head = __atomic_load_n(r.head, __ATOMIC_ACQUIRE);
  for (uint64_t p = from; p < head; p++) {
    const uint64_t* slot = r.slots + 8 * (p & r.mask);
    CHECK(slot[0] == 2 * p + 2, "position %llu not complete", (unsigned long long)p);
    std::array<uint64_t, 7> w;
    for (int i = 0; i < 7; i++) w[i] = slot[1 + i];
    out.push_back(w);
  }
  return out;
}

static uint16_t kind(const std::array<uint64_t, 7>& w) { return static_cast<uint16_t>(w[0]); }
static uint32_t aux(const std::array<uint64_t, 7>& w) { return static_cast<uint32_t>(w[0] >> 32); }

static void alloc_event(int action, uint64_t addr) {
  Entry e{};
  e.action_ = static_cast<Entry::Action>(action);
  e.device_ = 0;
  e.addr_ = addr;
  e.size_ = 4096;
  fake::tracker(e);
}

static uint32_t tag_now(uint64_t addr) {
  std::lock_guard<std::mutex> lock(g_tags_mu);
  return tag_get(g_tags[0].slots, addr);
}

// The block tag table follows the device ring on the agent thread: events
// reach it within a pass; events the ring lost before a pass read them are
// counted (DROPPED 6), and a position claimed but not yet written is
// waited for one pass, then counted.
static void follower(const vs_ring& dev) {
  *vs_agent_context_slot() = 21;
  alloc_event(Entry::ALLOC, 0x60000);
  const uint32_t want = 21 | (46u << 24);
  for (int i = 0; i < 100 && tag_now(0x60000) != want; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(tag_now(0x60000) == want, "the agent's pass did not tag 0x60000: 0x%x", tag_now(0x60000));
  alloc_event(Entry::FREE_COMPLETED, 0x60000);
  for (int i = 0; i < 100 && tag_now(0x60000) != 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(tag_now(0x60000) == 0, "the agent's pass did not erase 0x60000's tag");

  std::unique_lock<std::mutex> lock(g_tags_mu);  // no pass while the ring goes round
  const uint64_t cap = dev.mask + 1, dropped0 = g_drop[VS_DROP_BLOCK_TAGS].load();
  const uint64_t p0 = g_tags[0].pos;
  alloc_event(Entry::ALLOC, 0x70000);
  for (uint64_t i = 0; i < cap + 99; i++) alloc_event(Entry::FREE_REQUESTED, 0x90000);
  alloc_event(Entry::ALLOC, 0x80000);
  const uint64_t head = __atomic_load_n(dev.head, __ATOMIC_ACQUIRE);
  follow_tags(0, head, false);
  CHECK(head - p0 == cap + 101, "head moved %llu", (unsigned long long)(head - p0));
  CHECK(g_tags[0].pos == head, "the pass stopped at %llu of %llu", (unsigned long long)g_tags[0].pos,
        (unsigned long long)head);
  CHECK(g_drop[VS_DROP_BLOCK_TAGS].load() == dropped0 + 101, "%llu counted lost, want 101",
        (unsigned long long)(g_drop[VS_DROP_BLOCK_TAGS].load() - dropped0));
  CHECK(tag_get(g_tags[0].slots, 0x70000) == 0 && tag_get(g_tags[0].slots, 0x80000) == want,
        "tags after the ring went round: 0x%x, 0x%x", tag_get(g_tags[0].slots, 0x70000),
        tag_get(g_tags[0].slots, 0x80000));

  // A position claimed and not written (a writer between its claim and its
  // stores), then an ALLOC after it.
  __atomic_fetch_add(dev.head, 1, __ATOMIC_ACQ_REL);
  alloc_event(Entry::ALLOC, 0xa0000);
  const uint64_t head2 = __atomic_load_n(dev.head, __ATOMIC_ACQUIRE);
  follow_tags(0, head2, false);
  CHECK(g_tags[0].pos == head, "the first pass went past the unwritten position");
  follow_tags(0, head2, false);
  CHECK(g_tags[0].pos == head2 && tag_get(g_tags[0].slots, 0xa0000) == want &&
            g_drop[VS_DROP_BLOCK_TAGS].load() == dropped0 + 102,
        "the second pass: at %llu of %llu, tag 0x%x", (unsigned long long)g_tags[0].pos,
        (unsigned long long)head2, tag_get(g_tags[0].slots, 0xa0000));

  // A head another process of this user moved far ahead (the segment is
  // writable by its owner): a pass reads at most one ring's worth of slots
  // and counts the rest, waits only near the head (at most kWaitSlots
  // passes), and a head moved back makes the pass wait.
  const uint64_t dropped1 = g_drop[VS_DROP_BLOCK_TAGS].load();
  const uint64_t far = head2 + (1ull << 40);
  __atomic_store_n(dev.head, far, __ATOMIC_RELEASE);
  follow_tags(0, far, false);
  CHECK(g_tags[0].pos == far - kWaitSlots, "the first pass stopped %llu below the head",
        (unsigned long long)(far - g_tags[0].pos));
  for (uint64_t i = 0; i < kWaitSlots && g_tags[0].pos != far; i++) follow_tags(0, far, false);
  CHECK(g_tags[0].pos == far && g_drop[VS_DROP_BLOCK_TAGS].load() - dropped1 == far - head2,
        "a head moved far ahead: at %llu, %llu counted", (unsigned long long)(g_tags[0].pos - head2),
        (unsigned long long)(g_drop[VS_DROP_BLOCK_TAGS].load() - dropped1));
  __atomic_store_n(dev.head, head2, __ATOMIC_RELEASE);
  follow_tags(0, head2, false);
  CHECK(g_tags[0].pos == far, "a head moved back moved the pass back");
  g_tags[0].pos = head2;
  std::printf("ok   the agent thread's passes keep the block tag table; what the ring lost is counted (%llu), "
              "and a head moved by another process bounds a pass\n",
              (unsigned long long)(dropped1 - dropped0));
}

static void callback_path(const char* dir) {
  char err[256] = {0};
  vs_agent_set_stats_period_ms(3600000);  // the agent thread writes statistics once, at its start
  const int rc = vs_agent_start("torch fake", "tracker_test", dir, 1024, err, sizeof err);
  CHECK(rc == 0, "vs_agent_start: %d %s", rc, err);
  CHECK(vs_agent_set_attribution(1) == 1, "attribution refused");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its first statistics are written
  const vs_ring& dev = g_seg.rings[1];
  const vs_ring& agent = g_seg.rings[0];
  const uint64_t d0 = __atomic_load_n(dev.head, __ATOMIC_ACQUIRE);

  // Before any step: the context alone. Then the first optimizer's steps
  // count, a second optimizer's do not, the user's marks win.
  *vs_agent_context_slot() = 12;
  alloc_event(Entry::ALLOC, 0x10000);
  vs_agent_mark_from(7, 2, 1);
  alloc_event(Entry::ALLOC, 0x20000);
  vs_agent_mark_from(900, 2, 2);  // a second optimizer: not counted
  *vs_agent_context_slot() = 13;
  alloc_event(Entry::ALLOC, 0x30000);
  vs_agent_mark_from(300, 1, 0);  // the user's mark wins from now on
  alloc_event(Entry::FREE_REQUESTED, 0x10000);
  alloc_event(Entry::FREE_COMPLETED, 0x10000);
  vs_agent_mark_from(8, 2, 1);  // the optimizer no longer counts
  std::thread([] {
    *vs_agent_context_slot() = 99;  // another thread's context is its own
    alloc_event(Entry::ALLOC, 0x40000);
  }).join();
  alloc_event(Entry::ALLOC, 0x50000);
  const auto ev = records(dev, d0);
  CHECK(ev.size() == 7, "%zu device records", ev.size());
  const uint32_t want[7] = {12, 12 | (8u << 24), 13 | (8u << 24), 13 | (46u << 24), 13 | (46u << 24),
                            99 | (46u << 24), 13 | (46u << 24)};
  for (int i = 0; i < 7; i++) CHECK(aux(ev[i]) == want[i], "event %d tag 0x%x, want 0x%x", i, aux(ev[i]), want[i]);
  std::printf("ok   events carry the thread's context and the counted step's tag (7 of 7)\n");

  // A snapshot: definitions first, then each live block with its tag.
  const char* path = "transformer.h.3.attn";
  vs_agent_define_string(1, path, std::strlen(path));
  vs_agent_define_context(12, 1, 1, 0);
  using namespace c10::cuda::CUDACachingAllocator;
  SegmentInfo seg;
  seg.address = 0x10000;
  seg.total_size = 0x50000;
  seg.is_large = true;
  for (int i = 0; i < 5; i++) {
    BlockInfo b;
    b.size = 0x10000;
    b.requested_size = 4096;
    b.allocated = i != 0;  // 0x10000 was freed
    b.active = b.allocated;
    seg.blocks.push_back(b);
  }
  fake::state.segments = {seg};
  const uint64_t a0 = __atomic_load_n(agent.head, __ATOMIC_ACQUIRE);
  // 0x20000 is freed just after the state was read: its snapshot still
  // has its tag (the table is brought up to the snapshot's position only).
  fake::after_snapshot_entry = [] { alloc_event(Entry::FREE_COMPLETED, 0x20000); };
  write_snapshot(-1);
  fake::after_snapshot_entry = nullptr;
  const auto snap = records(agent, a0);
  size_t begin = snap.size(), strings = 0, contexts = 0;
  std::vector<uint64_t> tags;
  for (size_t i = 0; i < snap.size(); i++) {
    if (kind(snap[i]) == VS_K_SNAP_BEGIN && begin == snap.size()) begin = i;
    if (kind(snap[i]) == VS_K_STRING && i < begin) strings++;
    if (kind(snap[i]) == VS_K_CONTEXT && i < begin) contexts++;
    if (kind(snap[i]) == VS_K_SNAP_BLOCK) tags.push_back(snap[i][6]);
  }
  CHECK(begin < snap.size(), "no SNAP_BEGIN");
  CHECK(strings == 1 && contexts == 1, "definitions before the snapshot: %zu strings, %zu contexts", strings,
        contexts);
  const uint64_t want_tags[5] = {0, 12 | (8u << 24), 13 | (8u << 24), 99 | (46u << 24), 13 | (46u << 24)};
  CHECK(tags.size() == 5, "%zu SNAP_BLOCKs", tags.size());
  for (int i = 0; i < 5; i++) {
    CHECK(tags[i] == want_tags[i], "block %d tag 0x%llx, want 0x%llx", i, (unsigned long long)tags[i],
          (unsigned long long)want_tags[i]);
  }
  CHECK(snap[begin][6] & VS_SPAN_EXACT, "the snapshot's position is not exact");
  std::printf("ok   a snapshot sends the definitions first and each live block's tag as of its state (5 of 5)\n");

  // A statistics sample is placed in the device ring: STATS_C after
  // STATS_B, exact (no event raced with the read), at the ring's head.
  const uint64_t s0 = __atomic_load_n(agent.head, __ATOMIC_ACQUIRE);
  write_stats(0);
  const auto stats = records(agent, s0);
  CHECK(stats.size() == 3 && kind(stats[0]) == VS_K_STATS_A && kind(stats[1]) == VS_K_STATS_B &&
            kind(stats[2]) == VS_K_STATS_C,
        "a sample is %zu records", stats.size());
  const uint64_t dh = __atomic_load_n(dev.head, __ATOMIC_ACQUIRE);
  CHECK(aux(stats[2]) == aux(stats[1]) && stats[2][2] == dh && stats[2][3] == dh &&
            (stats[2][4] & VS_SPAN_EXACT) && ((stats[2][4] >> 8) & 0xff) == 1,
        "STATS_C %llu..%llu flags 0x%llx, head %llu", (unsigned long long)stats[2][2],
        (unsigned long long)stats[2][3], (unsigned long long)stats[2][4], (unsigned long long)dh);
  std::printf("ok   a statistics sample is placed exactly in the device ring (STATS_C)\n");

  follower(dev);

  // Command 5: granted steps (bounded) and the step it began at.
  const uint64_t seq = vs_agent_capture_request()[0];
  vs_request req{};
  req.seq = 2;
  req.kind = VS_CMD_CAPTURE_STACKS;
  req.arg = (3ull << 32) | 5000;
  handle(req);
  const uint64_t* words = vs_agent_capture_request();
  CHECK(words[0] == seq + 1 && words[1] == kMaxCaptureSteps && words[2] == 3, "capture request %llu %llu %llu",
        (unsigned long long)words[0], (unsigned long long)words[1], (unsigned long long)words[2]);
  const uint64_t* c = vs_word(&g_seg, g_seg.control_offset);
  CHECK(c[VS_CTL_STATUS / 8] == VS_STATUS_OK && c[VS_CTL_RESULT0 / 8] == kMaxCaptureSteps &&
            c[VS_CTL_RESULT0 / 8 + 1] == 300,
        "answer: status %llu, steps %llu, began at %llu", (unsigned long long)c[VS_CTL_STATUS / 8],
        (unsigned long long)c[VS_CTL_RESULT0 / 8], (unsigned long long)c[VS_CTL_RESULT0 / 8 + 1]);
  std::printf("ok   command 5 is handed to the Python side with its steps bounded to %llu\n",
              (unsigned long long)kMaxCaptureSteps);
  vs_agent_stop(200);
}

int main(int argc, char** argv) {
  table();
  callback_path(argc > 1 ? argv[1] : "/tmp");
  return 0;
}

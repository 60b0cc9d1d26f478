#pragma once
#include <array>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
namespace c10 {
using DeviceIndex = int8_t;
using approx_time_t = uint64_t;
inline approx_time_t getApproximateTime() { return 0; }
namespace cuda {
inline int device_count() { return 1; }
struct CUDAGuard { explicit CUDAGuard(DeviceIndex) {} };
namespace CUDACachingAllocator {
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;
struct trace_time_ { approx_time_t approx_t_; };
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM };
  Action action_; DeviceIndex device_; size_t addr_; void* stream_; size_t size_; MempoolId_t mempool_; trace_time_ time_;
};
struct Stat { int64_t current = 0, peak = 0, allocated = 0, freed = 0; };
using StatArray = std::array<Stat, 3>;
struct DeviceStats { StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes; int64_t num_alloc_retries = 0, num_ooms = 0; };
struct BlockInfo { size_t size = 0, requested_size = 0; bool allocated = false, active = false; };
struct SegmentInfo { DeviceIndex device = 0; size_t address = 0, total_size = 0; void* stream = nullptr; bool is_large = false, is_expandable = false; MempoolId_t owner_private_pool_id; std::vector<BlockInfo> blocks; };
struct SnapshotInfo { std::vector<SegmentInfo> segments; };
struct Allocator {};
Allocator* get();
DeviceStats getDeviceStats(DeviceIndex);
void resetPeakStats(DeviceIndex);
void emptyCache();
SnapshotInfo snapshot(MempoolId_t = {0, 0}, bool = true);
using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
void attachAllocatorTraceTracker(AllocatorTraceTracker);
std::string name();
}}}

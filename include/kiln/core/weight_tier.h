// How an offloaded weight moves between where it is kept and where the kernels of a device read it. Every
// form of offloading (model, group, sequential; kiln/pipelines/offload.h) moves weights through this
// interface only, so a device backend plugs into the same mechanism by giving its DeviceRuntime a tier of its
// own.
//
// The tiers: a weight is kept in its checkpoint file (memory-mapped), may sit in the OS page cache, and is
// "in" when the device's kernels can read it without waiting.
//  - CPU (backends/cpu/host_weight_tier.cpp): "in" is mapped into this process. bring_in maps the file pages
//    (read from disk where the page cache lacks them), send_out hands them back to the OS with the page cache
//    keeping them, evict drops them from the page cache too.
//  - A device with memory of its own (later): bring_in copies the weight into device memory on the
//    backend's transfer stream (kept on the Storage's derived slot, as packed copies are), send_out frees
//    that copy, evict also releases the host pages.
#pragma once

#include <atomic>
#include <cstddef>

namespace kiln {

class Storage;

class WeightTier {
 public:
  virtual ~WeightTier() = default;
  // Brings `weight` in ahead of the kernels that read it; may run on a background thread; stops early once
  // `cancel` is set. Returns the bytes brought in.
  virtual size_t bring_in(const Storage& weight, const std::atomic<bool>& cancel) = 0;
  // Sends it out: it holds no memory of the device until brought in or read again, and comes back quickly
  // (from the page cache) while memory allows.
  virtual void send_out(const Storage& weight) = 0;
  // Sends it out and lets the slower tiers forget it too: for weights not needed again soon (a component that
  // has run), so the memory goes to what runs next.
  virtual void evict(const Storage& weight) = 0;
};

}  // namespace kiln

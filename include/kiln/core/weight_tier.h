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
//  - A device with memory of its own (backends/pjrt/offloaded_weight.h): an offloaded weight is a device
//    tensor backed by its host tensor (offloaded()); bring_in copies the host bytes into device memory,
//    send_out frees that copy, evict also hands the host's file pages back. A kernel that reads a weight
//    whose copy is absent brings it in first, so a wrong guess costs time, never a wrong result.
#pragma once

#include <atomic>
#include <cstddef>

namespace kiln {

class Storage;
class Tensor;

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
  // What a parameter slot holds while its weight is offloaded to this device: a tensor of this device whose
  // bytes are `on_host`'s (a cpu tensor, kept), brought in and sent out through this tier. The cpu's is
  // `on_host` itself.
  virtual Tensor offloaded(const Tensor& on_host) = 0;
};

}  // namespace kiln

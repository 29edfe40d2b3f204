// Reference-counted bytes on a device. A Storage either owns an allocation from the device's allocator
// or borrows memory owned elsewhere (a memory-mapped file) and keeps that owner alive.
//
// Owned memory is taken from the allocator when the bytes are first touched (data()), not when the Storage
// is made: an op's output is allocated when its kernel runs, so memory follows execution order, and an
// intermediate that a fused kernel never writes (DeferAndFuse mode) is never allocated at all.
#pragma once

#include <any>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <typeindex>
#include <utility>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/pending_work.h"

namespace kiln {

class Storage {
 public:
  // How the device's allocator treats the bytes (kiln/core/allocator.h). Transient: an activation, whose
  // block is kept for reuse when it goes, since its size recurs every block and step. Long-lived: a weight's
  // packed copy, which lives as long as its weight; its block makes room in the cache rather than beside it,
  // and goes back to the system when the copy goes (offload dropping it wants the memory back).
  enum class Lifetime { kTransient, kLongLived };
  // `bytes` on `device`, allocated (and counted by the device's allocator) at the first data() call.
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device,
                                           Lifetime lifetime = Lifetime::kTransient);
  // Wraps memory kept alive by `owner` (for example an mmap'ed file); not counted as allocated.
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes, Device device,
                                         std::shared_ptr<void> owner);
  // Borrows read-only pages of a privately mapped file (`owner` keeps the mapping alive). Unlike borrow(),
  // the process may drop these pages from memory at any time (drop_resident_pages): the next read brings
  // them back from the file, unchanged.
  static std::shared_ptr<Storage> borrow_file_pages(const void* data, size_t bytes, Device device,
                                                    std::shared_ptr<void> owner);

  // Wraps a device's handle to its copy of host bytes, a copy the device makes when the bytes are read and
  // may drop again (an offloaded weight on a device with memory of its own: kiln/core/weight_tier.h);
  // `owner` keeps the handle, and through it the host bytes, alive. Not counted as allocated: the device
  // counts its copy while it exists.
  static std::shared_ptr<Storage> borrow_host_backed(void* handle, size_t bytes, Device device,
                                                     std::shared_ptr<void> owner);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // The bytes; allocates them on first use (thread-safe). Throws kiln::Error when the device is out of
  // memory.
  void* data() const {
    void* p = data_.load(std::memory_order_acquire);
    return p != nullptr || bytes_ == 0 ? p : materialize();
  }
  // Whether the bytes exist yet (always true for borrowed storage).
  bool is_allocated() const { return bytes_ == 0 || data_.load(std::memory_order_acquire) != nullptr; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool is_borrowed() const { return borrowed_; }
  bool is_file_pages() const { return file_pages_; }
  bool is_host_backed() const { return host_backed_; }
  // Whether offloading may send these bytes out of the device's reach and bring them back unchanged: file
  // pages (the cpu) and host-backed copies (a device); a converted or computed tensor has no other copy.
  bool can_send_out() const { return file_pages_ || host_backed_; }

  // For file pages (borrow_file_pages), hands the whole pages inside these bytes back to the OS, so they no
  // longer count in the process's resident memory; a no-op for any other storage. Used once a weight has a
  // packed copy that every later call reads instead: without it the file pages and the packed copy would
  // both stay resident, twice the weights.
  void drop_resident_pages() const;
  // For file pages, also asks the OS to drop them from the page cache (MADV_PAGEOUT where the kernel has it),
  // not just from this process: for weights that will not be read again soon (an offloaded component), so the
  // memory goes to what runs next. A no-op for any other storage.
  void evict_file_pages() const;
  // For file pages, brings them into this process ahead of a read (group offload's prefetch): reads them from
  // the file where they are not in the page cache and maps them, so the kernel that reads them later takes
  // no page faults. Works in slices and stops early once `cancel` is set; returns the bytes brought in. A
  // no-op (0) for any other storage.
  size_t prefetch_resident_pages(const std::atomic<bool>& cancel) const;

  // The queue whose work writes these bytes last (an op queued on a stream or recorded in a deferred graph),
  // set when that op is queued or recorded; empty once nothing is pending that anyone must wait for.
  void set_pending_write(std::weak_ptr<PendingWork> work) const {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_ = std::move(work);
  }
  std::shared_ptr<PendingWork> pending_write() const {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    return pending_.lock();
  }
  // From the host, before reading the bytes: runs and waits for the pending write, if any (throws its
  // queue's failure, naming the op).
  void wait_for_writes() const {
    if (const std::shared_ptr<PendingWork> work = pending_write()) work->wait();
  }

  // Slots where backends keep derived forms of this storage (a weight prepacked for the CPU's matmul, a copy
  // in a device's memory), one per type T, so each is built once, none evicts another, and all are freed
  // together with the storage.
  template <class T, class Make>
  std::shared_ptr<T> derived(Make&& make) {
    std::lock_guard<std::mutex> lock(derived_mutex_);
    for (auto& [type, value] : derived_)
      if (type == std::type_index(typeid(T))) return std::any_cast<std::shared_ptr<T>>(value);
    std::shared_ptr<T> made = make();
    derived_.emplace_back(std::type_index(typeid(T)), made);
    return made;
  }
  // Drops every derived form (the weights changed, or were sent out).
  void clear_derived() {
    std::lock_guard<std::mutex> lock(derived_mutex_);
    derived_.clear();
  }

 private:
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner, bool borrowed,
          bool file_pages = false, bool host_backed = false, Lifetime lifetime = Lifetime::kTransient)
      : data_(data),
        bytes_(bytes),
        device_(device),
        owner_(std::move(owner)),
        borrowed_(borrowed),
        file_pages_(file_pages),
        host_backed_(host_backed),
        lifetime_(lifetime) {}

  void* materialize() const;

  mutable std::atomic<void*> data_;
  size_t bytes_;
  Device device_;
  std::shared_ptr<void> owner_;
  bool borrowed_;
  bool file_pages_;
  bool host_backed_;
  Lifetime lifetime_;
  mutable std::mutex materialize_mutex_;
  mutable std::mutex pending_mutex_;
  mutable std::weak_ptr<PendingWork> pending_;
  std::mutex derived_mutex_;
  std::vector<std::pair<std::type_index, std::any>> derived_;
};

}  // namespace kiln

#include "kiln/core/signals.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>

#include "core/signal_registry.h"
#include "kiln/core/error.h"

namespace kiln {

namespace {

// Paths longer than this are kept truncated: the handler's message is then cut, and a temporary file with
// such a path is left to normal unwinding.
constexpr size_t kPathBytes = 1024;

enum SlotState : int { kFree = 0, kFilling = 1, kReady = 2 };

struct TempSlot {
  std::atomic<int> state{kFree};
  char path[kPathBytes];
};

struct MappedSlot {
  std::atomic<int> state{kFree};
  const char* base = nullptr;
  size_t size = 0;
  int fd = -1;
  off_t size_at_map = 0;
  timespec mtime_at_map{};
  char path[kPathBytes];
};

TempSlot g_temp_files[64];
MappedSlot g_mapped_files[1024];
// Normal code takes this to change or fstat a slot; handlers never do.
std::mutex g_registry_mutex;

std::atomic<int> g_stop_signal{0};
struct sigaction g_previous_sigbus {};

// ---- async-signal-safe helpers (write(2), unlink(2), no allocation)

void write_all(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void write_str(const char* s) {
  write_all(s, std::strlen(s));
}
void write_number(uint64_t v) {
  char buf[24];
  size_t i = sizeof buf;
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  write_all(buf + i, sizeof buf - i);
}

void remove_temp_files_now() {
  for (TempSlot& slot : g_temp_files)
    if (slot.state.load(std::memory_order_acquire) == kReady) ::unlink(slot.path);
}

void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) {
    // A second request: the user wants out now.
    remove_temp_files_now();
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  write_str(sig == SIGINT ? "\nkiln: SIGINT: stopping at the next step (again to quit at once)\n"
                          : "\nkiln: SIGTERM: stopping at the next step (again to quit at once)\n");
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const char* addr = static_cast<const char*>(info->si_addr);
  for (MappedSlot& slot : g_mapped_files) {
    if (slot.state.load(std::memory_order_acquire) != kReady) continue;
    if (addr < slot.base || addr >= slot.base + slot.size) continue;
    // Several threads (a kernel's OpenMP team, two contexts' streams) may fault on the same pages at once:
    // the first reports and ends the process, the others wait for that, so the message is written once,
    // whole.
    static std::atomic<bool> reporting{false};
    if (reporting.exchange(true))
      for (;;) ::pause();
    write_str("kiln: error: ");
    write_str(slot.path);
    write_str(": the file was truncated or changed while Kiln was reading it (bus error at byte ");
    write_number(static_cast<uint64_t>(addr - slot.base));
    write_str(" of the ");
    write_number(slot.size);
    write_str(" bytes mapped); nothing was written. Restore or re-download the file and run again.\n");
    remove_temp_files_now();
    ::_exit(74);  // EX_IOERR
  }
  // Not a mapping of Kiln's: put the previous action back; returning repeats the fault under it.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  (void)sig;
  (void)context;
}

template <class Slot, size_t N>
Slot* claim_slot(Slot (&slots)[N], int& index) {
  for (size_t i = 0; i < N; ++i) {
    int expected = kFree;
    if (slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acq_rel)) {
      index = static_cast<int>(i);
      return &slots[i];
    }
  }
  index = -1;
  return nullptr;
}

void copy_path(char (&dst)[kPathBytes], const std::string& path) {
  const size_t n = std::min(path.size(), kPathBytes - 1);
  std::memcpy(dst, path.data(), n);
  dst[n] = '\0';
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace

namespace detail {

int register_temp_file(const std::string& path) {
  if (path.size() >= kPathBytes) return -1;
  int index;
  TempSlot* slot = claim_slot(g_temp_files, index);
  if (!slot) return -1;
  copy_path(slot->path, path);
  slot->state.store(kReady, std::memory_order_release);
  return index;
}

void unregister_temp_file(int slot) {
  if (slot >= 0) g_temp_files[slot].state.store(kFree, std::memory_order_release);
}

int register_mapped_file(const void* base, size_t size, int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -1;
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  int index;
  MappedSlot* slot = claim_slot(g_mapped_files, index);
  if (!slot) return -1;
  slot->base = static_cast<const char*>(base);
  slot->size = size;
  slot->fd = fd;
  slot->size_at_map = st.st_size;
  slot->mtime_at_map = st.st_mtim;
  copy_path(slot->path, path);
  slot->state.store(kReady, std::memory_order_release);
  return index;
}

void unregister_mapped_file(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_mapped_files[slot].state.store(kFree, std::memory_order_release);
}

}  // namespace detail

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction stop {};
    stop.sa_handler = on_stop_signal;
    sigemptyset(&stop.sa_mask);
    stop.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &stop, nullptr);
    ::sigaction(SIGTERM, &stop, nullptr);
    ::signal(SIGXFSZ, SIG_IGN);
    struct sigaction bus {};
    bus.sa_sigaction = on_sigbus;
    sigemptyset(&bus.sa_mask);
    bus.sa_flags = SA_SIGINFO;
    ::sigaction(SIGBUS, &bus, &g_previous_sigbus);
  });
}

int stop_signal() {
  return g_stop_signal.load(std::memory_order_relaxed);
}

void throw_if_stop_requested(std::string_view where) {
  const int sig = stop_signal();
  KILN_CHECK(sig == 0, "stopped by " << signal_name(sig) << " " << where << "; nothing was written");
}

void request_stop(int signal) {
  g_stop_signal.store(signal, std::memory_order_relaxed);
}

void clear_stop_request() {
  g_stop_signal.store(0, std::memory_order_relaxed);
}

void check_mapped_files() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (MappedSlot& slot : g_mapped_files) {
    if (slot.state.load(std::memory_order_acquire) != kReady) continue;
    struct stat st {};
    if (::fstat(slot.fd, &st) != 0) continue;
    KILN_CHECK(st.st_size >= slot.size_at_map,
               slot.path << ": truncated while in use (" << slot.size_at_map << " bytes when Kiln opened it, "
                         << st.st_size
                         << " now); its weights can no longer be read. Restore or re-download the file.");
    KILN_CHECK(
        st.st_size == slot.size_at_map && st.st_mtim.tv_sec == slot.mtime_at_map.tv_sec &&
            st.st_mtim.tv_nsec == slot.mtime_at_map.tv_nsec,
        slot.path << ": modified while in use (its size or modification time changed since Kiln opened "
                     "it); its weights can no longer be trusted. Run again once the file is complete.");
  }
}

}  // namespace kiln

// Executables compiled from StableHLO text, cached per client by the text itself (which names the op or
// region, its shapes, dtypes, views and attributes): strict eager compiles each distinct op call once,
// deferred-and-fused each distinct region once, compiled mode each distinct forward (or block) once. Behind
// the memory cache is the disk cache (executable_disk_cache.h), so a second process loads what the first
// compiled. KILN_LOG=compile reports every compile with its time, every disk hit, and the first memory hit of
// each executable (later hits are counted only).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/pjrt/cross_compile.h"
#include "backends/pjrt/pjrt_client.h"

namespace kiln::pjrt {

// The executable for `module_text` on `client`, compiled on first use. `what` names the call in the log
// ("add(float32[2, 3], ...)", "region[mul, linear, ...] on xla-cpu:0 -> ...").
//
// `replica_devices` (empty: a portable 1 x 1 executable) compiles one replica per device listed, in that
// order, for the modules of in-process collectives; the devices are part of the key.
//
// When KILN_PJRT_CROSS_COMPILE names targets (cross_compile.h), a module new to this process is also compiled
// for them; `lower_for` lowers the program for a target whose lowering differs (empty: the same text).
std::shared_ptr<Executable> cached_executable(Client& client, const std::string& module_text,
                                              const std::string& what,
                                              const std::vector<int>& replica_devices = {},
                                              const LowerFor& lower_for = {});

struct ExecutableCacheStats {
  int64_t compiles = 0;       // modules compiled by the plugin
  int64_t hits = 0;           // served from memory
  int64_t disk_hits = 0;      // loaded from the disk cache
  int64_t disk_rejected = 0;  // disk entries found corrupt or unloadable (warned about, compiled again)
};
ExecutableCacheStats executable_cache_stats();

// Forgets the executables in memory (as a new process would start); the disk cache stays.
void clear_executable_memory_cache();

}  // namespace kiln::pjrt

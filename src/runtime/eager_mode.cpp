#include "kiln/runtime/eager_mode.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {

namespace {

// -1: never set, the environment decides.
std::atomic<int> g_process_mode{-1};

// Guards of this thread, innermost last.
std::vector<EagerMode>& guard_stack() {
  thread_local std::vector<EagerMode> stack;
  return stack;
}

// true for "1", false for unset, "" or "0"; anything else is a mistake worth reporting.
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s(v);
  if (s.empty() || s == "0") return false;
  KILN_CHECK(s == "1", name << ": expected 0 or 1, got '" << s << "'");
  return true;
}

EagerMode environment_default_once() {
  // A throwing initialiser leaves the static unset, so a bad environment is reported at every dispatch
  // instead of being forgotten after the first.
  static const EagerMode mode = eager_mode_from_environment();
  return mode;
}

}  // namespace

std::string_view eager_mode_name(EagerMode mode) {
  switch (mode) {
    case EagerMode::DeferNever:
      return "DeferNever";
    case EagerMode::DeferNeverLaunchBlocking:
      return "DeferNeverLaunchBlocking";
    case EagerMode::DeferAndFuse:
      return "DeferAndFuse";
  }
  return "unknown";
}

EagerMode eager_mode_from_environment() {
  if (env_flag("KILN_LAUNCH_BLOCKING")) return EagerMode::DeferNeverLaunchBlocking;
  if (env_flag("KILN_DEFER_AND_FUSE")) return EagerMode::DeferAndFuse;
  return EagerMode::DeferNever;
}

EagerMode eager_mode() {
  const auto& stack = guard_stack();
  if (!stack.empty()) return stack.back();
  if (const std::optional<EagerMode> mode = current_context().eager_mode_setting()) return *mode;
  const int process = g_process_mode.load(std::memory_order_relaxed);
  if (process >= 0) return static_cast<EagerMode>(process);
  return environment_default_once();
}

void set_eager_mode(EagerMode mode) {
  g_process_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

EagerModeGuard::EagerModeGuard(EagerMode mode) {
  guard_stack().push_back(mode);
}

EagerModeGuard::~EagerModeGuard() {
  guard_stack().pop_back();
}

}  // namespace kiln

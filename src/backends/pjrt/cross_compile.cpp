#include "backends/pjrt/cross_compile.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "backends/pjrt/cross_targets.h"
#include "kiln/core/bytes.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"

namespace kiln::pjrt {
namespace {

struct State {
  std::mutex mutex;
  std::set<std::pair<std::string, size_t>> compiled;  // (target, hash of the text)
  std::vector<CrossCompileSummary> stats;
};
State& state() {
  static State* s = new State;  // used from worker threads until exit
  return *s;
}

CrossCompileSummary& stats_of(State& s, const CrossTarget& t) {
  for (CrossCompileSummary& st : s.stats)
    if (st.target == t.name) return st;
  CrossCompileSummary st;
  st.target = t.name;
  st.device_kind = t.topology->device_kind();
  s.stats.push_back(st);
  return s.stats.back();
}

std::string bytes_or_unknown(int64_t bytes) {
  return bytes < 0 ? std::string("unreported") : format_bytes(bytes);
}

}  // namespace

std::vector<std::string> cross_compile_targets() {
  const char* env = std::getenv("KILN_PJRT_CROSS_COMPILE");
  std::vector<std::string> names;
  if (!env) return names;
  std::istringstream list(env);
  for (std::string name; std::getline(list, name, ',');) {
    const size_t first = name.find_first_not_of(" \t"), last = name.find_last_not_of(" \t");
    if (first != std::string::npos) names.push_back(name.substr(first, last - first + 1));
  }
  return names;
}

void cross_compile(const std::string& own_platform, const std::string& own_text, const LowerFor& lower_for,
                   int num_replicas, const std::string& what) {
  const std::vector<std::string> names = cross_compile_targets();
  if (names.empty()) return;
  const hlo::LoweringTarget own = hlo::lowering_target(own_platform);
  State& s = state();
  // One at a time: the targets' compilers are large and each compile is short next to a pipeline's run.
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const std::string& name : names) {
    const CrossTarget target = cross_target(name);
    const hlo::LoweringTarget theirs = hlo::lowering_target(target.platform);
    const std::string text = lower_for && !hlo::emits_the_same(theirs, own) ? lower_for(theirs) : own_text;
    const std::pair<std::string, size_t> key{name, std::hash<std::string>{}(text)};
    if (!s.compiled.insert(key).second) continue;
    TargetProgram program;
    try {
      program = target.topology->compile(text, num_replicas, 1);
    } catch (const Error& e) {
      s.compiled.erase(key);
      KILN_FAIL("cross-compiling " << what << " for " << name << " (" << target.topology->device_kind()
                                   << "): " << e.what());
    }
    CrossCompileSummary& st = stats_of(s, target);
    ++st.programs;
    st.seconds += program.seconds;
    if (program.scratch_bytes > st.largest_scratch_bytes) {
      st.largest_scratch_bytes = program.scratch_bytes;
      st.largest_scratch_program = what;
    }
    const int64_t total = std::max<int64_t>(program.argument_bytes, 0) +
                          std::max<int64_t>(program.output_bytes, 0) +
                          std::max<int64_t>(program.scratch_bytes, 0);
    if (total > st.largest_program_bytes) {
      st.largest_program_bytes = total;
      st.largest_program = what;
    }
    if (log_enabled("compile")) {
      std::ostringstream msg;
      msg << "cross-compiled for " << name << " (" << st.device_kind << ") " << what << " in "
          << program.seconds * 1e3 << " ms: scratch " << bytes_or_unknown(program.scratch_bytes)
          << ", arguments " << bytes_or_unknown(program.argument_bytes) << ", outputs "
          << bytes_or_unknown(program.output_bytes) << ", code " << bytes_or_unknown(program.code_bytes);
      log("compile", msg.str());
    }
  }
}

}  // namespace kiln::pjrt

namespace kiln {

std::vector<CrossCompileSummary> cross_compile_summary() {
  pjrt::State& s = pjrt::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void reset_cross_compile_summary() {
  pjrt::State& s = pjrt::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.clear();
  s.compiled.clear();
}

}  // namespace kiln

#include "graph/jit_compiler.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::graph {

namespace {

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  std::istringstream in(s);
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

// Runs argv (PATH lookup for argv[0]) with stdin from /dev/null and stdout+stderr into `log_path`.
// Returns the exit status, or -1 when the program could not be started.
int run_process(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (!WIFEXITED(status)) return -1;
  // 127: the shell convention (and glibc's, for a child that failed to exec) for "command not found".
  return WEXITSTATUS(status);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string unique_temp_path(const char* what) {
  static std::atomic<int> counter{0};
  return (std::filesystem::temp_directory_path() /
          ("kiln-jit-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + what))
      .string();
}

}  // namespace

JitCompiler::JitCompiler(std::string command) {
  if (!command.empty()) {
    candidates_.push_back(split_words(command));
    description_ = command;
    return;
  }
  const char* cxx = std::getenv("CXX");
  if (cxx && *cxx) {
    // An explicit CXX is honoured, even when it does not work: the user asked for that compiler.
    candidates_.push_back(split_words(cxx));
    description_ = std::string("CXX=") + cxx;
  } else {
    candidates_ = {{"c++"}, {"g++"}};
    description_ = "c++, g++ (CXX is not set)";
  }
}

void JitCompiler::detect() {
  if (detected_) return;
  detected_ = true;
  const std::string log = unique_temp_path("version.txt");
  for (const auto& cand : candidates_) {
    if (cand.empty()) continue;
    std::vector<std::string> args = cand;
    args.push_back("--version");
    const int rc = run_process(args, log);
    const std::string out = rc == 0 ? read_text(log) : std::string();
    const std::string first = out.substr(0, out.find('\n'));
    if (rc == 0 && !first.empty()) {
      argv0_ = cand;
      version_ = first;
      break;
    }
  }
  std::error_code ec;
  std::filesystem::remove(log, ec);
}

bool JitCompiler::available() {
  detect();
  return !argv0_.empty();
}

const std::string& JitCompiler::version() {
  detect();
  return version_;
}

const char* JitCompiler::base_flags() {
  // No -ffast-math and no FMA contraction: fused results must round exactly like the unfused kernels.
  return "-std=c++20 -O2 -fPIC -shared -fopenmp -ffp-contract=off -fno-fast-math -fvisibility=hidden "
         "-Wno-psabi";
}

std::optional<std::string> JitCompiler::compile(const std::string& source_path, const std::string& so_path,
                                                const std::string& isa_flags) {
  if (!available()) return "no C++ compiler (" + description_ + ")";
  std::vector<std::string> args = argv0_;
  for (const std::string& f : split_words(base_flags())) args.push_back(f);
  for (const std::string& f : split_words(isa_flags)) args.push_back(f);
  args.insert(args.end(), {"-o", so_path, source_path});
  const std::string log = so_path + ".log";
  const int rc = run_process(args, log);
  std::string out = read_text(log);
  std::error_code ec;
  std::filesystem::remove(log, ec);
  if (rc == 0 && std::filesystem::exists(so_path, ec)) return std::nullopt;
  if (out.size() > 4000) out = out.substr(0, 4000) + "\n...";
  std::string cmd;
  for (const std::string& a : args) cmd += a + ' ';
  return "`" + cmd + "` exited with status " + std::to_string(rc) + ":\n" + out;
}

}  // namespace kiln::graph

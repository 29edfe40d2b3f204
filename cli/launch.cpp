// `kiln launch -n N [--hosts a,b] -- generate ...` (or `-- serve ...`): starts N copies of this kiln under
// mpirun, one per device, with --tp N added to the command. A thin wrapper: mpirun places and supervises the
// processes (and ends them all when one dies); Kiln has no process manager of its own.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "kiln/core/error.h"

namespace kiln::cli {

namespace {

struct LaunchArgs {
  int processes = 1;
  std::string hosts;
  bool oversubscribe = false;
  std::string mpirun = "mpirun";
  std::vector<std::string> command;
};

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  return false;
}

[[noreturn]] void run_launch(const LaunchArgs& args) {
  KILN_CHECK(
      !args.command.empty() && (args.command.front() == "generate" || args.command.front() == "serve"),
      "launch: expected the kiln command to run after `--` (generate or serve), e.g. `kiln launch -n 2 -- "
      "generate --model M --prompt P`");
  std::vector<std::string> argv = {args.mpirun, "-np", std::to_string(args.processes)};
  if (!args.hosts.empty()) argv.insert(argv.end(), {"--host", args.hosts});
  if (args.oversubscribe) argv.push_back("--oversubscribe");
  argv.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  argv.insert(argv.end(), args.command.begin(), args.command.end());
  if (!has_flag(args.command, "--tp")) argv.insert(argv.end(), {"--tp", std::to_string(args.processes)});
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  execvp(c_argv.front(), c_argv.data());
  KILN_FAIL("launch: cannot run '" << args.mpirun << "': " << std::strerror(errno)
                                   << " (install OpenMPI: apt-get install openmpi-bin)");
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("launch",
                                     "run a kiln command as N processes under mpirun (tensor parallelism): "
                                     "launch -n N -- generate (or serve) ...");
  cmd->add_option("-n,--nproc", args->processes, "number of processes (devices), one rank each")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--hosts", args->hosts,
                  "comma-separated hosts for mpirun's --host (default: this machine)");
  cmd->add_flag("--oversubscribe", args->oversubscribe,
                "allow more processes than cores (mpirun --oversubscribe)");
  cmd->add_option("--mpirun", args->mpirun, "the mpirun to use")->capture_default_str();
  cmd->add_option("command", args->command, "the kiln command and its flags, after --")->required();
  cmd->callback([args] { run_launch(*args); });
}

}  // namespace kiln::cli

// The flags of `kiln generate`: the input is the argument list, NUL-separated. CLI11 converts the numbers
// (--height, --steps, --guidance, --seed, --max-sequence-length, --vae-tile-size, --blocks-per-group) and the
// sizes (--packed-weights, --max-memory), then the command's up-front checks run (cli/generate_args.h). The
// model is always one that does not exist, so a run that passes every check ends at "no such model" before
// loading anything; --output always names the scratch folder and --tp is dropped (no process group is
// started), so the fuzzer writes nothing outside it.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "fuzz_support.h"

using namespace kiln;

namespace {

bool forced(const std::string& arg) {
  for (const char* flag : {"--model", "--transformer", "--output", "--tp"})
    if (arg.rfind(flag, 0) == 0) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string model = fuzz::scratch_dir() + "/no-such-model";
  static const std::string output = fuzz::scratch_dir() + "/out.png";
  std::vector<std::string> args = {"kiln", "generate", "--model", model, "--output", output};
  for (std::string_view a :
       fuzz::split({reinterpret_cast<const char*>(data), size}, std::string_view("\0", 1), 48))
    if (!forced(std::string(a))) args.emplace_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());

  CLI::App app{"kiln"};
  app.require_subcommand(1);
  cli::add_generate_command(app);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    fuzz::require(false, "a generate run that did not fail on the missing model");
  } catch (const CLI::ParseError&) {
    // A flag CLI11 refused (bad number, unknown flag, value out of a CLI::Range): reported with usage.
  } catch (const Error& e) {
    fuzz::require(*e.what() != '\0', "an empty error message");
  }
  return 0;
}

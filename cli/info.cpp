#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "kiln/io/safetensors.h"

namespace kiln::cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print what a checkpoint holds");
  auto path = std::make_shared<std::string>();
  cmd->add_option("model", *path, "a .safetensors file")->required();
  cmd->callback([path] {
    io::SafetensorsFile file(*path);
    std::map<std::string, int64_t> params_by_dtype;
    int64_t total = 0;
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      const int64_t n = shape_numel(info.shape);
      params_by_dtype[info.stored_dtype] += n;
      total += n;
    }
    std::printf("%s\n  tensors: %zu\n  parameters: %lld\n", path->c_str(), file.names().size(),
                static_cast<long long>(total));
    for (const auto& [dtype, n] : params_by_dtype) std::printf("    %-8s %lld\n", dtype.c_str(), static_cast<long long>(n));
  });
}

}  // namespace kiln::cli

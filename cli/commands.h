#pragma once

#include <CLI/CLI.hpp>

namespace kiln::cli {

// `kiln info MODEL`: what a checkpoint file or model folder holds.
void add_info_command(CLI::App& app);
// `kiln generate --model M --prompt P ...`: text to image.
void add_generate_command(CLI::App& app);
// `kiln serve --model M [--model M2 ...]`: image generation over HTTP (cli/serve/, its own library).
void add_serve_command(CLI::App& app);
// `kiln launch -n N [--hosts ...] -- generate ...`: the command as N ranks under mpirun.
void add_launch_command(CLI::App& app);

}  // namespace kiln::cli

// The `kiln` command line. Thin by design: it parses flags and calls the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "kiln/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Kiln: diffusion transformers from diffusers checkpoints, in C++"};
  app.require_subcommand(1);
  kiln::cli::add_info_command(app);
  kiln::cli::add_generate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

// The `kiln` command line. Thin by design: it parses flags and calls the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/core/signals.h"
#include "kiln/dist/process_group.h"

int main(int argc, char** argv) {
  // Ctrl-C / SIGTERM stop at the next step, a file-size limit is an error, a truncated checkpoint a message.
  kiln::install_signal_handlers();
  CLI::App app{"Kiln: diffusion models from diffusers checkpoints, in C++"};
  app.require_subcommand(1);
  kiln::cli::add_info_command(app);
  kiln::cli::add_generate_command(app);
  kiln::cli::add_serve_command(app);
  kiln::cli::add_launch_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // One of several ranks: end them all now (naming this rank), or the others would wait forever in
    // their next collective.
    if (kiln::dist::world_size() > 1) kiln::dist::abort_group(e.what());
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    // A stop request ends like the signal would have, as shells report it (130 for SIGINT, 143 for SIGTERM).
    return kiln::stop_requested() ? 128 + kiln::stop_signal() : 1;
  }
  kiln::dist::destroy_process_group();
  return 0;
}

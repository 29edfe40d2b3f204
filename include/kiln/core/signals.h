// What Kiln does with signals once an application hands them over (kiln generate does, first thing), and
// the checks that make a run end cleanly instead of crashing or leaving files behind:
//
//  - SIGINT, SIGTERM: a stop request. The handler only records the signal (and says so on stderr); the run
//    stops at its next safe point, where throw_if_stop_requested() throws a kiln::Error naming the signal, so
//    that unwinding removes the temporary files of unfinished writes (io::AtomicFile) and nothing partial is
//    left. A second signal ends the process at once, after removing those temporary files.
//  - SIGXFSZ: ignored, so that a write beyond a file-size limit (ulimit -f) fails with EFBIG and is reported
//    as an error naming the file, instead of killing the process.
//  - SIGBUS on a memory-mapped checkpoint (the file was truncated while in use): the message names the file,
//    the temporary files are removed and the process exits with status 74 (EX_IOERR) instead of dumping
//    core. Unwinding from a fault inside a kernel is not safe, so this is the one path that does not throw;
//    check_mapped_files() catches the same change as a kiln::Error when it is called first (kiln generate
//    calls it before each component and each denoising step). A SIGBUS anywhere else keeps its default.
#pragma once

#include <string_view>

namespace kiln {

// Installs the handlers above (idempotent). Without it, signals keep whatever action the application set.
void install_signal_handlers();

// The signal that requested a stop (SIGINT, SIGTERM), or 0.
int stop_signal();
inline bool stop_requested() {
  return stop_signal() != 0;
}
// Throws kiln::Error ("stopped by SIGINT <where>") when a stop was requested.
void throw_if_stop_requested(std::string_view where);
// Requests a stop as the handler does (for applications with handlers of their own, and for tests).
void request_stop(int signal);
void clear_stop_request();

// Throws kiln::Error naming the first memory-mapped file (checkpoint, GGUF) whose size or modification time
// changed since it was mapped: its pages can no longer be trusted, and those past a new end of file would
// raise SIGBUS when read.
void check_mapped_files();

}  // namespace kiln

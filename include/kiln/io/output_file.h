// Files Kiln writes (images, safetensors) appear complete or not at all: the bytes go to a temporary file in
// the destination's folder, renamed over the destination once flushed; a failure or a stop removes it.
#pragma once

#include <string>

namespace kiln::io {

// Checks, before any work is spent, that `path` can be written that way: its folder exists and accepts a
// new file, and `path` is not a directory or a device. Throws kiln::Error naming `path` and the reason.
// Creates and removes one empty temporary file; an existing `path` is left untouched.
void check_output_writable(const std::string& path);

}  // namespace kiln::io

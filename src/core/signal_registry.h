// The registries that signal handlers read (kiln/core/signals.h): fixed tables of plain data, filled and
// emptied by normal code and read without locks or allocation, so that a handler may walk them.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::detail {

// A temporary file to remove if the process is ended by a signal; returns a slot (-1 when the table is full,
// in which case only normal unwinding removes the file).
int register_temp_file(const std::string& path);
void unregister_temp_file(int slot);

// A memory mapping of [base, base + size) of the file open as `fd` (kept open by the caller for as long as
// the mapping lives), so that SIGBUS inside it is reported with `path` and check_mapped_files() can fstat it.
int register_mapped_file(const void* base, size_t size, int fd, const std::string& path);
void unregister_mapped_file(int slot);

}  // namespace kiln::detail

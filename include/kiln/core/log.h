// Warnings for the person at the terminal ("kiln: warning: ..." on stderr), and a way for tests and
// embedding applications to receive them instead.
#pragma once

#include <functional>
#include <string>

namespace kiln {

void warn(const std::string& message);
// Replaces where warnings go (nullptr restores stderr); returns the previous handler.
using WarningHandler = std::function<void(const std::string&)>;
WarningHandler set_warning_handler(WarningHandler handler);

}  // namespace kiln

// Warnings for the person at the terminal ("kiln: warning: ..." on stderr), and a way for tests and
// embedding applications to receive them instead.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace kiln {

void warn(const std::string& message);
// Replaces where warnings go (nullptr restores stderr); returns the previous handler.
using WarningHandler = std::function<void(const std::string&)>;
WarningHandler set_warning_handler(WarningHandler handler);

// Explanations on request: KILN_LOG is a comma-separated list of topics ("compile": what was compiled and
// why — a new graph structure, a new input shape; "graph": the plan of every lazy-graph flush; "memory": how
// a pipeline holds its weights; "offload": what offloading brought in and released, and when; "matmul": which
// instruction bf16 products run on, and why; "all").
// Messages go to stderr as "kiln[topic 12.345s]: ..." (seconds since the first message) unless a log handler
// is set.
bool log_enabled(std::string_view topic);
void log(std::string_view topic, const std::string& message);
// Replaces where log messages go (nullptr restores stderr); returns the previous handler. The handler gets
// "topic: message".
WarningHandler set_log_handler(WarningHandler handler);
// Overrides KILN_LOG for this process (tests; `kiln generate --log`); an empty string turns logging off.
void set_log_topics(const std::string& topics);

}  // namespace kiln

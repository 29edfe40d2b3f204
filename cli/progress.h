// A one-line progress bar on stderr: redrawn in place on a terminal, one line per update otherwise (logs).
#pragma once

#include <chrono>
#include <string>

namespace kiln::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, int total);
  // Marks `done` of `total` as complete; `detail` is appended (a component name, a step time).
  void update(int done, const std::string& detail = "");
  void finish();
  // Seconds since the bar was created.
  double elapsed() const;

 private:
  std::string label_;
  int total_;
  bool tty_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln::cli

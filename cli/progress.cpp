#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kiln::cli {

ProgressBar::ProgressBar(std::string label, int total)
    : label_(std::move(label)),
      total_(total),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

double ProgressBar::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::update(int done, const std::string& detail) {
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? done * kWidth / total_ : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "%s%-10s [%s] %d/%d %s%s", tty_ ? "\r\033[K" : "", label_.c_str(), bar.c_str(), done,
               total_, detail.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace kiln::cli

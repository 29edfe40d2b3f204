// Writes that end early (a stop request, a file-size limit, a full filesystem, an unwritable destination)
// leave no temporary file and never touch an existing file (io/atomic_file.h, kiln/io/output_file.h).
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "io/io_test_util.h"
#include "kiln/core/signals.h"
#include "kiln/io/output_file.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::read_bytes;
using testing::temp_dir;
using testing::write_bytes;

size_t entries_in(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// `bytes` written through an AtomicFile onto `path`; returns the kiln::Error's message, "" when it committed.
std::string write_atomically(const std::string& path, size_t bytes) {
  try {
    io::AtomicFile f(path);
    const std::string chunk(4096, 'n');
    for (size_t done = 0; done < bytes; done += chunk.size())
      f.write(chunk.data(), std::min(chunk.size(), bytes - done));
    f.commit();
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(AtomicFile, StopRequestedBeforeCommitWritesNothing) {
  const std::string dir = temp_dir("atomic_stop");
  const std::string path = dir + "/image.png";
  write_bytes(path, "old");
  request_stop(SIGTERM);
  const std::string message = write_atomically(path, 10000);
  clear_stop_request();
  EXPECT_TRUE(testing::has_all(message, {"stopped by SIGTERM", "before " + path + " was complete"}));
  EXPECT_EQ(read_bytes(path), "old");
  EXPECT_EQ(entries_in(dir), 1u);  // no temporary file left
  EXPECT_EQ(write_atomically(path, 10), "");
  EXPECT_EQ(read_bytes(path).size(), 10u);
}

TEST(AtomicFile, FileSizeLimitIsAnErrorAndKeepsTheOldFile) {
  const std::string dir = temp_dir("atomic_fsize");
  const std::string path = dir + "/image.png";
  write_bytes(path, "old");
  install_signal_handlers();  // SIGXFSZ ignored: the write fails with EFBIG instead of killing the process
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 8192;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string message = write_atomically(path, 100000);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  EXPECT_TRUE(testing::has_all(message, {path, "write failed", "File too large"}));
  EXPECT_EQ(read_bytes(path), "old");
  EXPECT_EQ(entries_in(dir), 1u);
}

// A filesystem that fills up: a 64 KiB tmpfs mounted in a child's own mount namespace (skipped where the
// test may not mount one).
TEST(AtomicFile, FullFilesystemIsAnErrorAndKeepsTheOldFile) {
  const std::string dir = temp_dir("atomic_enospc");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0)
      ::_exit(77);
    const std::string path = dir + "/image.png";
    if (write_atomically(path, 1000) != "") ::_exit(1);
    const std::string message = write_atomically(path, 1 << 20);
    const bool ok = message.find("No space left on device") != std::string::npos &&
                    read_bytes(path).size() == 1000 && entries_in(dir) == 1;
    ::_exit(ok ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the first write failed, 2: the full write was not refused cleanly";
}

TEST(AtomicFile, RefusesToReplaceADevice) {
  EXPECT_KILN_ERROR(io::AtomicFile("/dev/null"), "/dev/null", "not a regular file");
}

TEST(OutputFile, UnwritableDestinationsAreRefusedUpFront) {
  const std::string dir = temp_dir("output_probe");
  EXPECT_KILN_ERROR(io::check_output_writable(dir + "/missing/out.png"), "missing/out.png", "does not exist");
  EXPECT_KILN_ERROR(io::check_output_writable(dir), dir, "is a directory");
  // Not even root may create files in /proc.
  EXPECT_KILN_ERROR(io::check_output_writable("/proc/kiln-test.png"), "/proc/kiln-test.png",
                    "cannot create a file in /proc");
  write_bytes(dir + "/old.png", "old");
  io::check_output_writable(dir + "/old.png");
  EXPECT_EQ(read_bytes(dir + "/old.png"), "old");
  EXPECT_EQ(entries_in(dir), 1u);  // the probe's temporary file is gone
}

TEST(AtomicFileDeathTest, SecondSignalQuitsAtOnceAndRemovesTemporaryFiles) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = temp_dir("atomic_second_signal");
  EXPECT_EXIT(
      {
        install_signal_handlers();
        io::AtomicFile f(dir + "/image.png");
        f.write("partial", 7);
        std::raise(SIGINT);  // a stop request: the process goes on
        if (!stop_requested()) std::_Exit(3);
        std::raise(SIGINT);  // again: ends now, by the signal
        std::_Exit(4);
      },
      ::testing::KilledBySignal(SIGINT), "SIGINT: stopping");
  EXPECT_EQ(entries_in(dir), 0u);
}

}  // namespace
}  // namespace kiln

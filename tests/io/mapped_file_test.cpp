// A checkpoint that changes while it is mapped is reported, naming the file: check_mapped_files() throws
// before a component or step reads it, and a read of a truncated page ends the process with a message and
// status 74 instead of a SIGBUS core dump (kiln/core/signals.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "kiln/core/signals.h"
#include "kiln/io/safetensors.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::temp_dir;

// A checkpoint of one float32 tensor of 64 KiB (16 pages), its data read in place from the mapping.
std::string big_checkpoint(const std::string& name) {
  const std::string path = temp_dir(name) + "/model.safetensors";
  io::save_safetensors(path, {{"w", Tensor::full({16384}, 1.0)}});
  return path;
}

TEST(MappedFiles, TruncationWhileMappedIsReported) {
  const std::string path = big_checkpoint("mapped_truncated");
  const io::SafetensorsFile f(path);
  check_mapped_files();
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  EXPECT_KILN_ERROR(check_mapped_files(), path, "truncated while in use", "4096 now");
}

TEST(MappedFiles, ModificationWhileMappedIsReported) {
  const std::string path = big_checkpoint("mapped_modified");
  const io::SafetensorsFile f(path);
  const timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};  // a new modification time, same size
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_KILN_ERROR(check_mapped_files(), path, "modified while in use");
}

TEST(MappedFiles, ClosedFilesAreForgotten) {
  const std::string path = big_checkpoint("mapped_closed");
  { const io::SafetensorsFile f(path); }
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  EXPECT_NO_THROW(check_mapped_files());
}

TEST(MappedFilesDeathTest, ReadingATruncatedPageExitsNamingTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = big_checkpoint("mapped_sigbus");
  EXPECT_EXIT(
      {
        install_signal_handlers();
        const io::SafetensorsFile f(path);
        const Tensor w = f.tensor("w");  // a view of the mapping
        if (!w.storage()->is_borrowed()) std::_Exit(3);
        if (::truncate(path.c_str(), 4096) != 0) std::_Exit(4);
        volatile float sum = 0;
        const float* p = w.data<float>();
        for (int64_t i = 0; i < w.numel(); i += 1024) sum = sum + p[i];  // past the new end: SIGBUS
        std::_Exit(5);
      },
      ::testing::ExitedWithCode(74),
      "model.safetensors: the file was truncated or changed while Kiln was reading it");
}

}  // namespace
}  // namespace kiln

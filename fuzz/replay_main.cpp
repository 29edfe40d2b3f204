// Runs a fuzz target once over each file named on the command line (directories: every file in them, in
// name order), as libFuzzer does with -runs=0, but built by any compiler: the normal test build replays the
// committed corpora and crash reproducers with it. Exits non-zero when an argument is missing or empty, so
// that a mistyped corpus path cannot pass.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  namespace fs = std::filesystem;
  size_t runs = 0;
  for (int a = 1; a < argc; ++a) {
    std::vector<fs::path> files;
    std::error_code ec;
    if (fs::is_directory(argv[a], ec)) {
      for (const auto& e : fs::directory_iterator(argv[a], ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(argv[a], ec)) {
      files.emplace_back(argv[a]);
    }
    if (files.empty()) {
      std::fprintf(stderr, "replay: %s: no input files\n", argv[a]);
      return 2;
    }
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++runs;
    }
  }
  std::printf("replay: %zu inputs ran without a finding\n", runs);
  return 0;
}

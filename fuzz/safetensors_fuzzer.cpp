// safetensors files: the 8-byte header length, the JSON header (dtypes, shapes, offsets that must tile the
// data section), then every tensor read whole, by rows and by columns (views of the mapping, copies and the
// widened F8/F4/U16/U32/U64 conversions), and as its stored bytes (how fp8 weights stay fp8).
#include <algorithm>

#include "fuzz_support.h"
#include "kiln/io/safetensors.h"

using namespace kiln;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("safetensors");
  file.assign({reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const io::SafetensorsFile f(file.path());
    fuzz::require(f.names().size() <= size, "more tensors than header bytes");
    for (const std::string& name : f.names()) {
      const io::TensorInfo& info = f.info(name);
      fuzz::require(info.begin <= info.end && info.end <= f.file_size(), "tensor outside the file");
      fuzz::expect_clean([&] {
        const Tensor whole = f.tensor(name);
        fuzz::touch(whole.raw_data(), whole.nbytes());
      });
      fuzz::expect_clean([&] {
        const Tensor bytes = f.stored_bytes(name);
        fuzz::require(bytes.nbytes() == info.end - info.begin, "stored bytes are not the tensor's bytes");
        fuzz::touch(bytes.raw_data(), bytes.nbytes());
      });
      const int64_t n0 = info.shape.empty() ? 1 : info.shape[0];
      fuzz::expect_clean([&] {
        const Tensor rows = f.rows(name, n0 / 2, n0);
        fuzz::touch(rows.raw_data(), rows.nbytes());
      });
      if (!info.shape.empty()) {
        const int64_t n = info.shape.back();
        fuzz::expect_clean([&] {
          const Tensor cols = f.columns(name, std::min<int64_t>(1, n), n).contiguous();
          fuzz::touch(cols.raw_data(), cols.nbytes());
        });
      }
    }
  });
  return 0;
}

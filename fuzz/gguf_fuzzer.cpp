// GGUF files (single-file and quantized transformers): magic, version, counts, metadata key/values of every
// type (arrays of arrays included), tensor infos, alignment and the data section; every tensor is then read:
// dequantized to float32, and as its raw blocks (whose first rows are dequantized again).
#include <algorithm>

#include "fuzz_support.h"
#include "kiln/io/gguf.h"

using namespace kiln;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("model.gguf");
  file.assign({reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const io::GgufFile f(file.path());
    for (const auto& [key, value] : f.metadata()) f.metadata_string(key);
    for (const std::string& name : f.names()) {
      const io::GgufTensorInfo& info = f.info(name);
      fuzz::require(info.offset + info.bytes >= info.offset, "tensor extent overflows");
      fuzz::expect_clean([&] {
        const Tensor t = f.tensor(name).contiguous();
        fuzz::touch(t.raw_data(), t.nbytes());
      });
      fuzz::expect_clean([&] {
        const quant::QuantizedTensor q = f.blocks(name);
        if (!q.defined()) return;
        fuzz::touch(q.blocks.raw_data(), q.blocks.nbytes());
        const int64_t rows = q.shape.empty() ? 1 : q.shape[0];
        const Tensor first = q.rows(0, std::min<int64_t>(rows, 2)).dequantize();
        fuzz::touch(first.raw_data(), first.nbytes());
      });
    }
  });
  return 0;
}

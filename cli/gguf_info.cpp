#include "cli/gguf_info.h"

#include <cstdio>
#include <map>

#include "kiln/core/bytes.h"
#include "kiln/io/gguf.h"

namespace kiln::cli {

void print_gguf_info(const std::string& path) {
  const io::GgufFile f(path);
  std::printf("%s\n  GGUF version %u, alignment %llu", path.c_str(), f.version(),
              static_cast<unsigned long long>(f.alignment()));
  if (auto arch = f.metadata_string("general.architecture")) std::printf(", architecture %s", arch->c_str());
  std::printf("\n  %zu tensors:\n", f.names().size());
  struct Totals {
    int tensors = 0;
    uint64_t elements = 0, bytes = 0;
  };
  std::map<std::string, Totals> by_type;
  uint64_t bytes = 0, bf16_bytes = 0;
  for (const auto& name : f.names()) {
    const io::GgufTensorInfo& i = f.info(name);
    const std::string type(quant::type_name(i.type));
    const auto elements = static_cast<uint64_t>(shape_numel(i.shape));
    std::printf("    %-6s %-20s %10s  %s\n", type.c_str(), shape_str(i.shape).c_str(),
                format_bytes(i.bytes).c_str(), name.c_str());
    Totals& t = by_type[type];
    ++t.tensors;
    t.elements += elements;
    t.bytes += i.bytes;
    bytes += i.bytes;
    bf16_bytes += 2 * elements;
  }
  std::printf("  by storage type:\n");
  for (const auto& [type, t] : by_type)
    std::printf("    %-6s %5d tensors, %.2f bits per weight, %s\n", type.c_str(), t.tensors,
                t.elements ? 8.0 * static_cast<double>(t.bytes) / static_cast<double>(t.elements) : 0.0,
                format_bytes(t.bytes).c_str());
  // Block-quantized Linear weights stay in this form in memory (kiln/ops/quantized_linear.h); plain F32/F16
  // tensors are converted to the compute dtype when loaded.
  const double saved =
      bf16_bytes ? 100.0 * (1.0 - static_cast<double>(bytes) / static_cast<double>(bf16_bytes)) : 0;
  std::printf("  weights: %s as stored, %s in bfloat16: %.1f%% saved\n", format_bytes(bytes).c_str(),
              format_bytes(bf16_bytes).c_str(), saved);
}

}  // namespace kiln::cli

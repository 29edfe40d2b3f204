#include "backends/pjrt/compile_options.h"

#include <cstdint>

#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

// Protobuf's base-128 varint: 7 bits per byte, low bits first, the high bit set on all but the last byte.
void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// A field's key: its number and wire type (0 varint, 2 length-delimited).
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (uint64_t(field) << 3) | wire_type);
}

}  // namespace

std::string compile_options_proto(int num_replicas, int num_partitions, bool portable) {
  KILN_CHECK(num_replicas >= 1 && num_partitions >= 1,
             "PJRT compile options: num_replicas and num_partitions must be >= 1, got "
                 << num_replicas << " and " << num_partitions);
  KILN_CHECK(!portable || (num_replicas == 1 && num_partitions == 1),
             "PJRT compile options: only a 1 x 1 executable can be portable, got " << num_replicas << " x "
                                                                                   << num_partitions);
  std::string build;  // ExecutableBuildOptionsProto
  put_key(build, 4, 0);
  put_varint(build, uint64_t(num_replicas));
  put_key(build, 5, 0);
  put_varint(build, uint64_t(num_partitions));
  std::string out;  // CompileOptionsProto
  put_key(out, 3, 2);
  put_varint(out, build.size());
  out += build;
  if (portable) {
    put_key(out, 4, 0);
    put_varint(out, 1);
  }
  return out;
}

}  // namespace kiln::pjrt

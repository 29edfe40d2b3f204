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

// A length-delimited field: key, length, bytes.
void put_message(std::string& out, int field, const std::string& message) {
  put_key(out, field, 2);
  put_varint(out, message.size());
  out += message;
}

// DeviceAssignmentProto { replica_count (1), computation_count (2), computation_devices (3) {
// replica_device_ids (1, packed) } } for one computation (partition).
std::string device_assignment(const std::vector<int64_t>& replica_device_ids) {
  std::string ids;
  for (int64_t id : replica_device_ids) put_varint(ids, uint64_t(id));
  std::string computation;  // ComputationDevice
  put_message(computation, 1, ids);
  std::string out;
  put_key(out, 1, 0);
  put_varint(out, replica_device_ids.size());
  put_key(out, 2, 0);
  put_varint(out, 1);
  put_message(out, 3, computation);
  return out;
}

}  // namespace

std::string compile_options_proto(int num_replicas, int num_partitions, bool portable,
                                  const std::vector<int64_t>& replica_device_ids) {
  KILN_CHECK(num_replicas >= 1 && num_partitions >= 1,
             "PJRT compile options: num_replicas and num_partitions must be >= 1, got "
                 << num_replicas << " and " << num_partitions);
  KILN_CHECK(!portable || (num_replicas == 1 && num_partitions == 1),
             "PJRT compile options: only a 1 x 1 executable can be portable, got " << num_replicas << " x "
                                                                                   << num_partitions);
  KILN_CHECK(replica_device_ids.empty() ||
                 (num_partitions == 1 && replica_device_ids.size() == size_t(num_replicas)),
             "PJRT compile options: a device assignment names one device per replica of one partition, got "
                 << replica_device_ids.size() << " devices for " << num_replicas << " x " << num_partitions);
  std::string build;  // ExecutableBuildOptionsProto
  put_key(build, 4, 0);
  put_varint(build, uint64_t(num_replicas));
  put_key(build, 5, 0);
  put_varint(build, uint64_t(num_partitions));
  if (!replica_device_ids.empty()) put_message(build, 9, device_assignment(replica_device_ids));
  std::string out;  // CompileOptionsProto
  put_message(out, 3, build);
  if (portable) {
    put_key(out, 4, 0);
    put_varint(out, 1);
  }
  return out;
}

}  // namespace kiln::pjrt

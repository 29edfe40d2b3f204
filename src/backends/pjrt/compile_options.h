// The serialized xla.CompileOptionsProto that PJRT_Client_Compile takes. Plugins need at least the replica
// and partition counts (an empty message aborts the CPU plugin on `CHECK replica_count > 0`), and Kiln needs
// nothing more, so the few fields are encoded by hand rather than linking protobuf.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::pjrt {

// CompileOptionsProto { executable_build_options (3) { num_replicas (4), num_partitions (5),
// device_assignment (9) }, compile_portable_executable (4) } in protobuf wire format (field numbers as in
// xla/pjrt/proto/compile_options.proto and xla_data.proto's DeviceAssignmentProto). A portable executable
// has no fixed device assignment and runs on the device chosen at execution (PJRT's execute_device); only a
// 1 x 1 executable can be portable. Both counts must be >= 1.
//
// `replica_device_ids` (the plugin's device ids, one per replica, in replica order; one partition) fixes
// which devices a multi-replica executable runs on: without it the plugin takes its first devices, so ranks
// on devices 2 and 3 need it. Empty: no assignment.
std::string compile_options_proto(int num_replicas, int num_partitions, bool portable,
                                  const std::vector<int64_t>& replica_device_ids = {});

}  // namespace kiln::pjrt

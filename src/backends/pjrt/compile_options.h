// The serialized xla.CompileOptionsProto that PJRT_Client_Compile takes. Plugins need at least the replica
// and partition counts (an empty message aborts the CPU plugin on `CHECK replica_count > 0`), and Kiln needs
// nothing more, so the few fields are encoded by hand rather than linking protobuf.
#pragma once

#include <string>

namespace kiln::pjrt {

// CompileOptionsProto { executable_build_options (3) { num_replicas (4), num_partitions (5) },
// compile_portable_executable (4) } in protobuf wire format (field numbers as in
// xla/pjrt/compile_options.proto). A portable executable has no fixed device assignment and runs on the
// device chosen at execution (PJRT's execute_device); only a 1 x 1 executable can be portable. Both counts
// must be >= 1.
std::string compile_options_proto(int num_replicas, int num_partitions, bool portable);

}  // namespace kiln::pjrt

// The process group: every process of a distributed run (one per device), as torch.distributed names it.
// Backed by MPI (Debian's OpenMPI), so ranks may be processes on one machine or on several. Collectives are
// not called here but as ops (kiln/ops/collective.h), so every execution mode runs them.
//
//   kiln::dist::init_process_group({.backend = "mpi"});   // under `mpirun -np N` (or `kiln launch -n N`)
//   if (kiln::dist::rank() == 0) ...;
//
// Without init_process_group (or when a process is started without mpirun) Kiln is one process:
// rank() is 0 and world_size() is 1, and MPI is never touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::dist {

struct ProcessGroupOptions {
  std::string backend = "mpi";  // the only backend today; NCCL for GPUs later behind the same interface
};

// Joins the process group. Throws kiln::Error naming the backend when it is not "mpi", and when called twice.
// The MPI transport is initialised for calls from any thread (kernels run collectives on the device stream's
// worker thread).
void init_process_group(const ProcessGroupOptions& options = {});
bool is_initialized();
// This process's index in the group (0 when not initialised) and the group's size (1 when not).
int rank();
int world_size();
// Whether this process was started by mpirun/`kiln launch` as one of several (OpenMPI's environment says so),
// whether or not init_process_group has been called yet.
bool launched_by_mpirun();

// Replaces `bytes` bytes at `data` on every rank with rank 0's (a seed chosen at random, so that every rank
// draws the same noise). Call from the host thread; a no-op without a group.
void broadcast_from_rank0(void* data, size_t bytes);

// What this rank's collectives cost since the process started: calls, bytes it sent, and seconds inside
// MPI (transfer plus waiting for the slowest rank).
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  double seconds = 0;
};
CollectiveStats collective_stats();

// Waits for the device stream's queued work, then leaves the group (MPI_Finalize). Also run at process exit
// (without waiting: the streams are shut down by then) when not called. Safe to call when not initialised.
void destroy_process_group();

// Ends every rank of the group now: prints "kiln: rank R of N failed: <message>" on stderr and calls
// MPI_Abort, so no rank waits forever for a peer that will not arrive. Without a group, prints the message
// and exits with status 1. Never returns.
[[noreturn]] void abort_group(const std::string& message);

}  // namespace kiln::dist

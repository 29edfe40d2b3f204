// The byte-level collectives under the collective ops' kernels (MLX's GroupImpl): implemented over MPI's
// MPI_COMM_WORLD in process_group.cpp. Called from the device stream's worker thread.
#pragma once

#include <cstddef>

namespace kiln::dist {

// Every rank contributes `bytes` bytes; `recv` (world_size() * bytes) receives them in rank order.
// Throws kiln::Error when the group is not initialised or the transfer fails.
void all_gather_bytes(const void* send, size_t bytes, void* recv);

// Whether `mine` is true on any rank (MPI_Allreduce with a logical or), from the host thread. Throws
// kiln::Error when the group is not initialised or the reduction fails.
bool any_rank_true(bool mine);

}  // namespace kiln::dist

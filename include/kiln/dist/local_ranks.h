// Tensor parallelism inside one process: the ranks are threads, one per device of one PJRT client, and the
// collectives between them run inside the device executables (StableHLO all_reduce / all_gather over the
// replicas of one executable), so activations move between devices without the host — JAX's pmap, and what
// the MPI path (process_group.h: one process per device) cannot do on one client's devices.
//
//   kiln::dist::run_local_ranks(2, [&](int rank) {
//     auto pipe = kiln::FluxPipeline::from_pretrained(model, {.tensor_parallel = {.mesh =
//                                                         kiln::dist::DeviceMesh("xla-cpu", {2})}});
//     pipe.to(kiln::Device(kiln::DeviceType::XlaCpu, rank));
//     auto out = pipe(call);                       // every rank draws the same image
//     if (rank == 0) out.images[0].save("out.png");
//   });
//
// On a rank's thread rank() and world_size() (process_group.h) answer for the in-process group, so the
// models' tensor-parallel plans, DeviceMesh and the collective ops work unchanged. Each rank runs in an
// execution context of its own, and must hold its own pipeline, as each MPI rank does. The ranks' collectives
// must be on PJRT devices, distinct per rank and of one client; on the cpu device they are exchanged through
// host memory.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace kiln::dist {

// Runs fn(rank) for rank 0..n-1, each on its own thread, and returns when all have returned. When one
// throws, the collectives the others wait in (or enter later) throw too, naming that rank, so none hangs;
// then the first failure is rethrown here. Throws kiln::Error for n < 1, and when called from a rank thread
// or inside an MPI process group of several ranks.
void run_local_ranks(int n, const std::function<void(int rank)>& fn);

// Whether the calling thread is a rank of run_local_ranks.
bool in_local_ranks();

// On a rank thread: a function that runs `work` on whichever thread calls it AS THIS RANK (rank(),
// world_size() and the collectives answer as on the rank thread), for work the rank hands to a thread of
// its own, such as a server's job worker. One thread at a time should act as a rank. Off the rank threads
// the function runs `work` as it is.
std::function<void(const std::function<void()>& work)> as_this_rank();

// On a rank thread: the failure that ended its group (the message naming the rank that threw), if one did;
// nullopt otherwise, and off the rank threads.
std::optional<std::string> local_group_failure();

}  // namespace kiln::dist

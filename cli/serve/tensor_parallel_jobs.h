// `kiln serve --tp N` (under mpirun or `kiln launch`): rank 0 serves HTTP and runs the jobs; every pipeline
// call needs all N ranks (its collectives), so before each job rank 0 sends the others the job's model,
// parameters and seed, and they make the same call, in the same order (one job at a time under --tp). When
// rank 0 stops, it tells them to stop too.
//
// Between jobs the other ranks wait inside MPI_Bcast, which OpenMPI implements by polling: each keeps a core
// busy while the server is idle.
#pragma once

#include "cli/serve/job.h"
#include "cli/serve/lora_library.h"
#include "cli/serve/model_pool.h"

namespace kiln::serve {

// Rank 0: the job about to run.
void announce_job(const Job& job);
// Rank 0: no more jobs.
void announce_stop();
// Other ranks: runs each announced job on `pool` until rank 0 announces the stop. A job that fails or is
// cancelled here fails or is cancelled on rank 0 as well (same request, same cancellation points).
void follow_rank0(ModelPool& pool, const LoraLibrary& loras);

}  // namespace kiln::serve

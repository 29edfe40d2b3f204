#include "kiln/dist/process_group.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "dist/local_group.h"
#include "dist/transport.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/runtime/execution_context.h"

namespace kiln::dist {

namespace {

struct GroupState {
  std::mutex mutex;
  bool initialized = false;
  bool finalized = false;
  int rank = 0;
  int size = 1;
  std::mutex stats_mutex;  // the stream's worker updates, the host reads
  CollectiveStats stats;
};

GroupState& state() {
  static GroupState* s = new GroupState;  // never destroyed: read from the exit path
  return *s;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// At exit the device streams are already shut down (runtime/exit_hook.h), so there is nothing to wait for.
void finalize_at_exit() {
  GroupState& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return;
  MPI_Finalize();
  s.initialized = false;
  s.finalized = true;
}

}  // namespace

void init_process_group(const ProcessGroupOptions& options) {
  KILN_CHECK(options.backend == "mpi", "init_process_group: backend '"
                                           << options.backend << "' is not available; Kiln's process group "
                                           << "runs on \"mpi\"");
  GroupState& s = state();
  std::lock_guard lock(s.mutex);
  KILN_CHECK(!s.initialized, "init_process_group: the process group is already initialised");
  KILN_CHECK(!s.finalized, "init_process_group: the process group was destroyed; MPI cannot start twice");
  int provided = MPI_THREAD_SINGLE;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  KILN_CHECK(rc == MPI_SUCCESS, "init_process_group: MPI_Init_thread failed: " << mpi_error_text(rc));
  // Kernels call MPI on the stream's worker thread while the host thread may abort: one thread at a time
  // is the least the transport needs.
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    KILN_FAIL("init_process_group: this MPI library gives thread level "
              << provided << ", below MPI_THREAD_SERIALIZED, which Kiln's worker-thread collectives need");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.size);
  s.initialized = true;
  std::atexit(finalize_at_exit);
}

bool is_initialized() {
  return state().initialized;
}

// A rank thread of run_local_ranks answers for its in-process group (dist/local_group.h).
int rank() {
  if (const LocalRank* local = current_local_rank()) return local->rank;
  return state().rank;
}

int world_size() {
  if (const LocalRank* local = current_local_rank()) return local->group->size();
  return state().size;
}

bool launched_by_mpirun() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size != nullptr && std::atoi(size) > 1;
}

CollectiveStats collective_stats() {
  GroupState& s = state();
  std::lock_guard lock(s.stats_mutex);
  return s.stats;
}

void destroy_process_group() {
  GroupState& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return;
  // Collectives queued on the stream must finish before MPI goes.
  synchronize(cpu);
  MPI_Finalize();
  s.initialized = false;
  s.finalized = true;
  s.rank = 0;
  s.size = 1;
}

void abort_group(const std::string& message) {
  GroupState& s = state();
  std::fprintf(stderr, "kiln: rank %d of %d failed: %s\n", s.rank, s.size, message.c_str());
  std::fflush(stderr);
  if (s.initialized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void broadcast_from_rank0(void* data, size_t bytes) {
  if (const LocalRank* local = current_local_rank()) {
    // Rank 0's bytes, copied by each rank while rank 0 waits in the rendezvous.
    const std::any from0 = local->group->rendezvous(
        local->rank, static_cast<const void*>(data),
        [](const std::vector<std::any>& items) { return std::vector<std::any>(items.size(), items[0]); });
    if (local->rank != 0) std::memcpy(data, std::any_cast<const void*>(from0), bytes);
    local->group->rendezvous(local->rank, {}, [](const std::vector<std::any>& items) {
      return std::vector<std::any>(items.size());  // rank 0's bytes stay alive until every rank has copied
    });
    return;
  }
  GroupState& s = state();
  if (!s.initialized || s.size == 1) return;
  KILN_CHECK(bytes <= static_cast<size_t>(INT_MAX),
             "broadcast_from_rank0: " << bytes << " bytes exceeds MPI's count limit of " << INT_MAX);
  // Collectives already queued on the stream go first, so every rank sees the same order of MPI calls.
  synchronize(cpu);
  const int rc = MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  KILN_CHECK(rc == MPI_SUCCESS, "broadcast_from_rank0: MPI_Bcast of " << bytes << " bytes on rank " << s.rank
                                                                      << " failed: " << mpi_error_text(rc));
}

void all_gather_bytes(const void* send, size_t bytes, void* recv) {
  GroupState& s = state();
  KILN_CHECK(s.initialized,
             "collective: the process group is not initialised (call "
             "kiln::dist::init_process_group first)");
  KILN_CHECK(bytes <= static_cast<size_t>(INT_MAX),
             "collective: " << bytes << " bytes per rank exceeds MPI's count limit of " << INT_MAX);
  const double start = MPI_Wtime();
  const int rc = MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                               MPI_BYTE, MPI_COMM_WORLD);
  {
    std::lock_guard stats_lock(s.stats_mutex);
    s.stats.calls += 1;
    s.stats.bytes_sent += static_cast<int64_t>(bytes);
    s.stats.seconds += MPI_Wtime() - start;
  }
  KILN_CHECK(rc == MPI_SUCCESS, "collective: MPI_Allgather of " << bytes << " bytes on rank " << s.rank
                                                                << " failed: " << mpi_error_text(rc));
}

bool any_rank_true(bool mine) {
  GroupState& s = state();
  KILN_CHECK(s.initialized, "any_rank: the process group is not initialised");
  int local = mine ? 1 : 0, any = 0;
  const int rc = MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  KILN_CHECK(rc == MPI_SUCCESS,
             "any_rank: MPI_Allreduce on rank " << s.rank << " failed: " << mpi_error_text(rc));
  return any != 0;
}

}  // namespace kiln::dist

// The tensor-parallel tests run as every rank of `mpirun -np 2` (tests/CMakeLists.txt): each rank joins the
// process group before GoogleTest runs, so all ranks run the same tests in the same order.
#include <gtest/gtest.h>

#include "kiln/dist/process_group.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::dist::init_process_group({.backend = "mpi"});
  const int result = RUN_ALL_TESTS();
  kiln::dist::destroy_process_group();
  return result;
}

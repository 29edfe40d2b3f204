# Tensor parallelism: tests that run as two MPI ranks (`mpirun -np 2 --oversubscribe`: CI's 2 cores are
# shared). OpenMPI refuses to start as root without the two variables below; they change nothing else.
find_program(KILN_MPIEXEC NAMES mpiexec mpirun REQUIRED)
set(KILN_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
set(KILN_MPIRUN2 ${CMAKE_COMMAND} -E env ${KILN_MPI_ENV} ${KILN_MPIEXEC} -np 2 --oversubscribe)

file(GLOB KILN_DIST_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/dist/*.cpp)
add_executable(kiln_test_dist ${KILN_DIST_TEST_SOURCES} support/test_data.cpp)
target_include_directories(kiln_test_dist PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(kiln_test_dist PRIVATE KILN_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data")
target_compile_options(kiln_test_dist PRIVATE ${KILN_WARNINGS} -Wno-psabi)
target_link_libraries(kiln_test_dist PRIVATE kiln GTest::gtest)

# One ctest test for the whole executable: every rank must run the same tests in the same order.
add_test(NAME dist.tensor_parallel_2_ranks COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_test_dist>)
set_tests_properties(dist.tensor_parallel_2_ranks PROPERTIES LABELS dist TIMEOUT 300)

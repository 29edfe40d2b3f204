# Tensor parallelism: tests that run as two MPI ranks (`mpirun -np 2 --oversubscribe`: CI's 2 cores are
# shared). OpenMPI refuses to start as root without the two variables below; they change nothing else.
find_program(KILN_MPIEXEC NAMES mpiexec mpirun REQUIRED)
set(KILN_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
set(KILN_MPIRUN2 ${CMAKE_COMMAND} -E env ${KILN_MPI_ENV} ${KILN_MPIEXEC} -np 2 --oversubscribe)

file(GLOB KILN_DIST_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/dist/*.cpp)
add_executable(kiln_test_dist ${KILN_DIST_TEST_SOURCES} support/test_data.cpp)
target_include_directories(kiln_test_dist PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(kiln_test_dist PRIVATE KILN_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data")
kiln_warnings(kiln_test_dist -Wno-psabi)
target_link_libraries(kiln_test_dist PRIVATE kiln GTest::gtest)

# One ctest test for the whole executable: every rank must run the same tests in the same order.
add_test(NAME dist.tensor_parallel_2_ranks COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_test_dist>)
set_tests_properties(dist.tensor_parallel_2_ranks PROPERTIES LABELS dist TIMEOUT 300)

# The command line: `mpirun -np 2 kiln generate --tp 2` and `kiln launch -n 2 -- generate` write the PNG
# (rank 0 alone reports and writes; the images themselves are compared with one rank's in
# tensor_parallel_pipeline_test.cpp); --tp without the ranks to match is a clear error.
set(KILN_TINY_FLUX ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell)
set(KILN_TINY_GENERATE --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                       --max-sequence-length 16)
add_test(NAME dist.generate_flux_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model ${KILN_TINY_FLUX}
                 ${KILN_TINY_GENERATE} --mode fuse --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2.png)
set_tests_properties(dist.generate_flux_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_flux_tp2.png")
# First Block Cache over two ranks: rank 0's decisions on both, diffusers' steps reused (the image:
# tensor_parallel_step_cache_test.cpp).
add_test(NAME dist.generate_flux_tp2_step_cache
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-dev --prompt "a photo of a cat" --height 64
                 --width 64 --steps 12 --guidance 3.5 --seed 31 --dtype f32 --max-sequence-length 32
                 --cache fbcache:0.45 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_step_cache.png)
set_tests_properties(dist.generate_flux_tp2_step_cache PROPERTIES
                     PASS_REGULAR_EXPRESSION "reused at steps 2,5,7,8 " LABELS dist)
# Chroma split over two ranks from the command line (the image itself: tensor_parallel_chroma_test.cpp).
add_test(NAME dist.generate_chroma_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/models/chroma-tiny --negative-prompt "blurry" --guidance 4
                 ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_chroma_tp2.png)
set_tests_properties(dist.generate_chroma_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_chroma_tp2.png"
                     LABELS dist)
# Z-Image likewise, guided (its image: tensor_parallel_z_image_test.cpp).
add_test(NAME dist.generate_z_image_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/models/z-image-tiny --negative-prompt "blurry" --guidance 3
                 ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_z_image_tp2.png)
set_tests_properties(dist.generate_z_image_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_z_image_tp2.png"
                     LABELS dist)
# Qwen-Image likewise, with true CFG (its image: tensor_parallel_qwen_image_test.cpp).
add_test(NAME dist.generate_qwen_image_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/models/qwen-image-tiny --negative-prompt "blurry" --true-cfg-scale 3
                 ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_qwen_image_tp2.png)
set_tests_properties(dist.generate_qwen_image_tp2 PROPERTIES
                     PASS_REGULAR_EXPRESSION "wrote .*dist_qwen_image_tp2.png" LABELS dist)
# SDXL with its UNet's transformer blocks split (its images: tensor_parallel_stable_diffusion_test.cpp).
add_test(NAME dist.generate_sdxl_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --model
                 ${CMAKE_CURRENT_SOURCE_DIR}/data/models/sdxl-tiny --prompt "a red circle" --negative-prompt "blurry"
                 --height 32 --width 32 --steps 3 --seed 1 --dtype f32
                 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_sdxl_tp2.png)
set_tests_properties(dist.generate_sdxl_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_sdxl_tp2.png"
                     LABELS dist)
# On PJRT devices: rank r on xla-cpu:r (the image itself: tensor_parallel_pipeline_test.cpp).
add_test(NAME dist.generate_flux_tp2_on_xla_cpu
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2 --device xla-cpu --model ${KILN_TINY_FLUX}
                 ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_xla.png)
set_tests_properties(dist.generate_flux_tp2_on_xla_cpu PROPERTIES PASS_REGULAR_EXPRESSION
                     "every component on xla-cpu:0.*wrote .*dist_flux_tp2_xla.png" LABELS "dist;devices"
                     FIXTURES_SETUP flux_tp2_mpi_xla)
# Without mpirun, --tp on PJRT devices runs the ranks as threads of one process, the collectives inside executables
# across the devices (kiln/dist/local_ranks.h): the same PNG, byte for byte, as the MPI ranks'.
if(KILN_BUILT_WITH_PJRT)
  add_test(NAME dist.generate_flux_tp2_in_process_on_xla_cpu
           COMMAND $<TARGET_FILE:kiln_cli> generate --tp 2 --device xla-cpu --model ${KILN_TINY_FLUX}
                   ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_xla_in_process.png)
  set_tests_properties(dist.generate_flux_tp2_in_process_on_xla_cpu PROPERTIES PASS_REGULAR_EXPRESSION
                       "every component on xla-cpu:0, split over 2 devices to xla-cpu:1 \\(one thread each\\).*wrote .*dist_flux_tp2_xla_in_process.png"
                       LABELS "dist;devices" FIXTURES_SETUP flux_tp2_local_xla)
  add_test(NAME dist.in_process_ranks_draw_the_mpi_ranks_png
           COMMAND ${CMAKE_COMMAND} -E compare_files ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_xla.png
                   ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_xla_in_process.png)
  set_tests_properties(dist.in_process_ranks_draw_the_mpi_ranks_png PROPERTIES LABELS "dist;devices"
                       FIXTURES_REQUIRED "flux_tp2_mpi_xla;flux_tp2_local_xla")
  # Compiled blocks on xla-cpu:2 and :3; and a group that would run past the plugin's last device fails before
  # loading, naming it.
  add_test(NAME dist.generate_flux_tp2_in_process_compiled_blocks
           COMMAND $<TARGET_FILE:kiln_cli> generate --tp 2 --device xla-cpu:2 --mode compile-blocks
                   --model ${KILN_TINY_FLUX} ${KILN_TINY_GENERATE}
                   --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp2_xla_blocks.png)
  set_tests_properties(dist.generate_flux_tp2_in_process_compiled_blocks PROPERTIES PASS_REGULAR_EXPRESSION
                       "split over 2 devices to xla-cpu:3.*wrote .*dist_flux_tp2_xla_blocks.png" LABELS "dist;devices")
  add_test(NAME dist.generate_in_process_past_the_last_device
           COMMAND $<TARGET_FILE:kiln_cli> generate --tp 4 --device xla-cpu:1 --model ${KILN_TINY_FLUX}
                   ${KILN_TINY_GENERATE} --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_tp4_refused.png)
  set_tests_properties(dist.generate_in_process_past_the_last_device PROPERTIES PASS_REGULAR_EXPRESSION
                       "^kiln: error: device xla-cpu:4 does not exist: the xla-cpu plugin \\([^)]*\\) has 4 devices"
                       LABELS "dist;devices")
endif()
add_test(NAME dist.launch_sd3_tp2
         COMMAND ${CMAKE_COMMAND} -E env ${KILN_MPI_ENV} $<TARGET_FILE:kiln_cli> launch -n 2 --oversubscribe --
                 generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/sd3-tiny-medium ${KILN_TINY_GENERATE}
                 --negative-prompt blurry --guidance 4.5 --mode compile-blocks
                 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_sd3_tp2.png)
set_tests_properties(dist.launch_sd3_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_sd3_tp2.png")
# FLUX.2 [klein] from a prompt, its text encoder and transformer split.
add_test(NAME dist.generate_flux2_klein_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2
                 --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux2-tiny-klein-full ${KILN_TINY_GENERATE}
                 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux2_klein_tp2.png)
set_tests_properties(dist.generate_flux2_klein_tp2 PROPERTIES PASS_REGULAR_EXPRESSION "wrote .*dist_flux2_klein_tp2.png")
# LoRA adapters on the split transformer (their images against one rank's: tensor_parallel_lora_test.cpp).
add_test(NAME dist.generate_flux_lora_tp2
         COMMAND ${KILN_MPIRUN2} $<TARGET_FILE:kiln_cli> generate --tp 2
                 --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-dev ${KILN_TINY_GENERATE}
                 --lora ${CMAKE_CURRENT_SOURCE_DIR}/data/lora/flux_kohya.safetensors:0.7
                 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_flux_lora_tp2.png)
set_tests_properties(dist.generate_flux_lora_tp2 PROPERTIES PASS_REGULAR_EXPRESSION
                     "adapter 'flux_kohya'.*wrote .*dist_flux_lora_tp2.png" LABELS dist)
add_test(NAME dist.generate_tp_without_ranks
         COMMAND $<TARGET_FILE:kiln_cli> generate --tp 2 --model ${KILN_TINY_FLUX} ${KILN_TINY_GENERATE}
                 --output ${CMAKE_CURRENT_BINARY_DIR}/dist_no_ranks.png)
set_tests_properties(dist.generate_tp_without_ranks PROPERTIES PASS_REGULAR_EXPRESSION "--tp 2: 1 process")

# Failure: a rank killed mid-run, or one that cannot read its shard, ends every rank within 60 s with a
# message naming the rank and the cause, and no PNG.
foreach(scenario killed-rank unreadable-shard)
  add_test(NAME dist.rank_failure_${scenario}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/dist/rank_failure_test.sh $<TARGET_FILE:kiln_cli> ${KILN_TINY_FLUX}
                   ${CMAKE_CURRENT_BINARY_DIR}/dist_failure_${scenario} ${scenario})
  set_tests_properties(dist.rank_failure_${scenario} PROPERTIES TIMEOUT 90)
endforeach()
set_tests_properties(dist.generate_flux_tp2 dist.launch_sd3_tp2 dist.generate_flux2_klein_tp2 dist.generate_tp_without_ranks
                     dist.rank_failure_killed-rank dist.rank_failure_unreadable-shard PROPERTIES LABELS dist)

# Two hosts on one machine: two network namespaces joined by a veth pair, one rank in each, over TCP; the
# image must be one process's. Needs root (skipped otherwise).
add_test(NAME dist.two_hosts_veth
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/dist/two_hosts_test.sh $<TARGET_FILE:kiln_cli> ${KILN_TINY_FLUX}
                 ${CMAKE_CURRENT_BINARY_DIR}/dist_two_hosts)
set_tests_properties(dist.two_hosts_veth PROPERTIES LABELS dist SKIP_RETURN_CODE 77 TIMEOUT 180)

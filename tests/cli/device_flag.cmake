# kiln generate --device (cli/device_flag.h): the tiny FLUX pipeline on xla-cpu writes its PNG; flags that run on
# the cpu only for now are refused naming both flags, and a device without its plugin fails before loading with
# what to install. The xla-cpu runs need the PJRT plugin scripts/setup.sh --pjrt (and --tests) installs.
set(KILN_DEVICE_WORK ${CMAKE_CURRENT_BINARY_DIR})
set(KILN_DEVICE_NO_MODEL ${KILN_DEVICE_WORK}/no-such-model)
# KILN_PJRT_CROSS_COMPILE on a run that uses no PJRT device says that it compiled nothing, and why.
add_test(NAME cli.cross_compile_on_the_cpu_says_it_compiled_nothing
         COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device cpu
                 --prompt "a red circle" --height 32 --width 32 --steps 1 --seed 1 --dtype f32
                 --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_cross_compile_on_cpu.png)
set_tests_properties(cli.cross_compile_on_the_cpu_says_it_compiled_nothing PROPERTIES
                     ENVIRONMENT "KILN_PJRT_CROSS_COMPILE=tpu:v5e"
                     PASS_REGULAR_EXPRESSION "wrote [^\n]*cli_cross_compile_on_cpu.png[^\n]*\nkiln: KILN_PJRT_CROSS_COMPILE=tpu:v5e compiled nothing: it compiles the programs a PJRT device runs"
                     LABELS "cli")
if(KILN_BUILT_WITH_PJRT)
  add_test(NAME cli.generate_tiny_flux_on_xla_cpu
           COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                   --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                   --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_xla_cpu.png)
  set_tests_properties(cli.generate_tiny_flux_on_xla_cpu PROPERTIES PASS_REGULAR_EXPRESSION
                       "every component on xla-cpu:0\n.*wrote .*cli_device_xla_cpu.png \\(32x32, seed 1\\)"
                       LABELS "cli;devices" TIMEOUT 300)
  # The transformer's repeated blocks compiled once each, on the device.
  add_test(NAME cli.generate_tiny_flux_on_xla_cpu_compiled_blocks
           COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                   --mode compile-blocks --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                   --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_xla_cpu_blocks.png)
  set_tests_properties(cli.generate_tiny_flux_on_xla_cpu_compiled_blocks PROPERTIES PASS_REGULAR_EXPRESSION
                       "every component on xla-cpu:0\n.*wrote .*cli_device_xla_cpu_blocks.png \\(32x32, seed 1\\)"
                       LABELS "cli;devices" TIMEOUT 300)
  # Offloaded onto the device: the weights stay on the host and are copied into the device's memory as they run,
  # a component at a time or in groups of blocks.
  foreach(offload model group)
    add_test(NAME cli.generate_tiny_flux_on_xla_cpu_offload_${offload}
             COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                     --offload ${offload} --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                     --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_xla_cpu_${offload}.png)
    set_tests_properties(cli.generate_tiny_flux_on_xla_cpu_offload_${offload} PROPERTIES PASS_REGULAR_EXPRESSION
                         "${offload} offload[^\n]*\\(onto xla-cpu:0, weights kept on the host\\).*wrote .*cli_device_xla_cpu_${offload}.png \\(32x32, seed 1\\)"
                         LABELS "cli;devices" TIMEOUT 300)
  endforeach()
  # --max-memory on the device: picks the offload, and one below the largest weight is refused naming it.
  add_test(NAME cli.generate_tiny_flux_on_xla_cpu_max_memory
           COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                   --max-memory 1GiB --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                   --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_xla_cpu_max_memory.png)
  set_tests_properties(cli.generate_tiny_flux_on_xla_cpu_max_memory PROPERTIES PASS_REGULAR_EXPRESSION
                       "memory budget 1.00 GiB[^\n]*onto xla-cpu:0.*wrote .*cli_device_xla_cpu_max_memory.png"
                       LABELS "cli;devices" TIMEOUT 300)
  add_test(NAME cli.generate_on_xla_cpu_rejects_a_budget_below_the_largest_weight
           COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                   --max-memory 1KiB --prompt x --height 32 --width 32 --steps 1 --dtype f32
                   --output ${KILN_DEVICE_WORK}/cli_device_refused.png)
  set_tests_properties(cli.generate_on_xla_cpu_rejects_a_budget_below_the_largest_weight PROPERTIES
                       PASS_REGULAR_EXPRESSION "memory budget 1.0+ KiB is below the largest weight" LABELS "cli;devices")
  # A budget the weights fit (model offload, by the weights alone) but not with the image's activations beside
  # them: refused before any work, naming the activations' estimate at the image's size.
  add_test(NAME cli.generate_on_xla_cpu_keeps_room_for_the_activations
           COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                   --max-memory 600KiB --prompt x --height 32 --width 32 --steps 1 --dtype f32
                   --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_no_room.png)
  set_tests_properties(cli.generate_on_xla_cpu_keeps_room_for_the_activations PROPERTIES
                       PASS_REGULAR_EXPRESSION "memory budget 600.0 KiB on xla-cpu:0 keeps up to [^\n]* of activations at 32x32 [^\n]* free \\(an estimate\\), which leaves [^\n]*a smaller image"
                       LABELS "cli;devices")
  # A device whose plugin reports its memory (as the CUDA and TPU plugins do; here the CPU plugin behind
  # kiln_memory_reporting_pjrt_plugin, which reports KILN_TEST_DEVICE_MEMORY): `kiln info --devices` shows it and
  # --offload auto plans for what is free there, less what others use: model offload at 1.4 MiB with 200 KiB in
  # use by others, nothing offloaded at 1 GiB (on both of --tp 2's devices), and at 600 KiB a refusal naming
  # the device's figures.
  set(KILN_CPU_PLUGIN ${KILN_PJRT_CACHE}/lib/pjrt_c_api_cpu_plugin.so)
  if(EXISTS ${KILN_CPU_PLUGIN})
    set(KILN_REPORTING_ENV "KILN_PJRT_PLUGIN=$<TARGET_FILE:kiln_memory_reporting_pjrt_plugin>"
                           "KILN_TEST_REAL_PJRT_PLUGIN=${KILN_CPU_PLUGIN}")
    add_test(NAME cli.info_devices_shows_the_reported_memory COMMAND kiln_cli info --devices)
    set_tests_properties(cli.info_devices_shows_the_reported_memory PROPERTIES
                         ENVIRONMENT "${KILN_REPORTING_ENV};KILN_TEST_DEVICE_MEMORY=1073741824;KILN_TEST_DEVICE_MEMORY_IN_USE=1048576"
                         PASS_REGULAR_EXPRESSION "xla-cpu:0 +pjrt backend[^\n]*\n +memory 1.00 GiB, 1.0 MiB in use\n"
                         LABELS "cli;devices")
    add_test(NAME cli.generate_on_xla_cpu_plans_for_the_reported_memory
             COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                     --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                     --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_reported_memory.png)
    set_tests_properties(cli.generate_on_xla_cpu_plans_for_the_reported_memory PROPERTIES
                         ENVIRONMENT "${KILN_REPORTING_ENV};KILN_TEST_DEVICE_MEMORY=1468006;KILN_TEST_DEVICE_MEMORY_IN_USE=204800"
                         PASS_REGULAR_EXPRESSION "model offload[^\n]*\\(xla-cpu:0 has 1.4 MiB \\(its plugin says\\), 200.0 KiB of it in use by others; weights kept on the host\\).*wrote .*cli_device_reported_memory.png \\(32x32, seed 1\\)"
                         LABELS "cli;devices" TIMEOUT 300)
    # Room for everything: nothing offloaded, on each of two in-process ranks' devices.
    add_test(NAME cli.generate_tp_on_xla_cpu_keeps_everything_when_the_reported_memory_allows
             COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                     --tp 2 --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1 --dtype f32
                     --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_reported_memory_tp.png)
    set_tests_properties(cli.generate_tp_on_xla_cpu_keeps_everything_when_the_reported_memory_allows PROPERTIES
                         ENVIRONMENT "${KILN_REPORTING_ENV};KILN_TEST_DEVICE_MEMORY=1073741824"
                         PASS_REGULAR_EXPRESSION "every component stays in memory \\(no offload\\) \\(xla-cpu:0 has 1.00 GiB \\(its plugin says\\), 0 B of it in use by others; weights kept on the host\\)\n.*split over 2 devices to xla-cpu:1.*wrote .*cli_device_reported_memory_tp.png \\(32x32, seed 1\\)"
                         LABELS "cli;devices" TIMEOUT 300)
    add_test(NAME cli.generate_on_xla_cpu_refuses_when_the_reported_memory_is_too_small
             COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device xla-cpu
                     --prompt x --height 32 --width 32 --steps 1 --dtype f32
                     --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_reported_too_small.png)
    set_tests_properties(cli.generate_on_xla_cpu_refuses_when_the_reported_memory_is_too_small PROPERTIES
                         ENVIRONMENT "${KILN_REPORTING_ENV};KILN_TEST_DEVICE_MEMORY=614400"
                         PASS_REGULAR_EXPRESSION "xla-cpu:0 has 600.0 KiB \\(its plugin says\\), 0 B of it in use by others, so FluxPipeline plans for 600.0 KiB there: memory budget 600.0 KiB on xla-cpu:0 keeps up to"
                         LABELS "cli;devices")
  endif()
  # Every program of each pipeline, in strict eager and compiled mode, and the collectives of --tp 2, compiled
  # also by libtpu for a TPU v5e and by the CUDA plugin for an H200, without either device (KILN_PJRT_CROSS_COMPILE,
  # src/backends/pjrt/cross_compile.h). Needs ./scripts/fetch_pjrt.sh --cross (setup.sh --tests runs it) and the
  # CUDA toolkit's ptxas; where they are missing at configure time these tests are not added.
  find_program(KILN_PTXAS ptxas HINTS /usr/local/cuda/bin)
  if(EXISTS "${KILN_PJRT_CACHE}/cross/libtpu.so" AND EXISTS "${KILN_PJRT_CACHE}/cross/xla_cuda_plugin.so" AND KILN_PTXAS)
    set(KILN_CROSS_SUMMARY "cross-compiled [0-9]+ programs for tpu:v5e \\(TPU v5 lite\\)[^\n]*\nkiln: cross-compiled [0-9]+ programs for cuda:h200 \\(NVIDIA H200\\)")
    foreach(spec flux-tiny-schnell:eager:1 flux-tiny-schnell:compile:2 sd3-tiny-medium:compile:1
                 flux2-tiny-klein-full:compile:1)
      string(REPLACE ":" ";" parts ${spec})
      list(GET parts 0 model)
      list(GET parts 1 mode)
      list(GET parts 2 tp)
      set(name cli.cross_compile_${model}_${mode}_tp${tp}_for_tpu_and_cuda)
      add_test(NAME ${name}
               COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/${model} --device xla-cpu
                       --tp ${tp} --mode ${mode} --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 1
                       --dtype bf16 --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/${name}.png)
      set_tests_properties(${name} PROPERTIES ENVIRONMENT "KILN_PJRT_CROSS_COMPILE=tpu:v5e,cuda:h200"
                           PASS_REGULAR_EXPRESSION "wrote .*${name}.png \\(32x32, seed 1\\)\nkiln: ${KILN_CROSS_SUMMARY}"
                           LABELS "cli;devices" TIMEOUT 600)
    endforeach()
    add_test(NAME cli.info_devices_lists_the_cross_compile_targets COMMAND kiln_cli info --devices)
    set_tests_properties(cli.info_devices_lists_the_cross_compile_targets PROPERTIES
                         PASS_REGULAR_EXPRESSION "cross-compile for tpu: tpu:v4 tpu:v5e tpu:v5p tpu:v6e \\(with [^\n]*libtpu.so\\)\ncross-compile for cuda: cuda:h200 cuda:h100 cuda:a100 cuda:l4 cuda:rtx4090 \\(with [^\n]*xla_cuda_plugin.so\\)"
                         LABELS "cli;devices")
  else()
    message(STATUS "cross-compiling tests: not added (./scripts/fetch_pjrt.sh --cross, and the CUDA toolkit's ptxas)")
  endif()
endif()
# On a machine with the CUDA plugin the run succeeds; on one without (CI's) it fails before loading, naming the
# package to install.
add_test(NAME cli.generate_cuda_needs_its_plugin
         COMMAND kiln_cli generate --model ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell --device cuda
                 --prompt "a red circle" --height 32 --width 32 --steps 1 --seed 1 --dtype f32
                 --max-sequence-length 16 --output ${KILN_DEVICE_WORK}/cli_device_cuda.png)
set_tests_properties(cli.generate_cuda_needs_its_plugin PROPERTIES PASS_REGULAR_EXPRESSION
                     "PJRT: no cuda plugin found\\. Install it: [^\n]*pjrt|no PJRT support|wrote .*cli_device_cuda.png"
                     LABELS "cli;devices")
add_test(NAME cli.generate_device_refuses_sequential_offload
         COMMAND kiln_cli generate --model ${KILN_DEVICE_NO_MODEL} --device xla-cpu --offload sequential --prompt x
                 --output ${KILN_DEVICE_WORK}/cli_device_refused.png)
set_tests_properties(cli.generate_device_refuses_sequential_offload PROPERTIES PASS_REGULAR_EXPRESSION
                     "--device xla-cpu: --offload sequential runs on the cpu only \\(use --offload model or group"
                     LABELS cli)
add_test(NAME cli.generate_device_refuses_packed_weights
         COMMAND kiln_cli generate --model ${KILN_DEVICE_NO_MODEL} --device tpu:1 --packed-weights 1GiB --prompt x
                 --output ${KILN_DEVICE_WORK}/cli_device_refused.png)
set_tests_properties(cli.generate_device_refuses_packed_weights PROPERTIES PASS_REGULAR_EXPRESSION
                     "--device tpu:1: --packed-weights 1GiB sizes the cpu's packed copies"
                     LABELS cli)
add_test(NAME cli.generate_rejects_unknown_device
         COMMAND kiln_cli generate --model ${KILN_DEVICE_NO_MODEL} --device gpu --prompt x
                 --output ${KILN_DEVICE_WORK}/cli_device_refused.png)
set_tests_properties(cli.generate_rejects_unknown_device PROPERTIES PASS_REGULAR_EXPRESSION "--device gpu: " LABELS cli)

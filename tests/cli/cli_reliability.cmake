# kiln generate when a run ends early or is asked too much (issue #16, docs/reliability.md): signals, a file-size
# limit, a checkpoint truncated while in use, unwritable outputs, and absurd sizes refused before loading.
set(KILN_CLI_TINY_FLUX ${CMAKE_CURRENT_SOURCE_DIR}/data/models/flux-tiny-schnell)
set(KILN_CLI_WORK ${CMAKE_CURRENT_BINARY_DIR}/cli-reliability)
foreach(sig INT TERM)
  if(sig STREQUAL "INT")
    set(status 130)
  else()
    set(status 143)
  endif()
  add_test(NAME cli.generate_stops_on_sig${sig}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/interrupt_test.sh $<TARGET_FILE:kiln_cli> ${KILN_CLI_TINY_FLUX}
                   ${KILN_CLI_WORK}/sig${sig} ${sig} ${status})
  set_tests_properties(cli.generate_stops_on_sig${sig} PROPERTIES LABELS cli TIMEOUT 120)
endforeach()
add_test(NAME cli.generate_file_size_limit
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/file_size_limit_test.sh $<TARGET_FILE:kiln_cli>
                 ${KILN_CLI_TINY_FLUX} ${KILN_CLI_WORK}/fsize)
add_test(NAME cli.generate_truncated_checkpoint
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/truncated_checkpoint_test.sh $<TARGET_FILE:kiln_cli>
                 ${KILN_CLI_TINY_FLUX} ${KILN_CLI_WORK}/truncated)
set_tests_properties(cli.generate_file_size_limit cli.generate_truncated_checkpoint PROPERTIES LABELS cli TIMEOUT 120)

# Refused before anything is loaded: the model does not even exist, and no "loading" progress may appear.
set(KILN_CLI_NO_MODEL ${KILN_CLI_WORK}/no-such-model)
set(KILN_CLI_OUT ${KILN_CLI_WORK}/limits.png)
add_test(NAME cli.generate_rejects_huge_height
         COMMAND kiln_cli generate --model ${KILN_CLI_NO_MODEL} --prompt x --height 1000000 --output ${KILN_CLI_OUT})
set_tests_properties(cli.generate_rejects_huge_height PROPERTIES
                     PASS_REGULAR_EXPRESSION "--height 1000000 exceeds the maximum 16384")
add_test(NAME cli.generate_rejects_zero_steps
         COMMAND kiln_cli generate --model ${KILN_CLI_NO_MODEL} --prompt x --steps 0 --output ${KILN_CLI_OUT})
set_tests_properties(cli.generate_rejects_zero_steps PROPERTIES PASS_REGULAR_EXPRESSION "--steps 0 is below the minimum 1")
# 100 KB: above the 64 KiB limit, below the 128 KiB a single argument may have on Linux.
add_test(NAME cli.generate_rejects_huge_prompt
         COMMAND sh -c "exec $<TARGET_FILE:kiln_cli> generate --model ${KILN_CLI_NO_MODEL} \
                        --prompt \"$(printf %0100000d 0)\" --output ${KILN_CLI_OUT}")
set_tests_properties(cli.generate_rejects_huge_prompt PROPERTIES
                     PASS_REGULAR_EXPRESSION "--prompt is 100000 bytes, more than the maximum 65536")
add_test(NAME cli.generate_rejects_missing_image_before_loading
         COMMAND kiln_cli generate --model ${KILN_CLI_NO_MODEL} --prompt x --image ${KILN_CLI_WORK}/no-such.png
                 --output ${KILN_CLI_OUT})
set_tests_properties(cli.generate_rejects_missing_image_before_loading PROPERTIES
                     PASS_REGULAR_EXPRESSION "--image .*/no-such.png: cannot be read as a reference image: No such file")
add_test(NAME cli.generate_rejects_a_folder_as_image
         COMMAND kiln_cli generate --model ${KILN_CLI_NO_MODEL} --prompt x --image ${CMAKE_CURRENT_SOURCE_DIR}/data
                 --output ${KILN_CLI_OUT})
set_tests_properties(cli.generate_rejects_a_folder_as_image PROPERTIES
                     PASS_REGULAR_EXPRESSION "--image .*: cannot be read as a reference image: not a file")
add_test(NAME cli.generate_rejects_unwritable_output
         COMMAND kiln_cli generate --model ${KILN_CLI_TINY_FLUX} --prompt x --output /proc/kiln-out.png)
set_tests_properties(cli.generate_rejects_unwritable_output PROPERTIES
                     PASS_REGULAR_EXPRESSION "--output /proc/kiln-out.png: cannot create a file in /proc")
add_test(NAME cli.generate_rejects_missing_output_folder
         COMMAND kiln_cli generate --model ${KILN_CLI_TINY_FLUX} --prompt x --output ${KILN_CLI_WORK}/none/out.png)
set_tests_properties(cli.generate_rejects_missing_output_folder PROPERTIES
                     PASS_REGULAR_EXPRESSION "--output .*/none/out.png: cannot write: directory .* does not exist")
set_tests_properties(cli.generate_rejects_huge_height cli.generate_rejects_zero_steps cli.generate_rejects_huge_prompt
                     cli.generate_rejects_missing_image_before_loading cli.generate_rejects_a_folder_as_image
                     cli.generate_rejects_unwritable_output cli.generate_rejects_missing_output_folder
                     PROPERTIES FAIL_REGULAR_EXPRESSION "loading" LABELS cli)

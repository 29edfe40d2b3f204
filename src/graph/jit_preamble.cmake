# Embeds half.h, vec.h and elementwise_math.h into the library as string constants
# (build/generated/graph/jit_preamble.inc) for the CPU JIT's generated kernels (src/graph/cpu_codegen.cpp).
# Re-runs whenever one of them changes, so the fused kernels always use the same math as the unfused ones:
# the op math is those files' text, not a copy of it.
set(KILN_JIT_HALF_PATH ${PROJECT_SOURCE_DIR}/include/kiln/core/half.h)
set(KILN_JIT_VEC_PATH ${PROJECT_SOURCE_DIR}/src/backends/cpu/isa/vec.h)
set(KILN_JIT_EW_MATH_PATH ${PROJECT_SOURCE_DIR}/src/backends/cpu/isa/elementwise_math.h)
set_property(
  DIRECTORY ${PROJECT_SOURCE_DIR}
  APPEND
  PROPERTY CMAKE_CONFIGURE_DEPENDS ${KILN_JIT_HALF_PATH} ${KILN_JIT_VEC_PATH} ${KILN_JIT_EW_MATH_PATH})
file(READ ${KILN_JIT_HALF_PATH} KILN_JIT_HALF_H)
file(READ ${KILN_JIT_VEC_PATH} KILN_JIT_VEC_H)
file(READ ${KILN_JIT_EW_MATH_PATH} KILN_JIT_EW_MATH_H)
configure_file(${CMAKE_CURRENT_LIST_DIR}/jit_preamble.inc.in ${PROJECT_BINARY_DIR}/generated/graph/jit_preamble.inc
               @ONLY)
target_include_directories(kiln PRIVATE ${PROJECT_BINARY_DIR}/generated)

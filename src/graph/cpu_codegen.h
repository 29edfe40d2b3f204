// C++ source for one fused elementwise region: explicit 16-lane vectors (the f32x16 math of
// src/backends/cpu/isa/vec.h, embedded into the source), OpenMP-parallel over rows and chunks of the outer
// loop. The entry point is
//   extern "C" void <symbol>(char* const* ptrs, const float* scalars);
// with ptrs = the input base pointers, then the output base pointers; scalars are already rounded to each
// scalar's dtype and widened to float32 by the caller (graph/cpu_jit.cpp).
#pragma once

#include <string>

#include "graph/elementwise_region.h"

namespace kiln::graph {

// `region` must be canonical (ElementwiseRegion::canonical()). `avx512` selects the same vec.h variant as the
// unfused kernels' avx512 build; the generated code must then be compiled with jit_isa_flags(true).
std::string generate_cpu_source(const ElementwiseRegion& region, const std::string& symbol, bool avx512);

// The ISA flags that match the unfused kernels' build of the same variant (CMakeLists.txt kiln_isa_variant).
const char* jit_isa_flags(bool avx512);

// A fingerprint of everything embedded into generated sources (half.h, vec.h, the codegen's own version):
// part of the on-disk cache key, so a Kiln with different math never loads an old kernel.
std::string codegen_fingerprint();

}  // namespace kiln::graph

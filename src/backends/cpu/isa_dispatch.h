// Declares a function that exists in both ISA variants (kiln::cpu_kernels::avx512 and ::generic) and picks
// the variant for this CPU. Usage, in a non-ISA .cpp file:
//   KILN_ISA_DECLARE(void, exp_f32, (const float*, float*, int64_t));
//   KILN_ISA_CALL(exp_f32)(x, y, n);
#pragma once

#include "backends/cpu/cpu_features.h"

#define KILN_ISA_DECLARE(ret, name, params) \
  namespace avx512 {                        \
  ret name params;                          \
  }                                         \
  namespace generic {                       \
  ret name params;                          \
  }

#define KILN_ISA_CALL(name) (::kiln::cpu_kernels::use_avx512() ? avx512::name : generic::name)

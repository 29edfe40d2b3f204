// rounded(x): x, rounded to its type before it is used again. GCC fuses `a * b + c` into one FMA (a single
// rounding) wherever the target has FMA instructions (any aarch64 build, x86 with -mfma or -march=native);
// the schedules must round the product first, as numpy and torch do, to reproduce diffusers bit for bit.
// Passing the product through memory hides it from the optimizer, so it cannot be fused.
#pragma once

namespace kiln::schedulers_detail {

template <class T>
inline T rounded(T v) {
  __asm__("" : "+m"(v));
  return v;
}

}  // namespace kiln::schedulers_detail

// Elementwise ops: unary math, binary arithmetic and comparisons with numpy broadcasting and torch's type
// promotion, where, clamp. Results are new contiguous tensors.
//
// Dtype rules (as torch): two tensors promote with promote_types (bfloat16 with float16 gives float32,
// integers with floating give the floating dtype). A double scalar keeps a floating tensor's dtype and turns
// an integer or bool tensor into float32. div and the transcendental unary ops (exp, log, sqrt, tanh, gelu,
// ...) give float32 for integer/bool inputs. Comparisons give bool. bfloat16 and float16 are computed in
// float32 and rounded once (round to nearest even) to the output dtype.
#pragma once

#include <optional>

#include "kiln/core/tensor.h"

namespace kiln {

// ---- binary arithmetic (broadcasting)
Tensor add(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor add(double a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, double b);
Tensor sub(double a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor mul(double a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division
Tensor div(const Tensor& a, double b);
Tensor div(double a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // NaN if either is NaN
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);

// ---- comparisons (broadcasting) -> bool. A scalar is first rounded to the compute dtype, as torch does.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// ---- unary
enum class GeluApproximate { None, Tanh };

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor square(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);  // x * sigmoid(x)
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::None);
Tensor quick_gelu(const Tensor& x);  // x * sigmoid(1.702 x), as CLIP uses
// Bounds left empty do not apply; at least one must be given. Integer tensors stay integer when the given
// bounds are whole numbers and become float32 otherwise.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// ---- selection: cond (bool) ? a : b, all three broadcast together; a and b promote.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- operators
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, double b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, double b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& x);

}  // namespace kiln

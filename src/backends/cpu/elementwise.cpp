// CPU kernels of the elementwise ops (src/ops/elementwise.cpp). Each op's inputs are broadcast to the output
// shape and walked with for_each_run. Runs whose math is float32 (float32, bfloat16 and float16 tensors) go
// to the vectorized ew_float_run (isa/elementwise_float.cpp); float64, integer and bool tensors use the typed
// scalar loops here. The op front end has already cast operands so that, on the scalar path, every tensor
// input (except where's condition) has the compute dtype.
// The AVX-512 variant lets the compiler contract a*b+c into FMAs and the portable one cannot, so the two
// variants may differ in the last bit of transcendental results; basic arithmetic is identical.
//
// Attributes: "scalar" (double) and "scalar_first" (bool) replace a missing tensor operand of a binary op;
// "lo"/"hi" (double, optional) for clamp; "exponent" (double) for pow_scalar.
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

#include "backends/cpu/copy.h"
#include "backends/cpu/elementwise_op.h"
#include "backends/cpu/isa_dispatch.h"
#include "backends/cpu/register_kernels.h"
#include "backends/cpu/strided_loop.h"

namespace kiln::cpu_kernels {

KILN_ISA_DECLARE(void, ew_float_run,
                 (EwOp op, const EwParams& params, const EwOperand* inputs, char* out, int64_t out_stride,
                  DType out_dtype, int64_t n));

namespace {

bool is_float_math(DType d) {
  return d == DType::Float32 || d == DType::BFloat16 || d == DType::Float16;
}

// The parts of an OpCall that both paths need.
struct EwCall {
  EwOp op;
  EwParams params;
  std::vector<Tensor> inputs;  // broadcast to the output's shape
  bool has_scalar = false;
  bool scalar_first = false;
  double scalar = 0;
};

// Operands smaller than this are read as they lie, whatever their layout.
constexpr int64_t kRelayoutMinElements = int64_t{1} << 16;

// An operand whose elements the output's rows would read across its own rows (a permuted view, as SD3's
// patches.flatten(2).transpose(1, 2) + pos_embed is) is first copied into the output's layout, tile by tile
// (copy.h): walked in the output's order, it would fetch each of its cache lines once per element (that one
// add was 4% of an SD3.5 1024^2 step).
Tensor in_output_layout(const Tensor& t, const Tensor& out) {
  if (t.numel() < kRelayoutMinElements || !out.is_contiguous() || !copy_reads_transposed(t, out)) return t;
  const Tensor laid_out = Tensor::empty(out.shape(), t.dtype(), t.device());
  copy_tensor(t, laid_out);
  return laid_out;
}

EwCall decode(EwOp op, const runtime::OpCall& call) {
  EwCall c{op, {}, {}};
  const Tensor& out = call.outputs[0];
  for (const Tensor& t : call.inputs) c.inputs.push_back(in_output_layout(t.expand(out.shape()), out));
  if (call.attrs.has("scalar")) {
    c.has_scalar = true;
    c.scalar = call.attrs.get_float("scalar");
    c.scalar_first = call.attrs.get_bool("scalar_first");
  }
  c.params.lo = call.attrs.has("lo") ? call.attrs.get_float("lo") : -HUGE_VAL;
  c.params.hi = call.attrs.has("hi") ? call.attrs.get_float("hi") : HUGE_VAL;
  if (call.attrs.has("exponent")) c.params.exponent = call.attrs.get_float("exponent");
  return c;
}

// Calls fn(ptrs, n, strides) for the runs of [out, inputs...]. Not a template on fn: each op's loop below
// only fills a run, so the walk (and its OpenMP region) is compiled three times in all rather than once per op
// and dtype.
using OperandRunFn = std::function<void(std::array<char*, 4>, int64_t, std::array<int64_t, 4>)>;
void for_each_operand_run(const Tensor& out, const std::vector<Tensor>& ins, const OperandRunFn& fn) {
  auto go = [&]<size_t N>(std::integral_constant<size_t, N>) {
    std::array<char*, N> base;
    std::array<Strides, N> strides;
    base[0] = static_cast<char*>(out.raw_data());
    strides[0] = byte_strides(out);
    for (size_t k = 1; k < N; ++k) {
      base[k] = static_cast<char*>(ins[k - 1].raw_data());
      strides[k] = byte_strides(ins[k - 1]);
    }
    for_each_run<N>(out.shape(), base, strides,
                    [&fn](std::array<char*, N> p, int64_t n, std::array<int64_t, N> s) {
                      std::array<char*, 4> p4{};
                      std::array<int64_t, 4> s4{};
                      for (size_t k = 0; k < N; ++k) {
                        p4[k] = p[k];
                        s4[k] = s[k];
                      }
                      fn(p4, n, s4);
                    });
  };
  switch (ins.size()) {
    case 1:
      return go(std::integral_constant<size_t, 2>{});
    case 2:
      return go(std::integral_constant<size_t, 3>{});
    case 3:
      return go(std::integral_constant<size_t, 4>{});
    default:
      KILN_FAIL("internal: elementwise op with " << ins.size() << " tensor inputs");
  }
}

void run_float(const EwCall& c, const Tensor& out) {
  const auto fn = KILN_ISA_CALL(ew_float_run);
  const float scalar = static_cast<float>(c.scalar);
  const int tensors = static_cast<int>(c.inputs.size());
  DType dtypes[3];
  for (int k = 0; k < tensors; ++k) dtypes[k] = c.inputs[k].dtype();
  for_each_operand_run(out, c.inputs, [&](std::array<char*, 4> p, int64_t n, std::array<int64_t, 4> s) {
    EwOperand ops[3];
    int k = 0;
    const EwOperand scalar_operand{reinterpret_cast<const char*>(&scalar), 0, DType::Float32};
    if (c.has_scalar && c.scalar_first) ops[k++] = scalar_operand;
    for (int t = 0; t < tensors; ++t) ops[k++] = EwOperand{p[t + 1], s[t + 1], dtypes[t]};
    if (c.has_scalar && !c.scalar_first) ops[k++] = scalar_operand;
    fn(c.op, c.params, ops, p[0], s[0], out.dtype(), n);
  });
}

// ---- scalar path: float64, integers and bool

template <class T>
T load_as(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Integer arithmetic wraps around like torch's instead of being undefined on overflow.
template <class T, bool = std::is_integral_v<T> && !std::is_same_v<T, bool>>
struct WideOf {
  using type = T;
};
template <class T>
struct WideOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using Wide = typename WideOf<T>::type;

template <class T>
T wrap_add(T a, T b) {
  if constexpr (std::is_same_v<T, bool>)
    return a || b;
  else
    return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
}
template <class T>
T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<Wide<T>>(a) - static_cast<Wide<T>>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_same_v<T, bool>)
    return a && b;
  else
    return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
}

// Integer power by squaring; negative exponents give 1/a^n truncated, as torch does.
template <class T>
T int_pow(T a, T e) {
  if (e < 0) {
    if (a == 1) return 1;
    if (a == -1) return (e % 2 == 0) ? T(1) : T(-1);
    return 0;
  }
  T r = 1;
  while (e) {
    if (e & 1) r = wrap_mul(r, a);
    e = static_cast<T>(e >> 1);
    if (e) a = wrap_mul(a, a);
  }
  return r;
}

template <class T, class O, class F>
void loop(const EwCall& c, const Tensor& out, F f) {
  const T scalar = scalar_from_double<T>(c.scalar);
  const int arity = ew_arity(c.op);
  for_each_operand_run(out, c.inputs, [&](std::array<char*, 4> p, int64_t n, std::array<int64_t, 4> s) {
    // Operand order with the scalar put back in its place.
    const char* ptr[3];
    int64_t stride[3];
    int k = 0;
    const char* sp = reinterpret_cast<const char*>(&scalar);
    if (c.has_scalar && c.scalar_first) ptr[k] = sp, stride[k++] = 0;
    for (size_t t = 0; t < c.inputs.size(); ++t) ptr[k] = p[t + 1], stride[k++] = s[t + 1];
    if (c.has_scalar && !c.scalar_first) ptr[k] = sp, stride[k++] = 0;
    for (int64_t i = 0; i < n; ++i) {
      O r{};
      if (arity == 1) {
        if constexpr (std::is_invocable_v<F, T>) r = f(load_as<T>(ptr[0] + i * stride[0]));
      } else if (arity == 2) {
        if constexpr (std::is_invocable_v<F, T, T>)
          r = f(load_as<T>(ptr[0] + i * stride[0]), load_as<T>(ptr[1] + i * stride[1]));
      } else {
        if constexpr (std::is_invocable_v<F, bool, T, T>)
          r = f(load_as<bool>(ptr[0] + i * stride[0]), load_as<T>(ptr[1] + i * stride[1]),
                load_as<T>(ptr[2] + i * stride[2]));
      }
      std::memcpy(p[0] + i * s[0], &r, sizeof r);
    }
  });
}

template <class T>
void run_scalar(const EwCall& c, const Tensor& out) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  constexpr bool kBool = std::is_same_v<T, bool>;
  const EwParams prm = c.params;
  switch (c.op) {
    case EwOp::Add:
      return loop<T, T>(c, out, [](T a, T b) { return wrap_add(a, b); });
    case EwOp::Mul:
      return loop<T, T>(c, out, [](T a, T b) { return wrap_mul(a, b); });
    case EwOp::Maximum:
      return loop<T, T>(c, out, [](T a, T b) {
        if constexpr (kFloat)
          if (a != a || b != b) return a != a ? a : b;
        return a > b ? a : b;
      });
    case EwOp::Minimum:
      return loop<T, T>(c, out, [](T a, T b) {
        if constexpr (kFloat)
          if (a != a || b != b) return a != a ? a : b;
        return a < b ? a : b;
      });
    case EwOp::Eq:
      return loop<T, bool>(c, out, [](T a, T b) { return a == b; });
    case EwOp::Ne:
      return loop<T, bool>(c, out, [](T a, T b) { return a != b; });
    case EwOp::Lt:
      return loop<T, bool>(c, out, [](T a, T b) { return a < b; });
    case EwOp::Le:
      return loop<T, bool>(c, out, [](T a, T b) { return a <= b; });
    case EwOp::Gt:
      return loop<T, bool>(c, out, [](T a, T b) { return a > b; });
    case EwOp::Ge:
      return loop<T, bool>(c, out, [](T a, T b) { return a >= b; });
    case EwOp::Where:
      return loop<T, T>(c, out, [](bool cond, T a, T b) { return cond ? a : b; });
    case EwOp::Clamp:
      return loop<T, T>(c, out, [prm](T x) {
        // Bounds are integral here unless T is floating (the front end promotes otherwise).
        if constexpr (kFloat) {
          const T r = x < prm.lo ? static_cast<T>(prm.lo) : x;
          return r > prm.hi ? static_cast<T>(prm.hi) : r;
        } else {
          const double v = static_cast<double>(x);
          return v < prm.lo ? static_cast<T>(prm.lo) : (v > prm.hi ? static_cast<T>(prm.hi) : x);
        }
      });
    default:
      break;
  }
  if constexpr (!kBool) {
    switch (c.op) {
      case EwOp::Sub:
        return loop<T, T>(c, out, [](T a, T b) { return wrap_sub(a, b); });
      case EwOp::Neg:
        return loop<T, T>(c, out, [](T x) { return wrap_sub(T(0), x); });
      case EwOp::Abs:
        return loop<T, T>(c, out, [](T x) { return x < 0 ? wrap_sub(T(0), x) : x; });
      case EwOp::Square:
        return loop<T, T>(c, out, [](T x) { return wrap_mul(x, x); });
      case EwOp::Pow:
        if constexpr (kFloat)
          return loop<T, T>(c, out, [](T a, T b) { return std::pow(a, b); });
        else
          return loop<T, T>(c, out, [](T a, T b) { return int_pow(a, b); });
      default:
        break;
    }
  }
  if constexpr (kFloat) {
    switch (c.op) {
      case EwOp::Div:
        return loop<T, T>(c, out, [](T a, T b) { return a / b; });
      case EwOp::Exp:
        return loop<T, T>(c, out, [](T x) { return std::exp(x); });
      case EwOp::Log:
        return loop<T, T>(c, out, [](T x) { return std::log(x); });
      case EwOp::Sqrt:
        return loop<T, T>(c, out, [](T x) { return std::sqrt(x); });
      case EwOp::Rsqrt:
        return loop<T, T>(c, out, [](T x) { return 1 / std::sqrt(x); });
      case EwOp::Sin:
        return loop<T, T>(c, out, [](T x) { return std::sin(x); });
      case EwOp::Cos:
        return loop<T, T>(c, out, [](T x) { return std::cos(x); });
      case EwOp::Tanh:
        return loop<T, T>(c, out, [](T x) { return std::tanh(x); });
      case EwOp::Sigmoid:
        return loop<T, T>(c, out, [](T x) { return 1 / (1 + std::exp(-x)); });
      // x * g(x) activations: the limit 0 at -inf instead of the formula's -inf * 0 = NaN.
      case EwOp::Silu:
        return loop<T, T>(c, out,
                          [](T x) { return std::isinf(x) && x < 0 ? T(-0.0) : x / (1 + std::exp(-x)); });
      case EwOp::Gelu:
        return loop<T, T>(c, out, [](T x) {
          return std::isinf(x) && x < 0 ? T(-0.0) : x * 0.5 * (1 + std::erf(x * M_SQRT1_2));
        });
      case EwOp::GeluTanh:
        return loop<T, T>(c, out, [](T x) {
          if (std::isinf(x)) return x < 0 ? T(-0.0) : x;
          return 0.5 * x * (1 + std::tanh(M_SQRT2 * M_2_SQRTPI * 0.5 * (x + 0.044715 * x * x * x)));
        });
      case EwOp::QuickGelu:
        return loop<T, T>(
            c, out, [](T x) { return std::isinf(x) && x < 0 ? T(-0.0) : x / (1 + std::exp(-1.702 * x)); });
      case EwOp::PowScalar:
        return loop<T, T>(c, out, [e = prm.exponent](T x) { return e == 2.0 ? x * x : std::pow(x, e); });
      default:
        break;
    }
  }
  KILN_FAIL("internal: elementwise op " << static_cast<int>(c.op) << " has no " << dtype_name(dtype_of_v<T>)
                                        << " kernel");
}

template <EwOp kOp>
void ew_kernel(const runtime::OpCall& call) {
  const Tensor& out = call.outputs[0];
  if (out.numel() == 0) return;
  const EwCall c = decode(kOp, call);
  // The compute dtype is that of the tensor operands (where's condition aside); see the file comment.
  const DType compute = c.inputs[kOp == EwOp::Where ? 1 : 0].dtype();
  // Float32 math whenever the result or a tensor operand is a 16/32-bit float: bool operands (div of two
  // bools, bool + 0.5) are read as 0/1 there.
  bool float_math = is_float_math(out.dtype());
  for (size_t k = kOp == EwOp::Where ? 1 : 0; k < c.inputs.size(); ++k)
    float_math |= is_float_math(c.inputs[k].dtype());
  if (float_math) return run_float(c, out);
  visit_dtype(compute, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t> || std::is_same_v<T, float>) {
      KILN_FAIL("internal: 16-bit float operand on the scalar elementwise path");
    } else {
      run_scalar<T>(c, out);
    }
  });
}

}  // namespace

// One kernel per EwOp, each registered under the op's own name: a new op is named once (elementwise_op.h).
void register_elementwise_kernels(runtime::KernelRegistry& registry) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (registry.add(runtime::ew_op_name(static_cast<EwOp>(I)), DeviceType::CPU,
                  ew_kernel<static_cast<EwOp>(I)>),
     ...);
  }
  (std::make_integer_sequence<int, runtime::kEwOpCount>{});
}

}  // namespace kiln::cpu_kernels

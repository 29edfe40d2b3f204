#include "graph/cpu_codegen.h"

#include <sstream>

#include "graph/jit_preamble.inc"
#include "kiln/core/error.h"

namespace kiln::graph {

namespace {

// Bump when the generated code changes in a way that alters results or the entry point.
constexpr const char* kCodegenVersion = "cpu-codegen-1";

// Elements per work item along the inner dim: big enough to amortise the loop set-up, small enough that a
// single long row still spreads over every thread.
constexpr int64_t kChunk = 4096;
// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kParallelMin = 32768;

// Drops `#pragma once` and includes of Kiln headers (every quoted include): the pieces are pasted into one
// translation unit, in dependency order.
std::string strip_header(const std::string& text) {
  std::istringstream in(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("#pragma once", 0) == 0 || line.rfind("#include \"", 0) == 0) {
      out << "// (a Kiln header line was removed here)\n";
      continue;
    }
    out << line << '\n';
  }
  return out.str();
}

const char* c_type(DType d) {
  switch (d) {
    case DType::Float32:
      return "float";
    case DType::BFloat16:
      return "bf16_t";
    case DType::Float16:
      return "f16_t";
    default:
      KILN_FAIL("fused_elementwise: internal: no C type for " << dtype_name(d));
  }
}

// The f32 value rounded to dtype `d` (in registers).
std::string rounded(const std::string& expr, DType d) {
  switch (d) {
    case DType::BFloat16:
      return "round_bf16(" + expr + ")";
    case DType::Float16:
      return "round_f16(" + expr + ")";
    default:
      return expr;
  }
}

// One node's expression, written exactly as the unfused kernel computes it (isa/elementwise_float.cpp):
// every op beyond one operator or one vec.h call is a function of isa/elementwise_math.h, which both use, so
// results agree bit for bit; tests/graph compare every op against the unfused ops.
std::string node_expr(const FusedNode& n) {
  const std::string a = n.args[0] >= 0 ? "v" + std::to_string(n.args[0]) : "";
  const std::string b = n.args[1] >= 0 ? "v" + std::to_string(n.args[1]) : "";
  if (n.kind == FusedKind::Cast) return a;  // the rounding is the node's (rounded())
  switch (n.op) {
    case EwOp::Neg:
      return "-" + a;
    case EwOp::Abs:
      return "vabs(" + a + ")";
    case EwOp::Exp:
      return "vexp(" + a + ")";
    case EwOp::Log:
      return "vlog(" + a + ")";
    case EwOp::Sqrt:
      return "vsqrt(" + a + ")";
    case EwOp::Rsqrt:
      return "ew_rsqrt(" + a + ")";
    case EwOp::Tanh:
      return "vtanh(" + a + ")";
    case EwOp::Sigmoid:
      return "vsigmoid(" + a + ")";
    case EwOp::Silu:
      return "act_silu(" + a + ")";
    case EwOp::Gelu:
      return "act_gelu(" + a + ")";
    case EwOp::GeluTanh:
      return "act_gelu_tanh(" + a + ")";
    case EwOp::QuickGelu:
      return "act_quick_gelu(" + a + ")";
    case EwOp::Square:
      return a + " * " + a;
    case EwOp::Add:
      return a + " + " + b;
    case EwOp::Sub:
      return a + " - " + b;
    case EwOp::Mul:
      return a + " * " + b;
    case EwOp::Div:
      return a + " / " + b;
    case EwOp::Maximum:
      return "ew_maximum(" + a + ", " + b + ")";
    case EwOp::Minimum:
      return "ew_minimum(" + a + ", " + b + ")";
    case EwOp::Clamp: {
      std::string e = a;
      if (n.args[1] >= 0) e = "ew_clamp_lo(" + e + ", v" + std::to_string(n.args[1]) + ")";
      if (n.args[2] >= 0) e = "ew_clamp_hi(" + e + ", v" + std::to_string(n.args[2]) + ")";
      return e;
    }
    default:
      break;
  }
  KILN_FAIL("fused_elementwise: internal: no expression for " << fused_node_name(n));
}

// What only the generated kernels need beyond the embedded headers: rounding in registers (the unfused
// kernels round when they store) and the widening of one strided element.
constexpr const char* kJitHelpers = R"(
namespace kiln::cpu_kernels::KILN_ISA {

inline f32x16 round_bf16(f32x16 v) {
  const u32x16 u = f32_to_bits(v);
  const u32x16 is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  const u32x16 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return bits_to_f32(is_nan ? ((u & 0xffff0000u) | 0x00400000u) : r);
}
inline f32x16 round_f16(f32x16 v) {
  f16_t t[kLanes];
  store(t, v);
  return load(t);
}
inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bf16_to_f32(v); }
inline float to_f32(f16_t v) { return f16_to_f32(v); }

}  // namespace kiln::cpu_kernels::KILN_ISA
)";

// The body for 16 lanes at inner index i (`partial`: n < 16 lanes).
void emit_body(std::ostringstream& s, const ElementwiseRegion& r, bool partial, const char* indent) {
  const size_t ndim = r.shape().size();
  for (size_t v = 0; v < r.nodes().size(); ++v) {
    const FusedNode& n = r.nodes()[v];
    s << indent << "const f32x16 v" << v << " = ";
    if (n.kind == FusedKind::Input) {
      const int k = n.index;
      const int64_t st = r.inputs()[static_cast<size_t>(k)].strides[ndim - 1];
      if (st == 0) {
        s << "bc" << k << ";\n";
      } else if (st == 1) {
        s << (partial ? "load_partial(" : "load(") << "in" << k << " + b" << k << " + i"
          << (partial ? ", n" : "") << ");\n";
      } else {
        s << "[&] { f32x16 g{}; for (int l = 0; l < " << (partial ? "n" : "kLanes")
          << "; ++l) g[l] = to_f32(in" << k << "[b" << k << " + (i + l) * " << st << "]); return g; }();\n";
      }
    } else if (n.kind == FusedKind::Scalar) {
      s << "sc" << n.index << ";\n";
    } else {
      s << rounded(node_expr(n), n.dtype) << ";\n";
    }
  }
  for (size_t j = 0; j < r.outputs().size(); ++j) {
    const FusedOutput& o = r.outputs()[j];
    if (partial)
      s << indent << "store_partial(out" << j << " + ob + i, v" << o.value << ", n);\n";
    else
      s << indent << "store(out" << j << " + ob + i, v" << o.value << ");\n";
  }
}

}  // namespace

const char* jit_isa_flags(bool avx512) {
  return avx512 ? "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c "
                  "-mprefer-vector-width=512"
                : "-mtune=generic";
}

std::string codegen_fingerprint() {
  std::string all = std::string(kCodegenVersion) + '\n' + embedded::kHalfH + '\n' + embedded::kVecH + '\n' +
                    embedded::kElementwiseMathH + '\n' + kJitHelpers;
  return std::string(kCodegenVersion) + "-" + hex64(fnv1a64(all.data(), all.size()));
}

std::string generate_cpu_source(const ElementwiseRegion& r, const std::string& symbol, bool avx512) {
  const Shape& shape = r.shape();
  KILN_CHECK(!shape.empty(), "fused_elementwise: internal: codegen needs a canonical region");
  const size_t ndim = shape.size();
  const int64_t inner = shape.back();
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < ndim; ++d) outer *= shape[d];
  const int64_t chunks = inner == 0 ? 0 : (inner + kChunk - 1) / kChunk;
  const int64_t items = outer * chunks;

  std::ostringstream s;
  s << "// Fused elementwise kernel generated by Kiln " << embedded::kKilnVersion << " ("
    << (avx512 ? "avx512" : "generic") << ").\n// key: " << r.structural_key() << "\n";
  s << "#include <cstdint>\n#include <cstring>\n#include <bit>\n";
  s << "#define KILN_ISA jit\n";
  s << strip_header(embedded::kHalfH) << strip_header(embedded::kVecH)
    << strip_header(embedded::kElementwiseMathH) << kJitHelpers;
  s << "\nextern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
    << "(char* const* ptrs, const float* scalars) {\n";
  s << "  using namespace kiln;\n  using namespace kiln::cpu_kernels::jit;\n";
  for (size_t k = 0; k < r.inputs().size(); ++k) {
    const char* t = c_type(r.inputs()[k].dtype);
    s << "  const " << t << "* in" << k << " = reinterpret_cast<const " << t << "*>(ptrs[" << k << "]);\n";
  }
  for (size_t j = 0; j < r.outputs().size(); ++j) {
    const char* t = c_type(r.outputs()[j].dtype);
    s << "  " << t << "* out" << j << " = reinterpret_cast<" << t << "*>(ptrs[" << r.inputs().size() + j
      << "]);\n";
  }
  for (int k = 0; k < r.scalar_count(); ++k)
    s << "  const f32x16 sc" << k << " = splat(scalars[" << k << "]);\n";
  s << "  (void)scalars;\n";
  s << "  constexpr int64_t kInner = " << inner << ", kChunk = " << kChunk << ", kChunks = " << chunks
    << ", kItems = " << items << ";\n";
  s << "#pragma omp parallel for schedule(static) if (kItems > 1 && kItems * kChunk >= " << kParallelMin
    << ")\n";
  s << "  for (int64_t item = 0; item < kItems; ++item) {\n";
  s << "    const int64_t o = item / kChunks;\n";
  s << "    const int64_t c0 = (item % kChunks) * kChunk;\n";
  s << "    const int64_t c1 = c0 + kChunk < kInner ? c0 + kChunk : kInner;\n";
  s << "    const int64_t ob = o * kInner;\n";
  // Base offset of each input's row: unravel o over the outer dims (innermost first).
  s << "    int64_t rem = o;\n    (void)rem;\n";
  for (size_t k = 0; k < r.inputs().size(); ++k) s << "    int64_t b" << k << " = 0;\n";
  for (size_t d = ndim - 1; d-- > 0;) {
    s << "    {\n      const int64_t idx = rem % " << shape[d] << ";\n      rem /= " << shape[d] << ";\n";
    for (size_t k = 0; k < r.inputs().size(); ++k) {
      const int64_t st = r.inputs()[k].strides[d];
      if (st != 0) s << "      b" << k << " += idx * " << st << ";\n";
    }
    s << "      (void)idx;\n    }\n";
  }
  // Inputs broadcast along the inner dim: one value per row.
  for (size_t k = 0; k < r.inputs().size(); ++k)
    if (r.inputs()[k].strides[ndim - 1] == 0)
      s << "    const f32x16 bc" << k << " = splat(to_f32(in" << k << "[b" << k << "]));\n";
  s << "    int64_t i = c0;\n";
  s << "    for (; i + kLanes <= c1; i += kLanes) {\n";
  emit_body(s, r, false, "      ");
  s << "    }\n";
  s << "    if (i < c1) {\n      const int n = static_cast<int>(c1 - i);\n";
  emit_body(s, r, true, "      ");
  s << "    }\n  }\n}\n";
  return s.str();
}

}  // namespace kiln::graph

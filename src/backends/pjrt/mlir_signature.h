// The parameters of a StableHLO module's @main, read from its MLIR text. PJRT's C API does not report an
// executable's parameter shapes, and a plugin given buffers of the wrong shape may abort instead of returning
// an error, so Client::compile reads them here and Client::execute checks every argument against them.
#pragma once

#include <string_view>
#include <vector>

#include "backends/pjrt/pjrt_client.h"

namespace kiln::pjrt {

// The parameter types of `func.func @main`, in either textual form:
//   pretty:  func.func public @main(%arg0: tensor<2x3xf32> {attrs}, %arg1: tensor<i1>) -> ...
//   generic: "func.func"() <{function_type = (tensor<2x3xf32>, tensor<i1>) -> ..., sym_name = "main"}> ...
// Element types: f32 bf16 f16 f64 i64 i32 i16 i8 ui8 i1 (Kiln's dtypes). Throws a kiln::Error naming the
// problem for text without @main, a parameter that is not a statically shaped tensor of those types, or an
// unbalanced signature. Checks only the signature: the plugin reports errors in the rest of the module.
std::vector<ArraySpec> main_parameters(std::string_view mlir_text);

// "tensor<2x3xf32>" -> {Float32, {2, 3}}; "tensor<f32>" -> a scalar. Throws naming the type otherwise.
ArraySpec parse_tensor_type(std::string_view type);

}  // namespace kiln::pjrt

module @kiln_linear {
  func.func public @main(%arg0: tensor<8xbf16>, %arg1: tensor<12xbf16>, %arg2: tensor<3xbf16>) -> (tensor<6xbf16>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<8xbf16>) -> tensor<2x4xbf16>
    %3 = "stablehlo.reshape"(%arg1) : (tensor<12xbf16>) -> tensor<3x4xbf16>
    %5 = "stablehlo.dot_general"(%1, %3) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>}> : (tensor<2x4xbf16>, tensor<3x4xbf16>) -> tensor<2x3xf32>
    %6 = "stablehlo.convert"(%arg2) : (tensor<3xbf16>) -> tensor<3xf32>
    %7 = "stablehlo.broadcast_in_dim"(%6) <{broadcast_dimensions = array<i64: 1>}> : (tensor<3xf32>) -> tensor<2x3xf32>
    %8 = "stablehlo.add"(%5, %7) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %9 = "stablehlo.convert"(%8) : (tensor<2x3xf32>) -> tensor<2x3xbf16>
    %10 = "stablehlo.reshape"(%9) : (tensor<2x3xbf16>) -> tensor<6xbf16>
    "func.return"(%10) : (tensor<6xbf16>) -> ()
  }
}

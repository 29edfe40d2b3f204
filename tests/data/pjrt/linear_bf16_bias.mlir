module @kiln_linear {
  func.func public @main(%arg0: tensor<2x8xbf16>, %arg1: tensor<4x8xbf16>, %arg2: tensor<4xbf16>) -> (tensor<2x4xbf16>) {
    %3 = "stablehlo.dot_general"(%arg0, %arg1) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>}> : (tensor<2x8xbf16>, tensor<4x8xbf16>) -> tensor<2x4xf32>
    %4 = "stablehlo.convert"(%arg2) : (tensor<4xbf16>) -> tensor<4xf32>
    %5 = "stablehlo.broadcast_in_dim"(%4) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %6 = "stablehlo.add"(%3, %5) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %7 = "stablehlo.convert"(%6) : (tensor<2x4xf32>) -> tensor<2x4xbf16>
    "func.return"(%7) : (tensor<2x4xbf16>) -> ()
  }
}

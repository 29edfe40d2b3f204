module @kiln_add {
  func.func public @main(%arg0: tensor<6xf32>, %arg1: tensor<3xf32>) -> (tensor<6xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<6xf32>) -> tensor<2x3xf32>
    %3 = "stablehlo.broadcast_in_dim"(%arg1) <{broadcast_dimensions = array<i64: 1>}> : (tensor<3xf32>) -> tensor<2x3xf32>
    %4 = "stablehlo.add"(%1, %3) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %5 = "stablehlo.reshape"(%4) : (tensor<2x3xf32>) -> tensor<6xf32>
    "func.return"(%5) : (tensor<6xf32>) -> ()
  }
}

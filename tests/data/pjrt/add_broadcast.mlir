module @kiln_add {
  func.func public @main(%arg0: tensor<2x8xf32>, %arg1: tensor<8xf32>) -> (tensor<2x8xf32>) {
    %2 = "stablehlo.broadcast_in_dim"(%arg1) <{broadcast_dimensions = array<i64: 1>}> : (tensor<8xf32>) -> tensor<2x8xf32>
    %3 = "stablehlo.add"(%arg0, %2) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    "func.return"(%3) : (tensor<2x8xf32>) -> ()
  }
}

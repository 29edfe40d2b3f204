module @kiln_copy {
  func.func public @main(%arg0: tensor<9xf32>, %arg1: tensor<3x8xf32>) -> (tensor<3x8xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<9xf32>) -> tensor<3x3xf32>
    %2 = "stablehlo.transpose"(%1) <{permutation = array<i64: 1, 0>}> : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %4 = "stablehlo.constant"() <{value = dense<0> : tensor<i64>}> : () -> tensor<i64>
    %5 = "stablehlo.constant"() <{value = dense<2> : tensor<i64>}> : () -> tensor<i64>
    %6 = "stablehlo.dynamic_update_slice"(%arg1, %2, %4, %5) : (tensor<3x8xf32>, tensor<3x3xf32>, tensor<i64>, tensor<i64>) -> tensor<3x8xf32>
    "func.return"(%6) : (tensor<3x8xf32>) -> ()
  }
}

module @kiln_copy {
  func.func public @main(%arg0: tensor<3x3xf32>, %arg1: tensor<3x8xf32>) -> (tensor<3x8xf32>) {
    %1 = "stablehlo.transpose"(%arg0) <{permutation = array<i64: 1, 0>}> : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %3 = "stablehlo.constant"() <{value = dense<0> : tensor<i64>}> : () -> tensor<i64>
    %4 = "stablehlo.constant"() <{value = dense<2> : tensor<i64>}> : () -> tensor<i64>
    %5 = "stablehlo.dynamic_update_slice"(%arg1, %1, %3, %4) : (tensor<3x8xf32>, tensor<3x3xf32>, tensor<i64>, tensor<i64>) -> tensor<3x8xf32>
    "func.return"(%5) : (tensor<3x8xf32>) -> ()
  }
}

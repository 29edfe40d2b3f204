module @kiln_copy {
  func.func public @main(%arg0: tensor<9xf32>, %arg1: tensor<24xf32>) -> (tensor<24xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<9xf32>) -> tensor<3x3xf32>
    %2 = "stablehlo.transpose"(%1) <{permutation = array<i64: 1, 0>}> : (tensor<3x3xf32>) -> tensor<3x3xf32>
    %4 = "stablehlo.reshape"(%2) : (tensor<3x3xf32>) -> tensor<3x3x1xf32>
    %5 = "stablehlo.slice"(%arg1) <{start_indices = array<i64: 2>, limit_indices = array<i64: 24>, strides = array<i64: 1>}> : (tensor<24xf32>) -> tensor<22xf32>
    %6 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %7 = "stablehlo.pad"(%5, %6) <{edge_padding_low = array<i64: 0>, edge_padding_high = array<i64: 2>, interior_padding = array<i64: 0>}> : (tensor<22xf32>, tensor<f32>) -> tensor<24xf32>
    %8 = "stablehlo.reshape"(%7) : (tensor<24xf32>) -> tensor<3x8x1xf32>
    %9 = "stablehlo.constant"() <{value = dense<0> : tensor<i64>}> : () -> tensor<i64>
    %10 = "stablehlo.constant"() <{value = dense<0> : tensor<i64>}> : () -> tensor<i64>
    %11 = "stablehlo.constant"() <{value = dense<0> : tensor<i64>}> : () -> tensor<i64>
    %12 = "stablehlo.dynamic_update_slice"(%8, %4, %9, %10, %11) : (tensor<3x8x1xf32>, tensor<3x3x1xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<3x8x1xf32>
    %13 = "stablehlo.reshape"(%12) : (tensor<3x8x1xf32>) -> tensor<24xf32>
    %14 = "stablehlo.slice"(%13) <{start_indices = array<i64: 0>, limit_indices = array<i64: 22>, strides = array<i64: 1>}> : (tensor<24xf32>) -> tensor<22xf32>
    %15 = "stablehlo.constant"() <{value = dense<2> : tensor<i64>}> : () -> tensor<i64>
    %16 = "stablehlo.dynamic_update_slice"(%arg1, %14, %15) : (tensor<24xf32>, tensor<22xf32>, tensor<i64>) -> tensor<24xf32>
    "func.return"(%16) : (tensor<24xf32>) -> ()
  }
}

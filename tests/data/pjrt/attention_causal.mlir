module @kiln_scaled_dot_product_attention {
  func.func public @main(%arg0: tensor<6x4xf32>, %arg1: tensor<6x4xf32>, %arg2: tensor<6x4xf32>) -> (tensor<6x4xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<6x4xf32>) -> tensor<1x2x3x4xf32>
    %3 = "stablehlo.reshape"(%arg1) : (tensor<6x4xf32>) -> tensor<1x2x3x4xf32>
    %5 = "stablehlo.reshape"(%arg2) : (tensor<6x4xf32>) -> tensor<1x2x3x4xf32>
    %6 = "stablehlo.dot_general"(%1, %3) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x3xf32>
    %7 = "stablehlo.constant"() <{value = dense<5.000000000e-01> : tensor<1x2x3x3xf32>}> : () -> tensor<1x2x3x3xf32>
    %8 = "stablehlo.multiply"(%6, %7) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %9 = "stablehlo.iota"() <{iota_dimension = 2 : i64}> : () -> tensor<1x2x3x3xi64>
    %10 = "stablehlo.iota"() <{iota_dimension = 3 : i64}> : () -> tensor<1x2x3x3xi64>
    %11 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<1x2x3x3xf32>}> : () -> tensor<1x2x3x3xf32>
    %12 = "stablehlo.compare"(%10, %9) <{comparison_direction = #stablehlo<comparison_direction LE>, compare_type = #stablehlo<comparison_type SIGNED>}> : (tensor<1x2x3x3xi64>, tensor<1x2x3x3xi64>) -> tensor<1x2x3x3xi1>
    %13 = "stablehlo.select"(%12, %8, %11) : (tensor<1x2x3x3xi1>, tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %14 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %18 = "stablehlo.reduce"(%13, %14) <{dimensions = array<i64: 3>}> ({
    ^bb0(%15: tensor<f32>, %16: tensor<f32>):
      %17 = "stablehlo.maximum"(%15, %16) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%17) : (tensor<f32>) -> ()
    }) : (tensor<1x2x3x3xf32>, tensor<f32>) -> tensor<1x2x3xf32>
    %19 = "stablehlo.broadcast_in_dim"(%18) <{broadcast_dimensions = array<i64: 0, 1, 2>}> : (tensor<1x2x3xf32>) -> tensor<1x2x3x3xf32>
    %20 = "stablehlo.subtract"(%13, %19) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %21 = "stablehlo.exponential"(%20) : (tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %22 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %26 = "stablehlo.reduce"(%21, %22) <{dimensions = array<i64: 3>}> ({
    ^bb0(%23: tensor<f32>, %24: tensor<f32>):
      %25 = "stablehlo.add"(%23, %24) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%25) : (tensor<f32>) -> ()
    }) : (tensor<1x2x3x3xf32>, tensor<f32>) -> tensor<1x2x3xf32>
    %27 = "stablehlo.broadcast_in_dim"(%26) <{broadcast_dimensions = array<i64: 0, 1, 2>}> : (tensor<1x2x3xf32>) -> tensor<1x2x3x3xf32>
    %28 = "stablehlo.divide"(%21, %27) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %29 = "stablehlo.dot_general"(%28, %5) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
    %30 = "stablehlo.reshape"(%29) : (tensor<1x2x3x4xf32>) -> tensor<6x4xf32>
    "func.return"(%30) : (tensor<6x4xf32>) -> ()
  }
}

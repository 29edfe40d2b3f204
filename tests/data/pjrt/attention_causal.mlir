module @kiln_scaled_dot_product_attention {
  func.func public @main(%arg0: tensor<24xf32>, %arg1: tensor<24xf32>, %arg2: tensor<24xf32>) -> (tensor<24xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<24xf32>) -> tensor<2x3x4xf32>
    %2 = "stablehlo.reshape"(%1) : (tensor<2x3x4xf32>) -> tensor<1x2x3x4xf32>
    %4 = "stablehlo.reshape"(%arg1) : (tensor<24xf32>) -> tensor<2x3x4xf32>
    %5 = "stablehlo.reshape"(%4) : (tensor<2x3x4xf32>) -> tensor<1x2x3x4xf32>
    %7 = "stablehlo.reshape"(%arg2) : (tensor<24xf32>) -> tensor<2x3x4xf32>
    %8 = "stablehlo.reshape"(%7) : (tensor<2x3x4xf32>) -> tensor<1x2x3x4xf32>
    %9 = "stablehlo.dot_general"(%2, %5) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x3xf32>
    %10 = "stablehlo.constant"() <{value = dense<5.000000000e-01> : tensor<1x2x3x3xf32>}> : () -> tensor<1x2x3x3xf32>
    %11 = "stablehlo.multiply"(%9, %10) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %12 = "stablehlo.iota"() <{iota_dimension = 2 : i64}> : () -> tensor<1x2x3x3xi64>
    %13 = "stablehlo.iota"() <{iota_dimension = 3 : i64}> : () -> tensor<1x2x3x3xi64>
    %14 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<1x2x3x3xf32>}> : () -> tensor<1x2x3x3xf32>
    %15 = "stablehlo.compare"(%13, %12) <{comparison_direction = #stablehlo<comparison_direction LE>, compare_type = #stablehlo<comparison_type SIGNED>}> : (tensor<1x2x3x3xi64>, tensor<1x2x3x3xi64>) -> tensor<1x2x3x3xi1>
    %16 = "stablehlo.select"(%15, %11, %14) : (tensor<1x2x3x3xi1>, tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %17 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %21 = "stablehlo.reduce"(%16, %17) <{dimensions = array<i64: 3>}> ({
    ^bb0(%18: tensor<f32>, %19: tensor<f32>):
      %20 = "stablehlo.maximum"(%18, %19) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%20) : (tensor<f32>) -> ()
    }) : (tensor<1x2x3x3xf32>, tensor<f32>) -> tensor<1x2x3xf32>
    %22 = "stablehlo.broadcast_in_dim"(%21) <{broadcast_dimensions = array<i64: 0, 1, 2>}> : (tensor<1x2x3xf32>) -> tensor<1x2x3x3xf32>
    %23 = "stablehlo.subtract"(%16, %22) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %24 = "stablehlo.exponential"(%23) : (tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %25 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %29 = "stablehlo.reduce"(%24, %25) <{dimensions = array<i64: 3>}> ({
    ^bb0(%26: tensor<f32>, %27: tensor<f32>):
      %28 = "stablehlo.add"(%26, %27) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%28) : (tensor<f32>) -> ()
    }) : (tensor<1x2x3x3xf32>, tensor<f32>) -> tensor<1x2x3xf32>
    %30 = "stablehlo.broadcast_in_dim"(%29) <{broadcast_dimensions = array<i64: 0, 1, 2>}> : (tensor<1x2x3xf32>) -> tensor<1x2x3x3xf32>
    %31 = "stablehlo.divide"(%24, %30) : (tensor<1x2x3x3xf32>, tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
    %32 = "stablehlo.dot_general"(%31, %8) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
    %33 = "stablehlo.reshape"(%32) : (tensor<1x2x3x4xf32>) -> tensor<2x3x4xf32>
    %34 = "stablehlo.reshape"(%33) : (tensor<2x3x4xf32>) -> tensor<24xf32>
    "func.return"(%34) : (tensor<24xf32>) -> ()
  }
}

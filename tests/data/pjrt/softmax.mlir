module @kiln_softmax {
  func.func public @main(%arg0: tensor<2x8xf32>) -> (tensor<2x8xf32>) {
    %1 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %5 = "stablehlo.reduce"(%arg0, %1) <{dimensions = array<i64: 1>}> ({
    ^bb0(%2: tensor<f32>, %3: tensor<f32>):
      %4 = "stablehlo.maximum"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%4) : (tensor<f32>) -> ()
    }) : (tensor<2x8xf32>, tensor<f32>) -> tensor<2xf32>
    %6 = "stablehlo.broadcast_in_dim"(%5) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x8xf32>
    %7 = "stablehlo.subtract"(%arg0, %6) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %8 = "stablehlo.exponential"(%7) : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %9 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %13 = "stablehlo.reduce"(%8, %9) <{dimensions = array<i64: 1>}> ({
    ^bb0(%10: tensor<f32>, %11: tensor<f32>):
      %12 = "stablehlo.add"(%10, %11) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%12) : (tensor<f32>) -> ()
    }) : (tensor<2x8xf32>, tensor<f32>) -> tensor<2xf32>
    %14 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %15 = "stablehlo.divide"(%14, %13) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %16 = "stablehlo.broadcast_in_dim"(%15) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x8xf32>
    %17 = "stablehlo.multiply"(%8, %16) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    "func.return"(%17) : (tensor<2x8xf32>) -> ()
  }
}

module @kiln_softmax {
  func.func public @main(%arg0: tensor<10xf32>) -> (tensor<10xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<10xf32>) -> tensor<2x5xf32>
    %2 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %6 = "stablehlo.reduce"(%1, %2) <{dimensions = array<i64: 1>}> ({
    ^bb0(%3: tensor<f32>, %4: tensor<f32>):
      %5 = "stablehlo.maximum"(%3, %4) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%5) : (tensor<f32>) -> ()
    }) : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
    %7 = "stablehlo.broadcast_in_dim"(%6) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x5xf32>
    %8 = "stablehlo.subtract"(%1, %7) : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
    %9 = "stablehlo.exponential"(%8) : (tensor<2x5xf32>) -> tensor<2x5xf32>
    %10 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %14 = "stablehlo.reduce"(%9, %10) <{dimensions = array<i64: 1>}> ({
    ^bb0(%11: tensor<f32>, %12: tensor<f32>):
      %13 = "stablehlo.add"(%11, %12) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%13) : (tensor<f32>) -> ()
    }) : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
    %15 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %16 = "stablehlo.divide"(%15, %14) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %17 = "stablehlo.broadcast_in_dim"(%16) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x5xf32>
    %18 = "stablehlo.multiply"(%9, %17) : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
    %19 = "stablehlo.reshape"(%18) : (tensor<2x5xf32>) -> tensor<10xf32>
    "func.return"(%19) : (tensor<10xf32>) -> ()
  }
}

module @kiln_region {
  func.func public @main(%arg0: tensor<2x8xf32>, %arg1: tensor<f32>, %arg2: tensor<f32>, %arg3: tensor<4x8xf32>, %arg4: tensor<4xf32>, %arg5: tensor<4xf32>, %arg6: tensor<4xf32>) -> (tensor<2x4xf32>) {
    %2 = "stablehlo.broadcast_in_dim"(%arg1) <{broadcast_dimensions = array<i64>}> : (tensor<f32>) -> tensor<2x8xf32>
    %3 = "stablehlo.multiply"(%arg0, %2) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %5 = "stablehlo.broadcast_in_dim"(%arg2) <{broadcast_dimensions = array<i64>}> : (tensor<f32>) -> tensor<2x8xf32>
    %6 = "stablehlo.add"(%3, %5) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %7 = "stablehlo.multiply"(%6, %6) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %8 = "stablehlo.multiply"(%7, %6) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %9 = "stablehlo.constant"() <{value = dense<4.471499845e-02> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %10 = "stablehlo.multiply"(%9, %8) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %11 = "stablehlo.add"(%6, %10) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %12 = "stablehlo.constant"() <{value = dense<7.978845835e-01> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %13 = "stablehlo.multiply"(%12, %11) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %14 = "stablehlo.constant"() <{value = dense<5.000000000e-01> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %15 = "stablehlo.multiply"(%14, %6) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %16 = "stablehlo.tanh"(%13) : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %17 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %18 = "stablehlo.add"(%17, %16) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %19 = "stablehlo.multiply"(%15, %18) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %20 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %21 = "stablehlo.compare"(%6, %20) <{comparison_direction = #stablehlo<comparison_direction EQ>, compare_type = #stablehlo<comparison_type FLOAT>}> : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
    %22 = "stablehlo.constant"() <{value = dense<-0.000000000e+00> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %23 = "stablehlo.select"(%21, %22, %19) : (tensor<2x8xi1>, tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %26 = "stablehlo.dot_general"(%23, %arg3) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    %27 = "stablehlo.broadcast_in_dim"(%arg4) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %28 = "stablehlo.add"(%26, %27) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %29 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %33 = "stablehlo.reduce"(%28, %29) <{dimensions = array<i64: 1>}> ({
    ^bb0(%30: tensor<f32>, %31: tensor<f32>):
      %32 = "stablehlo.maximum"(%30, %31) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%32) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %34 = "stablehlo.broadcast_in_dim"(%33) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %35 = "stablehlo.subtract"(%28, %34) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %36 = "stablehlo.exponential"(%35) : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %37 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %41 = "stablehlo.reduce"(%36, %37) <{dimensions = array<i64: 1>}> ({
    ^bb0(%38: tensor<f32>, %39: tensor<f32>):
      %40 = "stablehlo.add"(%38, %39) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%40) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %42 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %43 = "stablehlo.divide"(%42, %41) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %44 = "stablehlo.broadcast_in_dim"(%43) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %45 = "stablehlo.multiply"(%36, %44) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %46 = "stablehlo.add"(%45, %28) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %49 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %53 = "stablehlo.reduce"(%46, %49) <{dimensions = array<i64: 1>}> ({
    ^bb0(%50: tensor<f32>, %51: tensor<f32>):
      %52 = "stablehlo.add"(%50, %51) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%52) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %54 = "stablehlo.constant"() <{value = dense<4.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %55 = "stablehlo.divide"(%53, %54) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %56 = "stablehlo.broadcast_in_dim"(%55) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %57 = "stablehlo.subtract"(%46, %56) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %58 = "stablehlo.multiply"(%57, %57) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %59 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %63 = "stablehlo.reduce"(%58, %59) <{dimensions = array<i64: 1>}> ({
    ^bb0(%60: tensor<f32>, %61: tensor<f32>):
      %62 = "stablehlo.add"(%60, %61) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%62) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %64 = "stablehlo.constant"() <{value = dense<4.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %65 = "stablehlo.divide"(%63, %64) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %66 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %67 = "stablehlo.constant"() <{value = dense<9.999999747e-06> : tensor<2xf32>}> : () -> tensor<2xf32>
    %68 = "stablehlo.add"(%65, %67) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %69 = "stablehlo.sqrt"(%68) : (tensor<2xf32>) -> tensor<2xf32>
    %70 = "stablehlo.divide"(%66, %69) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %71 = "stablehlo.broadcast_in_dim"(%70) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %72 = "stablehlo.broadcast_in_dim"(%55) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %73 = "stablehlo.subtract"(%46, %72) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %74 = "stablehlo.multiply"(%73, %71) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %75 = "stablehlo.broadcast_in_dim"(%arg5) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %76 = "stablehlo.multiply"(%74, %75) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %77 = "stablehlo.broadcast_in_dim"(%arg6) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %78 = "stablehlo.add"(%76, %77) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    "func.return"(%78) : (tensor<2x4xf32>) -> ()
  }
}

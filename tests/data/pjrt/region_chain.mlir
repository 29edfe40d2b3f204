module @kiln_region {
  func.func public @main(%arg0: tensor<16xf32>, %arg1: tensor<f32>, %arg2: tensor<f32>, %arg3: tensor<32xf32>, %arg4: tensor<4xf32>, %arg5: tensor<4xf32>, %arg6: tensor<4xf32>) -> (tensor<8xf32>) {
    %1 = "stablehlo.reshape"(%arg0) : (tensor<16xf32>) -> tensor<2x8xf32>
    %3 = "stablehlo.broadcast_in_dim"(%arg1) <{broadcast_dimensions = array<i64>}> : (tensor<f32>) -> tensor<2x8xf32>
    %4 = "stablehlo.multiply"(%1, %3) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %6 = "stablehlo.broadcast_in_dim"(%arg2) <{broadcast_dimensions = array<i64>}> : (tensor<f32>) -> tensor<2x8xf32>
    %7 = "stablehlo.add"(%4, %6) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %8 = "stablehlo.multiply"(%7, %7) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %9 = "stablehlo.multiply"(%8, %7) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %10 = "stablehlo.constant"() <{value = dense<4.471499845e-02> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %11 = "stablehlo.multiply"(%10, %9) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %12 = "stablehlo.add"(%7, %11) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %13 = "stablehlo.constant"() <{value = dense<7.978845835e-01> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %14 = "stablehlo.multiply"(%13, %12) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %15 = "stablehlo.constant"() <{value = dense<5.000000000e-01> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %16 = "stablehlo.multiply"(%15, %7) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %17 = "stablehlo.tanh"(%14) : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %18 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %19 = "stablehlo.add"(%18, %17) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %20 = "stablehlo.multiply"(%16, %19) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %21 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %22 = "stablehlo.compare"(%7, %21) <{comparison_direction = #stablehlo<comparison_direction EQ>, compare_type = #stablehlo<comparison_type FLOAT>}> : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
    %23 = "stablehlo.constant"() <{value = dense<-0.000000000e+00> : tensor<2x8xf32>}> : () -> tensor<2x8xf32>
    %24 = "stablehlo.select"(%22, %23, %20) : (tensor<2x8xi1>, tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %26 = "stablehlo.reshape"(%arg3) : (tensor<32xf32>) -> tensor<4x8xf32>
    %28 = "stablehlo.dot_general"(%24, %26) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]}> : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    %29 = "stablehlo.broadcast_in_dim"(%arg4) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %30 = "stablehlo.add"(%28, %29) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %31 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %35 = "stablehlo.reduce"(%30, %31) <{dimensions = array<i64: 1>}> ({
    ^bb0(%32: tensor<f32>, %33: tensor<f32>):
      %34 = "stablehlo.maximum"(%32, %33) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%34) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %36 = "stablehlo.broadcast_in_dim"(%35) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %37 = "stablehlo.subtract"(%30, %36) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %38 = "stablehlo.exponential"(%37) : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %39 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %43 = "stablehlo.reduce"(%38, %39) <{dimensions = array<i64: 1>}> ({
    ^bb0(%40: tensor<f32>, %41: tensor<f32>):
      %42 = "stablehlo.add"(%40, %41) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%42) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %44 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %45 = "stablehlo.divide"(%44, %43) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %46 = "stablehlo.broadcast_in_dim"(%45) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %47 = "stablehlo.multiply"(%38, %46) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %48 = "stablehlo.add"(%47, %30) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %51 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %55 = "stablehlo.reduce"(%48, %51) <{dimensions = array<i64: 1>}> ({
    ^bb0(%52: tensor<f32>, %53: tensor<f32>):
      %54 = "stablehlo.add"(%52, %53) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%54) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %56 = "stablehlo.constant"() <{value = dense<4.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %57 = "stablehlo.divide"(%55, %56) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %58 = "stablehlo.broadcast_in_dim"(%57) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %59 = "stablehlo.subtract"(%48, %58) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %60 = "stablehlo.multiply"(%59, %59) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %61 = "stablehlo.constant"() <{value = dense<0.000000000e+00> : tensor<f32>}> : () -> tensor<f32>
    %65 = "stablehlo.reduce"(%60, %61) <{dimensions = array<i64: 1>}> ({
    ^bb0(%62: tensor<f32>, %63: tensor<f32>):
      %64 = "stablehlo.add"(%62, %63) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%64) : (tensor<f32>) -> ()
    }) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %66 = "stablehlo.constant"() <{value = dense<4.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %67 = "stablehlo.divide"(%65, %66) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %68 = "stablehlo.constant"() <{value = dense<1.000000000e+00> : tensor<2xf32>}> : () -> tensor<2xf32>
    %69 = "stablehlo.constant"() <{value = dense<9.999999747e-06> : tensor<2xf32>}> : () -> tensor<2xf32>
    %70 = "stablehlo.add"(%67, %69) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %71 = "stablehlo.sqrt"(%70) : (tensor<2xf32>) -> tensor<2xf32>
    %72 = "stablehlo.divide"(%68, %71) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %73 = "stablehlo.broadcast_in_dim"(%72) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %74 = "stablehlo.broadcast_in_dim"(%57) <{broadcast_dimensions = array<i64: 0>}> : (tensor<2xf32>) -> tensor<2x4xf32>
    %75 = "stablehlo.subtract"(%48, %74) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %76 = "stablehlo.multiply"(%75, %73) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %77 = "stablehlo.broadcast_in_dim"(%arg5) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %78 = "stablehlo.multiply"(%76, %77) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %79 = "stablehlo.broadcast_in_dim"(%arg6) <{broadcast_dimensions = array<i64: 1>}> : (tensor<4xf32>) -> tensor<2x4xf32>
    %80 = "stablehlo.add"(%78, %79) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %81 = "stablehlo.reshape"(%80) : (tensor<2x4xf32>) -> tensor<8xf32>
    "func.return"(%81) : (tensor<8xf32>) -> ()
  }
}

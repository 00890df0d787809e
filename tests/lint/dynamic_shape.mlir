// One hazard: a dynamic dimension (line 4).
module @dynamic_shape {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.dynamic_reshape %arg0, %arg0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

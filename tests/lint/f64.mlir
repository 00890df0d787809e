// One hazard: f64 arithmetic; the three ops with an f64 type (lines 4 to 6) are flagged.
module @f64 {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf64>
    %1 = stablehlo.multiply %0, %0 : tensor<4xf64>
    %2 = stablehlo.convert %1 : (tensor<4xf64>) -> tensor<4xf32>
    return %2 : tensor<4xf32>
  }
}

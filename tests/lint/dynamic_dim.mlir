// One hazard: an argument with a '?' dimension, used on line 4.
module @dynamic_dim {
  func.func public @main(%arg0: tensor<?x4xf32>) -> tensor<?x4xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<?x4xf32>
    return %0 : tensor<?x4xf32>
  }
}

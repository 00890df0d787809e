// One hazard: a Python host callback (line 4).
module @host_callback {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

# kernel_tables.cmake — the kernel contract's generated tables for a build
# outside CMake's own (tests/fuzz/run.sh compiles the parsers with clang):
#   cmake -DPROJECT_SOURCE_DIR=ROOT -DOUT=DIR -P cmake/kernel_tables.cmake
# writes DIR/kernels/contract_json.h, contract_ops.h and
# DIR/config/kernel_keys.h exactly as the build does (KernelContract.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/KernelContract.cmake)
strata_kernel_contract_tables(${PROJECT_SOURCE_DIR}/python/strata_jax/kernel_contract.json ${OUT})

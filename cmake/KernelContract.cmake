# KernelContract.cmake — what C derives from the kernel contract
# (python/strata_jax/kernel_contract.json, docs/kernels.md), generated at
# configure time so no C file lists the ops by hand:
#
#   OUT/kernels/contract_json.h  the contract's bytes (src/kernels/contract.c
#                                parses them: `strata kernels list`, checks)
#   OUT/kernels/contract_ops.h   ST__KERNEL_OPS(X): X(op) per op, in the
#                                contract's order; ST__KERNEL_FFI_HANDLERS(X):
#                                X(op, version, dir, target) per FFI handler
#                                (the handler table, src/kernels/handlers.c):
#                                dir fwd, bwd, then any other key of the
#                                row's ffi_targets (an optional operand's
#                                form: attention's seg_fwd, seg_bwd)
#   OUT/config/kernel_keys.h     ST__KERNEL_KEYS(X): X("op", "auto|impls...",
#                                "doc") per op (the kernels.<op> rows of the
#                                config schema, src/config/schema.c)
#
# strata_kernel_contract_tables(CONTRACT_JSON OUT) reads CONTRACT_JSON; the
# main build passes the shipped contract, the kernel-op fixture test
# (tests/fixtures/kernel_op) a copy with its extra row.

# C string literal of |text|: backslashes and quotes escaped.
function(strata__c_string out text)
  string(REPLACE "\\" "\\\\" text "${text}")
  string(REPLACE "\"" "\\\"" text "${text}")
  set(${out} "\"${text}\"" PARENT_SCOPE)
endfunction()

# Writes |path| only when its text changes, so an unchanged contract does
# not rebuild what includes it.
function(strata__write_if_changed path text)
  file(WRITE ${path}.tmp "${text}")
  configure_file(${path}.tmp ${path} COPYONLY)
endfunction()

function(strata_kernel_contract_tables contract out)
  file(READ ${contract} json)
  set(where "${contract}")
  string(JSON n ERROR_VARIABLE err LENGTH "${json}" ops)
  if(err)
    message(FATAL_ERROR "${where}: no ops list (${err})")
  endif()
  set(ops "")
  set(ffi "")
  set(keys "")
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(i RANGE ${last})
      string(JSON name GET "${json}" ops ${i} name)
      string(JSON version GET "${json}" ops ${i} version)
      string(JSON has_bwd GET "${json}" ops ${i} has_backward)
      string(JSON doc ERROR_VARIABLE err GET "${json}" ops ${i} config_doc)
      if(err)
        message(FATAL_ERROR "${where}: op '${name}' has no config_doc (the doc of its config key kernels.${name})")
      endif()
      if(NOT name MATCHES "^[a-z][a-z0-9_]*$")
        message(FATAL_ERROR "${where}: op name '${name}' is not [a-z][a-z0-9_]* (it names C symbols and config keys)")
      endif()
      string(JSON nimpl LENGTH "${json}" ops ${i} implementations)
      math(EXPR lastimpl "${nimpl} - 1")
      set(choices "auto")
      set(has_ffi OFF)
      foreach(k RANGE ${lastimpl})
        string(JSON impl GET "${json}" ops ${i} implementations ${k})
        string(APPEND choices "|${impl}")
        if(impl STREQUAL "ffi")
          set(has_ffi ON)
        endif()
      endforeach()
      string(APPEND ops " \\\n  X(${name})")
      strata__c_string(cdoc "${doc}")
      string(APPEND keys " \\\n  X(\"${name}\", \"${choices}\", ${cdoc})")
      if(has_ffi)
        set(dirs fwd)
        if(has_bwd)
          list(APPEND dirs bwd)
        endif()
        # Then the targets of an optional operand's form (attention's
        # seg_fwd, seg_bwd): every other key of ffi_targets, in the
        # object's order as CMake lists it.
        string(JSON ntargets LENGTH "${json}" ops ${i} ffi_targets)
        math(EXPR lasttarget "${ntargets} - 1")
        foreach(k RANGE ${lasttarget})
          string(JSON key MEMBER "${json}" ops ${i} ffi_targets ${k})
          if(NOT key STREQUAL "fwd" AND NOT key STREQUAL "bwd")
            if(NOT key MATCHES "^[a-z][a-z0-9_]*$")
              message(FATAL_ERROR "${where}: op '${name}': ffi_targets key '${key}' is not [a-z][a-z0-9_]* (it names the handler's direction)")
            endif()
            list(APPEND dirs ${key})
          endif()
        endforeach()
        foreach(dir ${dirs})
          string(JSON target GET "${json}" ops ${i} ffi_targets ${dir})
          if(NOT target MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
            message(FATAL_ERROR "${where}: op '${name}': ffi target '${target}' is not a C identifier (it names the handler st__ffi_<target>)")
          endif()
          string(APPEND ffi " \\\n  X(${name}, ${version}, ${dir}, ${target})")
        endforeach()
      endif()
    endforeach()
  endif()
  file(RELATIVE_PATH shown ${PROJECT_SOURCE_DIR} ${contract})
  set(banner "/* generated from ${shown} by cmake/KernelContract.cmake: do not edit */\n")

  file(READ ${contract} hex HEX)
  string(LENGTH "${hex}" hexlen)
  math(EXPR size "${hexlen} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  strata__write_if_changed(${out}/kernels/contract_json.h
    "${banner}static const unsigned char kContractJson[] = {${bytes} 0};\nstatic const size_t kContractJsonSize = ${size};\n")
  strata__write_if_changed(${out}/kernels/contract_ops.h
    "${banner}#define ST__KERNEL_OPS(X)${ops}\n\n#define ST__KERNEL_FFI_HANDLERS(X)${ffi}\n")
  strata__write_if_changed(${out}/config/kernel_keys.h "${banner}#define ST__KERNEL_KEYS(X)${keys}\n")
endfunction()

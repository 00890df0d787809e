/* dtype.c — strata's element types in PJRT's numbering (the types
 * themselves are base-level: strata/tensor.h, src/base/tensor.c). */
#include "runtime/rt_internal.h"

static const struct {
  st_dtype dtype;
  int pj;
} kPj[] = {
    {ST_DTYPE_PRED, PJ_T_PRED}, {ST_DTYPE_S8, PJ_T_S8},   {ST_DTYPE_S16, PJ_T_S16},   {ST_DTYPE_S32, PJ_T_S32},
    {ST_DTYPE_S64, PJ_T_S64},   {ST_DTYPE_U8, PJ_T_U8},   {ST_DTYPE_U16, PJ_T_U16},   {ST_DTYPE_U32, PJ_T_U32},
    {ST_DTYPE_U64, PJ_T_U64},   {ST_DTYPE_F16, PJ_T_F16}, {ST_DTYPE_BF16, PJ_T_BF16}, {ST_DTYPE_F32, PJ_T_F32},
    {ST_DTYPE_F64, PJ_T_F64},
};
#define ST__NPJ (sizeof(kPj) / sizeof(kPj[0]))

int st__dtype_to_pj(st_dtype dtype) {
  for (size_t i = 0; i < ST__NPJ; ++i)
    if (kPj[i].dtype == dtype) return kPj[i].pj;
  return PJ_T_INVALID;
}

st_dtype st__dtype_from_pj(int pj_type) {
  for (size_t i = 0; i < ST__NPJ; ++i)
    if (kPj[i].pj == pj_type) return kPj[i].dtype;
  return ST_DTYPE_INVALID;
}

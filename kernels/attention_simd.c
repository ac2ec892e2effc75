/* attention_simd.c - the fused attention loops' table for the CPU path that
 * dispatch.c chose (the scalar path has none: attention.c's portable loops). */
#include "kernels/attention_simd.h"
#include "kernels/kernels.h"

const ckv_attnops *ckv_attnops_get(void) {
  switch (ckv_kernels_path()) {
  case CKV_PATH_AVX512: return &ckv_attnops_avx512;
  case CKV_PATH_AVX2: return &ckv_attnops_avx2;
  default: return NULL;
  }
}

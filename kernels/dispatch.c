/* dispatch.c - chooses the CPU path (scalar, AVX2, AVX-512) from the CPU's
 * features once, lets tests and benchmarks force one, and hands the matching
 * row-primitive and integer-dot tables to the kernels (the integer dots use
 * AVX-512 VNNI on the AVX-512 path, AVX-VNNI on the AVX2 path, where the
 * CPU has them, else AVX2's). */
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/attention_bf16.h"
#include "kernels/attention_i8v.h"
#include "kernels/idot.h"
#include "kernels/kernels.h"
#include "kernels/rowops.h"

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
 * __builtin_cpu_supports, and the fuzz build (tests/fuzz) uses clang. */
static bool cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* AVX-512 VNNI from CPUID leaf 7 (ECX bit 11), for the same reason. */
static bool cpu_has_avx512vnni(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11));
}
#endif

bool ckv_idot_vnni_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
  return ckv_kernels_path_supported(CKV_PATH_AVX512) && cpu_has_avx512vnni();
#else
  return false;
#endif
}

#if defined(__x86_64__) || defined(__i386__)
/* AVX512_BF16 from CPUID leaf 7 subleaf 1 (EAX bit 5). */
static bool cpu_has_avx512bf16(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

/* AVX-VNNI from CPUID leaf 7 subleaf 1 (EAX bit 4). */
static bool cpu_has_avxvnni(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
#endif

bool ckv_idot_avxvnni_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
  return ckv_kernels_path_supported(CKV_PATH_AVX2) && cpu_has_avxvnni();
#else
  return false;
#endif
}

bool ckv_avalues_i8_supported(void) {
  static int vnni = -1; /* checked once (CPUID is slow under a hypervisor); a benign race */
  if (__atomic_load_n(&vnni, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&vnni, ckv_idot_vnni_supported() ? 1 : 0, __ATOMIC_RELAXED);
  return __atomic_load_n(&vnni, __ATOMIC_RELAXED) != 0;
}

bool ckv_avalues_bf16_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
  static int bf16 = -1; /* checked once (CPUID is slow under a hypervisor); a benign race */
  if (__atomic_load_n(&bf16, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&bf16, ckv_kernels_path_supported(CKV_PATH_AVX512) && cpu_has_avx512bf16() ? 1 : 0, __ATOMIC_RELAXED);
  return __atomic_load_n(&bf16, __ATOMIC_RELAXED) != 0;
#else
  return false;
#endif
}

static int g_path; /* ckv_cpu_path; 0 = not chosen yet.  Accessed with __atomic builtins. */

bool ckv_kernels_path_supported(ckv_cpu_path path) {
  switch (path) {
  case CKV_PATH_AUTO:
  case CKV_PATH_SCALAR: return true;
#if defined(__x86_64__) || defined(__i386__)
  case CKV_PATH_AVX2:
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  case CKV_PATH_AVX512:
    return ckv_kernels_path_supported(CKV_PATH_AVX2) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  default: return false;
  }
}

static ckv_cpu_path detect(void) {
  const char *env = getenv("CKV_KERNELS_PATH");
  if (env) {
    ckv_cpu_path want = !strcmp(env, "scalar") ? CKV_PATH_SCALAR
                        : !strcmp(env, "avx2") ? CKV_PATH_AVX2
                        : !strcmp(env, "avx512") ? CKV_PATH_AVX512
                                                 : CKV_PATH_AUTO;
    if (want != CKV_PATH_AUTO && ckv_kernels_path_supported(want)) return want;
  }
  if (ckv_kernels_path_supported(CKV_PATH_AVX512)) return CKV_PATH_AVX512;
  if (ckv_kernels_path_supported(CKV_PATH_AVX2)) return CKV_PATH_AVX2;
  return CKV_PATH_SCALAR;
}

ckv_status ckv_kernels_force(ckv_cpu_path path) {
  if (path < CKV_PATH_AUTO || path > CKV_PATH_AVX512) return CKV_ERR_INVALID;
  if (!ckv_kernels_path_supported(path)) return CKV_ERR_UNSUPPORTED;
  __atomic_store_n(&g_path, (int)(path == CKV_PATH_AUTO ? detect() : path), __ATOMIC_RELEASE);
  return CKV_OK;
}

ckv_cpu_path ckv_kernels_path(void) {
  int p = __atomic_load_n(&g_path, __ATOMIC_ACQUIRE);
  if (p == 0) {
    p = (int)detect();
    __atomic_store_n(&g_path, p, __ATOMIC_RELEASE);
  }
  return (ckv_cpu_path)p;
}

const char *ckv_kernels_path_name(ckv_cpu_path path) {
  switch (path) {
  case CKV_PATH_AUTO: return "auto";
  case CKV_PATH_SCALAR: return "scalar";
  case CKV_PATH_AVX2: return "avx2";
  case CKV_PATH_AVX512: return "avx512";
  default: return "unknown";
  }
}

const ckv_rowops *ckv_rowops_get(void) {
  switch (ckv_kernels_path()) {
  case CKV_PATH_AVX512: return &ckv_rowops_avx512;
  case CKV_PATH_AVX2: return &ckv_rowops_avx2;
  default: return &ckv_rowops_scalar;
  }
}

const ckv_idotops *ckv_idotops_get(void) {
  static int vnni = -1, avxvnni = -1; /* checked once; a benign race (every thread computes the same value) */
  switch (ckv_kernels_path()) {
  case CKV_PATH_AVX512:
    if (__atomic_load_n(&vnni, __ATOMIC_RELAXED) < 0) __atomic_store_n(&vnni, ckv_idot_vnni_supported() ? 1 : 0, __ATOMIC_RELAXED);
    return __atomic_load_n(&vnni, __ATOMIC_RELAXED) ? &ckv_idot_avx512vnni : &ckv_idot_avx2;
  case CKV_PATH_AVX2:
    if (__atomic_load_n(&avxvnni, __ATOMIC_RELAXED) < 0)
      __atomic_store_n(&avxvnni, ckv_idot_avxvnni_supported() ? 1 : 0, __ATOMIC_RELAXED);
    return __atomic_load_n(&avxvnni, __ATOMIC_RELAXED) ? &ckv_idot_avxvnni : &ckv_idot_avx2;
  default: return &ckv_idot_scalar;
  }
}

const char *ckv_kernels_idot_name(void) { return ckv_idotops_get()->name; }

bool ckv_kernels_values_bf16_supported(void) {
  return ckv_kernels_path() == CKV_PATH_AVX512 && ckv_avalues_bf16_supported();
}

/* tests/fuzz/libfuzzer_main.c - libFuzzer's two hooks around one target,
 * chosen at compile time (-DCKV_FUZZ_NAME=requests gives ckv_fuzz_requests). */
#include "fuzz.h"

#define CKV_CAT3(a, b, c) a##b##c
#define CKV_ENTRY(name) CKV_CAT3(ckv_fuzz_, name, )
#define CKV_INIT(name) CKV_CAT3(ckv_fuzz_, name, _init)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return CKV_INIT(CKV_FUZZ_NAME)();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return CKV_ENTRY(CKV_FUZZ_NAME)(data, size); }

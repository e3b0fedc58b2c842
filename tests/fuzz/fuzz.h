/* cohort fuzz targets: each tests/fuzz/fuzz_<name>.c includes this and
 * defines LLVMFuzzerTestOneInput (libFuzzer's entry point). It must return 0
 * and never crash, leak or hang, whatever the bytes. */
#ifndef COHORT_FUZZ_H
#define COHORT_FUZZ_H
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#endif

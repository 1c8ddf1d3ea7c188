/* Linked into ThreadSanitizer builds of the C tests (scripts/tsan.sh). The Rust library, instrumented by
 * nightly rustc's LLVM, calls __tsan_memcpy/__tsan_memmove/__tsan_memset for its block copies; gcc 12's
 * libtsan predates those entry points but intercepts memcpy/memmove/memset themselves, which check the same
 * ranges. These forward to them. */
#include <string.h>

void *__tsan_memcpy(void *d, const void *s, size_t n);
void *__tsan_memmove(void *d, const void *s, size_t n);
void *__tsan_memset(void *d, int c, size_t n);

void *__tsan_memcpy(void *d, const void *s, size_t n) { return memcpy(d, s, n); }
void *__tsan_memmove(void *d, const void *s, size_t n) { return memmove(d, s, n); }
void *__tsan_memset(void *d, int c, size_t n) { return memset(d, c, n); }

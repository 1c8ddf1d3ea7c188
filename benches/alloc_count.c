/* A malloc-counting shim for the benchmarks: LD_PRELOAD it and every heap allocation of the process (the
 * bench, libsqdisc, the software HCA, the Rust runtime) goes through the counters below before reaching glibc.
 * sqd_bench finds bench_alloc_counts() with dlsym and reads the counters around its steady-state loop.
 *
 * Counted as one allocation: malloc, calloc, realloc (a new block or a resize), posix_memalign, aligned_alloc,
 * memalign, valloc, pvalloc. Bytes are malloc_usable_size() of each block, so `live` is the heap the process
 * holds, allocator rounding included (the allocator's own headers excluded). */

#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

static unsigned long long n_allocs, n_frees;
static long long live_bytes;

static void *counted(void *p)
{
    if (p) {
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&live_bytes, (long long)malloc_usable_size(p), __ATOMIC_RELAXED);
    }
    return p;
}

static void uncount(void *p)
{
    if (p) {
        __atomic_add_fetch(&n_frees, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&live_bytes, (long long)malloc_usable_size(p), __ATOMIC_RELAXED);
    }
}

/* The counters so far: allocations, frees, and bytes held now. */
void bench_alloc_counts(unsigned long long *allocs, unsigned long long *frees, long long *live)
{
    *allocs = __atomic_load_n(&n_allocs, __ATOMIC_RELAXED);
    *frees = __atomic_load_n(&n_frees, __ATOMIC_RELAXED);
    *live = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
}

void *malloc(size_t n) { return counted(__libc_malloc(n)); }

void *calloc(size_t n, size_t size) { return counted(__libc_calloc(n, size)); }

void free(void *p)
{
    uncount(p);
    __libc_free(p);
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    size_t old = malloc_usable_size(p);
    void *q = __libc_realloc(p, n);
    if (q) {
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&live_bytes, (long long)malloc_usable_size(q) - (long long)old, __ATOMIC_RELAXED);
    }
    return q;
}

void *memalign(size_t align, size_t n) { return counted(__libc_memalign(align, n)); }

void *aligned_alloc(size_t align, size_t n) { return counted(__libc_memalign(align, n)); }

int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    void *p = counted(__libc_memalign(align, n));
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n) { return counted(__libc_memalign((size_t)sysconf(_SC_PAGESIZE), n)); }

void *pvalloc(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return counted(__libc_memalign(page, (n + page - 1) / page * page));
}

#ifndef SQDISC_H
#define SQDISC_H

/* Generated from the Rust sources by `make header`; do not edit by hand. */

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

/** The version of the headers: compare with sqd_version() for the library actually loaded. */
#define SQD_VERSION "0.1.0"
#define SQD_VERSION_MAJOR 0
#define SQD_VERSION_MINOR 1
#define SQD_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The message of the calling thread's most recent failed `sqd_*` call, as a NUL-terminated string.
 *
 * Never NULL: an empty string before any failure. The pointer stays valid until the next failing `sqd_*` call
 * on the same thread; copy it to keep it. Successful calls do not clear it.
 */
const char *sqd_last_error(void);

/**
 * The library version, "MAJOR.MINOR.PATCH", as a static NUL-terminated string.
 */
const char *sqd_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SQDISC_H */

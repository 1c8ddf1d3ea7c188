/* Checks that end the whole test at the first failure, for the C tests that run one straight scenario rather
 * than harness.h's scenario runner: each failure prints "FAIL <current>: <file>:<line>: <what> (last error:
 * ...)" to stderr and exits 1. `current` names the step running; a test sets it as it goes.
 *
 * Header-only and not a test itself; include it as "support/exit_checks.h" after <sqdisc.h>. */

#ifndef SQDISC_C_TESTS_EXIT_CHECKS_H
#define SQDISC_C_TESTS_EXIT_CHECKS_H

#include <stdio.h>
#include <stdlib.h>

static const char *current = "setup";

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "FAIL %s: %s:%d: %s (last error: %s)\n", current, __FILE__, __LINE__, #cond,  \
                    sqd_last_error());                                                                     \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                                                     \
    do {                                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                \
        if (a_ != b_) {                                                                                    \
            fprintf(stderr, "FAIL %s: %s:%d: %s == %lld, expected %s == %lld (last error: %s)\n", current, \
                    __FILE__, __LINE__, #a, a_, #b, b_, sqd_last_error());                                 \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#endif

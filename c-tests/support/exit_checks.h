/* Checks that end the whole test at the first failure, for the C tests that run one straight scenario rather
 * than harness.h's scenario runner: each failure prints "FAIL <current>: <file>:<line>: <what> (<context>:
 * ...)" to stderr and exits 1. `current` names the step running; a test sets it as it goes.
 *
 * What a failure reports beside the check is sqd_last_error() unless the includer defines EXIT_CHECK_CONTEXT
 * (a string expression) and EXIT_CHECK_CONTEXT_NAME (its label) first, as spdk_world.h does with the last
 * spdk_log line.
 *
 * Header-only and not a test itself; include it as "support/exit_checks.h" after <sqdisc.h>. */

#ifndef SQDISC_C_TESTS_EXIT_CHECKS_H
#define SQDISC_C_TESTS_EXIT_CHECKS_H

#include <stdio.h>
#include <stdlib.h>

#ifndef EXIT_CHECK_CONTEXT
#define EXIT_CHECK_CONTEXT sqd_last_error()
#define EXIT_CHECK_CONTEXT_NAME "last error"
#endif

static const char *current = "setup";

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "FAIL %s: %s:%d: %s (" EXIT_CHECK_CONTEXT_NAME ": %s)\n", current, __FILE__,  \
                    __LINE__, #cond, EXIT_CHECK_CONTEXT);                                                  \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                                                     \
    do {                                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                \
        if (a_ != b_) {                                                                                    \
            fprintf(stderr, "FAIL %s: %s:%d: %s == %lld, expected %s == %lld (" EXIT_CHECK_CONTEXT_NAME      \
                    ": %s)\n", current, __FILE__, __LINE__, #a, a_, #b, b_, EXIT_CHECK_CONTEXT);            \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#endif

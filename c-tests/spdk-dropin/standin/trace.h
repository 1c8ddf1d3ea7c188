/* The stand-in SPDK libraries report every call they serve to the program that loaded them
 * (c-tests/spdk-dropin/app.c defines dropin_trace and exports it). */
#ifndef SQDISC_SPDK_DROPIN_TRACE_H
#define SQDISC_SPDK_DROPIN_TRACE_H
void dropin_trace(const char *event);
#endif

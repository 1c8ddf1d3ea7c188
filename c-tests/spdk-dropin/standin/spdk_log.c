/* The behaviour a stand-in libspdk_log needs: spdk_log, with SPDK's signature, traced with its message (a
 * provider that logs in a run that should succeed shows it in the trace). The map's other symbols are stubs. */
#include "trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...);

void spdk_log(int level, const char *file, const int line, const char *func, const char *format, ...)
{
    char msg[256] = "spdk_log:";
    va_list ap;
    (void)level;
    (void)file;
    (void)line;
    (void)func;
    va_start(ap, format);
    vsnprintf(msg + strlen(msg), sizeof msg - strlen(msg), format, ap);
    va_end(ap);
    msg[strcspn(msg, "\n")] = '\0';
    for (char *c = msg; *c; c++)
        if (*c == ' ')
            *c = '_';
    dropin_trace(msg);
}

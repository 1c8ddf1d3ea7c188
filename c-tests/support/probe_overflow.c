/* Must be caught by AddressSanitizer: proves the sanitized C tests are really instrumented. */
#include <stdlib.h>
#include <sqdisc.h>

int main(void)
{
    volatile int index = 8;
    char *buf = malloc(8);
    if (!buf || !sqd_version())
        return 1;
    buf[index] = 'x'; /* one past the end */
    free(buf);
    return 0;
}

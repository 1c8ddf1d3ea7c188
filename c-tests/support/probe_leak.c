/* Must be reported by LeakSanitizer and by valgrind: proves leak checking is on with libsqdisc loaded.
 * Many blocks are dropped, so a stale copy of one pointer in a register or on the stack cannot hide them all. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sqdisc.h>

int main(void)
{
    uintptr_t mix = 0;
    for (int i = 0; i < 100; i++) {
        char *block = malloc(64 + i);
        if (!block)
            return 1;
        block[0] = (char)i;
        mix ^= (uintptr_t)block[0];
    }
    printf("%s %u\n", sqd_version(), (unsigned)mix);
    return 0;
}

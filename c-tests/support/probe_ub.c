/* Must be caught by UndefinedBehaviorSanitizer: proves the sanitized C tests halt on undefined behaviour. */
#include <limits.h>
#include <stdio.h>
#include <sqdisc.h>

int main(void)
{
    volatile int big = INT_MAX;
    int sum = big + 1; /* signed overflow */
    printf("%d %s\n", sum, sqd_version());
    return 0;
}

/* The installed headers and library work together: the version and last-error entry points. */
#include <stdio.h>
#include <string.h>

#include <sqdisc.h>
#include <sqdisc_scripted.h>

static int failures;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            printf("FAIL smoke: %s (%s:%d)\n", #cond, __FILE__, __LINE__);               \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

int main(void)
{
    const char *version = sqd_version();
    CHECK(version != NULL);
    if (version) {
        unsigned major, minor, patch;
        char end;
        CHECK(sscanf(version, "%u.%u.%u%c", &major, &minor, &patch, &end) == 3);
#ifdef SQD_VERSION
        /* The library loaded is the one these headers describe. */
        CHECK(strcmp(version, SQD_VERSION) == 0);
        CHECK(major == SQD_VERSION_MAJOR && minor == SQD_VERSION_MINOR && patch == SQD_VERSION_PATCH);
#endif
        CHECK(sqd_version() == version); /* a static string */
    }

    const char *err = sqd_last_error();
    CHECK(err != NULL);
    if (err)
        CHECK(err[0] == '\0'); /* nothing has failed on this thread yet */

    if (failures) {
        printf("FAIL smoke: %d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS smoke\n");
    return 0;
}

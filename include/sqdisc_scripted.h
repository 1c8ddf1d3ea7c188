#ifndef SQDISC_SCRIPTED_H
#define SQDISC_SCRIPTED_H

/* Generated from the Rust sources by `make header`; do not edit by hand. */

#include <sqdisc.h>

#endif  /* SQDISC_SCRIPTED_H */

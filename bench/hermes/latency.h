/* What the Hermes latency programs (alloc_latency.c, rocksdb_latency.c) share: a monotonic clock
 * in nanoseconds and the comparison that sorts latencies for their percentiles. */
#ifndef GLEANER_HERMES_LATENCY_H
#define GLEANER_HERMES_LATENCY_H

#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* qsort's comparison of two doubles, ascending. */
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif

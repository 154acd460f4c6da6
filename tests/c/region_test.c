/* Uses the C API the way a C program would: a region larger than its budget, every byte written
 * and read back through far memory (an embedded memnode, then, given GLEANER_TEST_POOL, a pool of
 * memnodes), a bad address reported through gleaner_last_error(). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gleaner.h"

/* A 64 MiB region at a 4 MiB budget on `memnode` (NULL: embedded): every word written and read
 * back; the stats must contain `want`. Returns 0 on success. */
static int round_trip(const char *memnode, const char *token, const char *want) {
    const size_t size = 64u << 20, budget = 4u << 20;
    gleaner_region *r = gleaner_region_create(size, budget, memnode, token);
    if (r == NULL) {
        fprintf(stderr, "create on %s failed: %s\n", memnode ? memnode : "embedded",
                gleaner_last_error());
        return 1;
    }
    uint64_t *words = gleaner_region_addr(r);
    size_t n = gleaner_region_size(r) / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++) words[i] = i * 2654435761u;
    for (size_t i = 0; i < n; i++) {
        if (words[i] != i * 2654435761u) {
            fprintf(stderr, "word %zu wrong on %s\n", i, memnode ? memnode : "embedded");
            return 1;
        }
    }
    char *stats = gleaner_region_stats_json(r);
    if (strstr(stats, "\"remote\"") == NULL || strstr(stats, want) == NULL) {
        fprintf(stderr, "stats lack fault counts or %s: %s\n", want, stats);
        return 1;
    }
    printf("%s\n", stats);
    gleaner_string_free(stats);
    gleaner_region_destroy(r);
    return 0;
}

int main(void) {
    /* A valid token file (from the test harness), so that only the address is wrong. */
    const char *token = getenv("GLEANER_TEST_TOKEN_FILE");
    if (token == NULL) {
        fprintf(stderr, "set GLEANER_TEST_TOKEN_FILE to a token file\n");
        return 1;
    }
    gleaner_region *bad = gleaner_region_create(1 << 20, 1 << 20, "127.0.0.1:1", token);
    if (bad != NULL || gleaner_last_error() == NULL ||
        strstr(gleaner_last_error(), "127.0.0.1:1") == NULL) {
        fprintf(stderr, "expected a clear error naming 127.0.0.1:1, got: %s\n",
                gleaner_last_error() ? gleaner_last_error() : "(none)");
        return 1;
    }
    if (round_trip(NULL, NULL, "\"remote\"")) return 1;
    const char *pool = getenv("GLEANER_TEST_POOL");
    if (pool != NULL && round_trip(pool, token, "\"pool\"")) return 1;
    printf("c api ok\n");
    return 0;
}

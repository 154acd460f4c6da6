/* Exercises include/gleaner_soft.h from C: a pool with a C reconstructor, soft pointers, a soft
 * hash map, the grant shrinking to nothing (everything becomes a miss, rebuilt correctly), the
 * debug mode, and errors. Prints "ok" and exits 0 on success; any failed check exits 1. With
 * GLEANER_NODE_SOCKET set, the pool registers with that daemon. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gleaner_soft.h"

#define CHECK(c)                                                                         \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #c,             \
                    gleaner_soft_last_error());                                          \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static int calls;

/* The value for args: 3000 bytes, byte i = args[i % len] + i, a function of args only. */
static ssize_t recon(void *ctx, const void *args, size_t len, void *out, size_t cap) {
    (void)ctx;
    __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
    if (len == 0) return -1;
    if (cap < 3000) return 3000;
    const unsigned char *a = args;
    unsigned char *o = out;
    for (size_t i = 0; i < 3000; i++) o[i] = (unsigned char)(a[i % len] + i);
    return 3000;
}

static void expect(const unsigned char *buf, const char *args) {
    size_t len = strlen(args);
    for (size_t i = 0; i < 3000; i++)
        CHECK(buf[i] == (unsigned char)(args[i % len] + i));
}

int main(void) {
    gleaner_soft_config cfg;
    gleaner_soft_config_init(&cfg);
    cfg.name = "c-test";
    cfg.capacity = 64 << 20;
    cfg.limit = 8 << 20;
    cfg.verify = 1;
    const char *sock = getenv("GLEANER_NODE_SOCKET");
    if (sock) cfg.node_socket = sock;

    CHECK(gleaner_soft_pool_create(&cfg, NULL, NULL) == NULL);
    CHECK(strstr(gleaner_soft_last_error(), "reconstructor") != NULL);

    gleaner_soft_pool *pool = gleaner_soft_pool_create(&cfg, recon, NULL);
    CHECK(pool != NULL);
    unsigned char buf[4096];

    /* A soft pointer: the first read reconstructs, the second hits. */
    gleaner_soft_ptr *p = gleaner_soft_alloc(pool);
    CHECK(p != NULL);
    CHECK(gleaner_soft_read(p, "abc", 3, buf, sizeof buf) == 3000);
    expect(buf, "abc");
    CHECK(gleaner_soft_present(p) == 1);
    CHECK(gleaner_soft_read(p, "abc", 3, buf, 10) == 3000); /* short buffer: full length */
    CHECK(gleaner_soft_read(p, NULL, 0, NULL, 0) == 3000);  /* a hit needs no args */
    /* A write replaces the value (with what the reconstructor would give for "zz": the debug
     * mode compares every hit with the reconstruction from the read's args). */
    unsigned char zz[3000];
    CHECK(recon(NULL, "zz", 2, zz, sizeof zz) == 3000);
    CHECK(gleaner_soft_write(p, zz, sizeof zz) == 1);
    CHECK(gleaner_soft_read(p, "zz", 2, buf, sizeof buf) == 3000);
    expect(buf, "zz");

    /* A hash map of 1000 keys: misses, then hits. */
    gleaner_soft_map *m = gleaner_soft_map_create(pool);
    CHECK(m != NULL);
    char key[32];
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 1000; i++) {
            snprintf(key, sizeof key, "key-%d", i);
            CHECK(gleaner_soft_map_get(m, key, strlen(key), buf, sizeof buf) == 3000);
            expect(buf, key);
        }
    gleaner_soft_stats st;
    CHECK(gleaner_soft_pool_stats(pool, &st) == 0);
    CHECK(st.misses >= 1001);
    CHECK(st.resident_bytes > 0 && st.resident_bytes <= (8u << 20) + (2u << 20) + (64u << 10));

    if (!sock) {
        /* The grant goes to nothing: memory is given back, and every read rebuilds correctly. */
        gleaner_soft_pool_set_limit(pool, 0);
        for (int i = 0; i < 200 && st.resident_bytes > (64u << 10); i++) {
            usleep(10000);
            gleaner_soft_pool_stats(pool, &st);
        }
        CHECK(st.resident_bytes <= (64u << 10));
        CHECK(gleaner_soft_present(p) == 0);
        CHECK(gleaner_soft_read(p, "xyz", 3, buf, sizeof buf) == 3000);
        expect(buf, "xyz");
    }
    CHECK(gleaner_soft_pool_stats(pool, &st) == 0);
    CHECK(st.verify_mismatches == 0);
    CHECK(gleaner_soft_read(NULL, "a", 1, buf, 1) == -1);

    gleaner_soft_map_destroy(m);
    gleaner_soft_free(p);
    gleaner_soft_pool_destroy(pool);
    printf("ok hits=%llu misses=%llu\n", (unsigned long long)st.hits,
           (unsigned long long)st.misses);
    return 0;
}

/* A program that knows nothing of gleaner, for the latency-critical reserve's tests (Hermes):
 * it checks its own data through threads, fork, realloc, memalign and calloc.
 *   all            every check below; exit 0 when all pass
 *   bound MB       allocates 256 KiB blocks up to MB, frees them, idles, and checks that its
 *                  resident set beyond its live data stays under GLEANER_RESERVE_MAX + 24 MiB
 *   hold FILE      reads FILE into the page cache, holds it open, and sleeps (killed by the test)
 *   idle MS        one allocation, then sleeps MS milliseconds (the reserve's thread should too)
 *   burst MIB      after 300 ms, MIB MiB of 1 KiB blocks (kept, each written, 64 per 20 us
 *                  pause), then 300 ms more; checks every block's contents at the end
 *   startup N      N blocks of 48 bytes at once, the first thing main does (a service's start-up:
 *                  redis makes 10,000 shared integers), kept, each written; checks them all
 *   large MIB      MIB MiB of 256 KiB blocks back to back (half calloc, checked zero), a byte
 *                  written every 256; a third freed and taken again by calloc; checks them all
 *                  (faster than the reserve's thread can fault chunks in: requests take the
 *                  chunk it is forming)
 *   cpus MIB       pins its main thread to the first CPU it may use, allocates MIB MiB of 256 KiB
 *                  blocks there (waking the reserve's thread), waits 200 ms, and prints
 *                  `pinned=CPU` and `reserve_cpus=LIST` (the reserve thread's Cpus_allowed_list)
 *   contend T R    T threads, R rounds each, over 64 live blocks per thread of mixed sizes (1 KiB
 *                  to 600 KiB: the reserve's heap and pool) taken by malloc, calloc (checked
 *                  zero) and realloc (prefix checked) and freed in random order, while the
 *                  reserve's thread refills; every block's every byte is checked before it is
 *                  freed or reallocated */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 31 + i * 7);
}
static int same(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(seed * 31 + i * 7)) return 0;
    return 1;
}

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    size_t sizes[] = {24, 1000, 4096, 40000, 131072, 262144, 700000};
    for (int round = 0; round < 200; round++) {
        unsigned char *b[7];
        for (int k = 0; k < 7; k++) {
            b[k] = malloc(sizes[k]);
            CHECK(b[k], "malloc %zu", sizes[k]);
            fill(b[k], sizes[k], id * 1000 + round + k);
        }
        for (int k = 0; k < 7; k++) {
            CHECK(same(b[k], sizes[k], id * 1000 + round + k), "thread %u block %d", id, k);
            free(b[k]);
        }
    }
    return 0;
}

static void check_threads(void) {
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) CHECK(!pthread_create(&t[i], 0, worker, (void *)i), "create");
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
}

static void check_realloc(void) {
    unsigned char *p = malloc(100);
    fill(p, 100, 5);
    size_t sizes[] = {1000, 50000, 200000, 1 << 20, 3000, 64};
    size_t have = 100;
    for (int i = 0; i < 6; i++) {
        size_t keep = have < sizes[i] ? have : sizes[i];
        p = realloc(p, sizes[i]);
        CHECK(p, "realloc %zu", sizes[i]);
        CHECK(same(p, keep, 5), "realloc to %zu lost data", sizes[i]);
        fill(p, sizes[i], 5);
        have = sizes[i];
        CHECK(malloc_usable_size(p) >= have, "usable size");
    }
    free(p);
}

static void check_memalign(void) {
    size_t aligns[] = {16, 32, 64, 256, 4096};
    size_t sizes[] = {8, 1000, 200000};
    for (int a = 0; a < 5; a++)
        for (int s = 0; s < 3; s++) {
            void *p = 0;
            CHECK(!posix_memalign(&p, aligns[a], sizes[s]), "posix_memalign");
            CHECK((uintptr_t)p % aligns[a] == 0, "posix_memalign %zu", aligns[a]);
            fill(p, sizes[s], 9);
            void *q = memalign(aligns[a], sizes[s]);
            CHECK(q && (uintptr_t)q % aligns[a] == 0, "memalign %zu", aligns[a]);
            void *r = aligned_alloc(aligns[a], sizes[s]);
            CHECK(r && (uintptr_t)r % aligns[a] == 0, "aligned_alloc %zu", aligns[a]);
            CHECK(same(p, sizes[s], 9), "aligned block");
            free(p); free(q); free(r);
        }
}

static void check_calloc(void) {
    /* dirty blocks of each size are freed first, so calloc is served from reused memory */
    size_t sizes[] = {48, 1024, 100000, 262144, 600000};
    for (int s = 0; s < 5; s++) {
        for (int k = 0; k < 20; k++) {
            unsigned char *d = malloc(sizes[s]);
            memset(d, 0xAB, sizes[s]);
            free(d);
            unsigned char *z = calloc(1, sizes[s]);
            CHECK(z, "calloc");
            for (size_t i = 0; i < sizes[s]; i++) CHECK(z[i] == 0, "calloc %zu byte %zu", sizes[s], i);
            free(z);
        }
    }
}

static void check_fork(void) {
    unsigned char *small = malloc(1000), *big = malloc(300000);
    fill(small, 1000, 77);
    fill(big, 300000, 78);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        if (!same(small, 1000, 77) || !same(big, 300000, 78)) _exit(3);
        /* the child allocates and frees, including the parent's blocks */
        for (int i = 0; i < 100; i++) {
            unsigned char *p = malloc(i % 2 ? 1000 : 262144);
            size_t n = i % 2 ? 1000 : 262144;
            fill(p, n, i);
            if (!same(p, n, i)) _exit(4);
            free(p);
        }
        free(small);
        free(big);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child status %d", st);
    CHECK(same(small, 1000, 77) && same(big, 300000, 78), "parent data after fork");
    free(small);
    free(big);
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static int run_bound(long mb) {
    const char *m = getenv("GLEANER_RESERVE_MAX");
    long bound = m ? atol(m) : 64L << 20;
    long base = rss_kb();
    size_t n = (size_t)mb * 4;
    unsigned char **b = malloc(n * sizeof(*b));
    long worst = 0;
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(262144);
        CHECK(b[i], "malloc");
        for (size_t j = 0; j < 262144; j += 4096) b[i][j] = 1;
        usleep(500);
        long extra = (rss_kb() - base) * 1024 - (long)(i + 1) * 262144;
        if (extra > worst) worst = extra;
    }
    for (size_t i = 0; i < n; i++) free(b[i]);
    usleep(200000);
    long extra = (rss_kb() - base) * 1024;
    if (extra > worst) worst = extra;
    printf("{\"bound\": %ld, \"worst_extra\": %ld}\n", bound, worst);
    CHECK(worst <= bound + (24L << 20), "resident beyond live data %ld > bound %ld + 24 MiB", worst, bound);
    return 0;
}

static int run_hold(const char *path) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open %s", path);
    char buf[1 << 16];
    while (read(fd, buf, sizeof buf) > 0) {}
    printf("holding\n");
    fflush(stdout);
    for (;;) pause();
}

static int run_idle(long ms) {
    char *p = malloc(100);
    CHECK(p, "malloc");
    p[0] = 1;
    usleep(ms * 1000);
    free(p);
    printf("idle done\n");
    return 0;
}

static int run_startup(long n) {
    unsigned char *b[n];
    for (long i = 0; i < n; i++) {
        b[i] = malloc(48);
        CHECK(b[i], "malloc");
        fill(b[i], 48, (unsigned)i);
    }
    for (long i = 0; i < n; i++) {
        CHECK(same(b[i], 48, (unsigned)i), "block %ld changed", i);
        free(b[i]);
    }
    printf("startup done\n");
    return 0;
}

static int run_burst(long mib) {
    size_t n = (size_t)mib * 1024;
    unsigned char **b = malloc(n * sizeof(*b));
    CHECK(b, "malloc");
    usleep(300000);
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(1024);
        CHECK(b[i], "malloc");
        fill(b[i], 1024, (unsigned)i);
        if (i % 64 == 63) usleep(20);
    }
    usleep(300000);
    for (size_t i = 0; i < n; i++) {
        CHECK(same(b[i], 1024, (unsigned)i), "block %zu changed", i);
        free(b[i]);
    }
    free(b);
    printf("burst done\n");
    return 0;
}

#define LARGE_BLOCK (256 * 1024)

/* A block of LARGE_BLOCK bytes: calloc'd ones are checked zero; a byte every 256 is written. */
static unsigned char *large_block(size_t i, int zeroed) {
    unsigned char *p = zeroed ? calloc(1, LARGE_BLOCK) : malloc(LARGE_BLOCK);
    CHECK(p, "malloc %zu", i);
    if (zeroed)
        for (size_t j = 0; j < LARGE_BLOCK; j++) CHECK(!p[j], "calloc block %zu byte %zu", i, j);
    for (size_t j = 0; j < LARGE_BLOCK; j += 256) p[j] = (unsigned char)(i * 31 + j / 256 * 7);
    return p;
}

static int run_large(long mib) {
    size_t n = (size_t)mib * 4;
    unsigned char **b = malloc(n * sizeof(*b));
    CHECK(b, "malloc");
    for (size_t i = 0; i < n; i++) b[i] = large_block(i, i % 2);
    for (size_t i = 0; i < n; i += 3) {
        free(b[i]);
        b[i] = large_block(i, 1);
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < LARGE_BLOCK; j += 256)
            CHECK(b[i][j] == (unsigned char)(i * 31 + j / 256 * 7), "block %zu byte %zu", i, j);
        free(b[i]);
    }
    free(b);
    printf("large done\n");
    return 0;
}

/* `cpus MIB`: where the reserve's thread may run once requests from one CPU woke it. */
static int run_cpus(long mib) {
    cpu_set_t set;
    CHECK(!sched_getaffinity(0, sizeof set, &set), "sched_getaffinity");
    int pinned = -1;
    for (int c = 0; c < CPU_SETSIZE && pinned < 0; c++)
        if (CPU_ISSET(c, &set)) pinned = c;
    CPU_ZERO(&set);
    CPU_SET(pinned, &set);
    CHECK(!sched_setaffinity(0, sizeof set, &set), "pinning to CPU %d", pinned);
    size_t n = (size_t)mib * 4;
    unsigned char **b = malloc(n * sizeof(*b));
    CHECK(b, "malloc");
    for (size_t i = 0; i < n; i++) b[i] = large_block(i, 0);
    usleep(200 * 1000);
    char list[256] = "";
    DIR *d = opendir("/proc/self/task");
    CHECK(d, "opendir /proc/self/task");
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[320], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "gleaner-reserve", 15)) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        CHECK(f, "open %s", path);
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18)) {
                snprintf(list, sizeof list, "%s", line + 18 + strspn(line + 18, " \t"));
                list[strcspn(list, "\n")] = 0;
            }
        fclose(f);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < LARGE_BLOCK; j += 256)
            CHECK(b[i][j] == (unsigned char)(i * 31 + j / 256 * 7), "block %zu byte %zu", i, j);
        free(b[i]);
    }
    free(b);
    printf("pinned=%d reserve_cpus=%s done\n", pinned, list[0] ? list : "none");
    return 0;
}

/* A block of the contention check: its bytes are a function of (seed, index). */
struct live {
    unsigned char *p;
    size_t n;
    unsigned seed;
};

static void put_pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((seed * 2654435761u) >> 24 ^ i ^ i >> 8);
}
static int has_pattern(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)((seed * 2654435761u) >> 24 ^ i ^ i >> 8)) return 0;
    return 1;
}

static long contend_rounds;

static void *contender(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    static const size_t sizes[] = {24, 200, 1000, 4096, 30000, 131072, 200000, 262144, 600000};
    struct live l[64];
    memset(l, 0, sizeof l);
    unsigned rnd = 12345 + id * 7919;
    for (long round = 0; round < contend_rounds; round++) {
        rnd = rnd * 1103515245u + 12345u;
        struct live *b = &l[(rnd >> 8) % 64];
        size_t n = sizes[(rnd >> 16) % 9];
        unsigned seed = id * 1000003u + (unsigned)round;
        int how = (rnd >> 24) % 3;
        if (b->p) CHECK(has_pattern(b->p, b->n, b->seed), "thread %u round %ld: block changed", id, round);
        if (how == 2 && b->p) {
            unsigned char *q = realloc(b->p, n);
            CHECK(q, "realloc %zu", n);
            size_t keep = n < b->n ? n : b->n;
            CHECK(has_pattern(q, keep, b->seed), "thread %u round %ld: realloc lost data", id, round);
            b->p = q;
        } else {
            free(b->p);
            b->p = how == 1 ? calloc(1, n) : malloc(n);
            CHECK(b->p, "malloc %zu", n);
            if (how == 1)
                for (size_t j = 0; j < n; j++) CHECK(!b->p[j], "thread %u: calloc byte %zu of %zu", id, j, n);
        }
        b->n = n;
        b->seed = seed;
        put_pattern(b->p, n, seed);
    }
    for (int i = 0; i < 64; i++)
        if (l[i].p) {
            CHECK(has_pattern(l[i].p, l[i].n, l[i].seed), "thread %u: block %d changed at the end", id, i);
            free(l[i].p);
        }
    return 0;
}

static int run_contend(long threads, long rounds) {
    pthread_t t[16];
    CHECK(threads >= 1 && threads <= 16, "threads: 1 to 16");
    contend_rounds = rounds;
    for (long i = 0; i < threads; i++)
        CHECK(!pthread_create(&t[i], 0, contender, (void *)(uintptr_t)i), "create");
    for (long i = 0; i < threads; i++) pthread_join(t[i], 0);
    printf("contend done\n");
    return 0;
}

/* `offsets N [KIB]`: N large blocks (200 KiB, or KIB KiB) held at once, then their page
 * offsets: how many distinct ones, and how many at 16 (right after a 16-byte header at a page's
 * start). Every block is written whole and checked before it is freed. */
static int run_offsets(long n, size_t size) {
    unsigned char **b = calloc((size_t)n, sizeof *b);
    int seen[4096 / 16] = {0};
    long distinct = 0, at16 = 0;
    CHECK(b, "calloc");
    for (long i = 0; i < n; i++) {
        b[i] = malloc(size);
        CHECK(b[i], "malloc %zu", size);
        put_pattern(b[i], size, (unsigned)i + 1);
        size_t off = (uintptr_t)b[i] % 4096;
        CHECK(off % 16 == 0, "block %ld at page offset %zu: not 16-byte aligned", i, off);
        distinct += !seen[off / 16]++;
        at16 += off == 16;
    }
    for (long i = 0; i < n; i++) {
        CHECK(has_pattern(b[i], size, (unsigned)i + 1), "block %ld changed", i);
        free(b[i]);
    }
    free(b);
    printf("offsets distinct=%ld at16=%ld done\n", distinct, at16);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "all")) {
        check_threads();
        check_realloc();
        check_memalign();
        check_calloc();
        check_fork();
        printf("ok\n");
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "bound")) return run_bound(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "hold")) return run_hold(argv[2]);
    if (argc > 2 && !strcmp(argv[1], "idle")) return run_idle(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "burst")) return run_burst(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "startup")) return run_startup(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "large")) return run_large(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "cpus")) return run_cpus(atol(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "offsets"))
        return run_offsets(atol(argv[2]), (argc > 3 ? (size_t)atol(argv[3]) : 200) << 10);
    if (argc > 3 && !strcmp(argv[1], "contend")) return run_contend(atol(argv[2]), atol(argv[3]));
    fprintf(stderr, "usage: %s all | bound MB | hold FILE | idle MS | burst MIB | startup N | "
            "large MIB | offsets N [KIB] | contend T R\n", argv[0]);
    return 2;
}

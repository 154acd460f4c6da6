/* A program run under `gleaner run` by the end-to-end tests (crates/cli/tests/run_programs.rs).
 * It is an ordinary C program that knows nothing about gleaner: it uses the C allocator and
 * anonymous mappings the way real programs do and verifies every byte it wrote.
 *
 *   preload_program mixed MB        threads mixing malloc/calloc/realloc/posix_memalign, mmap,
 *                                   munmap, madvise(DONTNEED/FREE), mremap (grow, move, shrink)
 *                                   and read(2) into managed buffers; all contents verified; a
 *                                   MAP_32BIT mapping must lie in the first 2 GiB, and
 *                                   memalign(24, ...) must round to 32 as glibc does
 *   preload_program small MB        threads allocating, freeing, reusing and reallocating small
 *                                   blocks of every size up to 4 KiB (the heap's size classes);
 *                                   one size's blocks must pack together away from large ones;
 *                                   a fork child allocates and frees small blocks too
 *   preload_program fork MB         fill MB, fork; the child verifies everything as of the fork
 *                                   while the parent rewrites it; both verify their own view and
 *                                   print their private resident memory (`rss_anon_kb`): the
 *                                   parent's right after the fork, the child's after its checks
 *   preload_program exec MB         fill MB, verify, then exec itself as `mixed 8`
 *   preload_program thread-exit MB  fill MB, then a non-main thread calls exit(0) mid-run
 *   preload_program sigterm MB      fill MB, print "ready", exit 42 from the SIGTERM handler
 *                                   after verifying the data
 *   preload_program crash MB        fill MB (pushing most to the memnode), then SIGSEGV
 *   preload_program hog MB          allocate and fill MB, expecting to be stopped
 *   preload_program close-all MB    fill MB, then close every descriptor above 2 the ways
 *                                   daemons and fork children about to exec do (close_range, a
 *                                   loop of close, closefrom), in a fork child too; any number
 *                                   still open must refuse dup2 with EBUSY (and look closed to
 *                                   fcntl: EBADF), and low numbers
 *                                   (a shell's `exec 3>file`) must be free; the data must be
 *                                   intact, then rewritten and intact again. Prints how many
 *                                   descriptors it could not close (`kept N`)
 *   preload_program swap-fds MB     fill MB, then for 6 s do what CPython's subprocess tests do
 *                                   to a standard stream: close a descriptor of its own (the
 *                                   lowest free number then), read some of the data, close the
 *                                   number again (EBADF: nothing may be there), and dup2 a saved
 *                                   copy back onto it, which must then be that file; the pager
 *                                   makes descriptors meanwhile (its watchdog reads /proc, the
 *                                   status file is rewritten, faults fetch). The data must be
 *                                   intact. Prints how many swaps it made (`swaps N`)
 *   preload_program fd-limit MB     open descriptors until the limit refuses one (EMFILE), as a
 *                                   busy server may, then fill MB, verify, rewrite and verify
 *                                   again. Prints how many it opened (`opened N`)
 *   preload_program fd-churn MB     a thread takes every free descriptor (opens until EMFILE),
 *                                   gives back a few and takes them again, over and over, while
 *                                   the main thread fills MB, verifies, rewrites and verifies
 *                                   again: the pager's grants and evictions make descriptors at
 *                                   the very moments the program races for every number. Prints
 *                                   how often the thread reached the limit (`limits N`)
 *   preload_program mlock MB        lock all memory (mlockall(MCL_CURRENT | MCL_FUTURE), as
 *                                   `memcached -k` does), fill MB, mlock a 4 MiB buffer and fill
 *                                   it, verify both, munlock, munlockall, rewrite and verify
 *                                   again. Prints how much the kernel had locked (`locked N kB`)
 *   preload_program wipe-on-fork MB mark pages MADV_WIPEONFORK (a mapping, half of an aligned
 *                                   malloc block after MADV_KEEPONFORK on the other half, a
 *                                   mapping moved by mremap), fill MB beside them so that most go
 *                                   far, fork: the child must read zeros exactly there and the
 *                                   rest intact, write the pages again and fork a grandchild,
 *                                   which must read zeros again; the parent's data stays intact
 *   preload_program uring-plain MB  read a file into an 8 MiB buffer pushed far (MB filled after
 *                                   it) with io_uring (IORING_OP_READ), verify what arrived
 *   preload_program uring-fixed MB  the same with the buffer registered (IORING_REGISTER_BUFFERS:
 *                                   pinned) and IORING_OP_READ_FIXED, then wait up to 10 s:
 *                                   gleaner must stop it (exit 86), since it cannot page pinned
 *                                   memory; exits 1 if it is still running then
 *   preload_program drop-privileges MB  as root: fill MB, become `nobody` (setgid, setuid), fill
 *                                   MB more, verify both; a fork child then does the same
 *                                   checks. Prints `dropped` once it runs as nobody, and
 *                                   `filled` after the second fill, then sleeps
 *                                   $DROP_PRIVILEGES_LINGER_MS (default 0) before the checks
 *   preload_program daemon MB OUT [title]  a daemon: fill 4 MiB, fork, and leave at once; the
 *                                   child (its stdio on /dev/null, a session of its own) waits
 *                                   until its parent is gone and 1.5 s more, fills MB, checks
 *                                   all, and writes `rss KB` (its RssAnon) and `ok` to the file
 *                                   OUT. With `title`, first moves its environment into its heap
 *                                   and blanks the original, as redis's setproctitle does
 *   preload_program env-far MB      moves its environment into its heap as `daemon ... title`
 *                                   does, fills MB (so the environment's page goes far), prints
 *                                   `filled`, then reads its memory over and over for 60 s
 *   preload_program big MB          big blocks (256 KiB to 4 MiB) freed and allocated again over
 *                                   and over with malloc, calloc, realloc and posix_memalign, as
 *                                   numpy does with its arrays: every calloc'd block must read
 *                                   as zeros and every block keep its data; then half of them
 *                                   freed, a pause, and as much allocated again in larger blocks
 *   preload_program dlopen-tls MB DIR N  dlopen DIR/tls_0.so .. DIR/tls_{N-1}.so (copies of
 *                                   tests/c/tls_module.c: the dynamic linker's records of them
 *                                   are made now, from the program's heap), fill MB so that they
 *                                   go far, then start a thread that uses every module's
 *                                   thread-local storage, fork (the child starts a thread too,
 *                                   and forks again after filling MB more), and load one more;
 *                                   each thread must see its own fresh counters. Prints
 *                                   `dlopen-tls ok`; a hang is the failure (the test's limit)
 *   preload_program setgroups MB    as root, with two threads of its own: make a list of groups
 *                                   in its heap, fill MB so that it goes far, setgroups(list)
 *                                   (the C library has every thread of the process repeat the
 *                                   call with the same list), check getgroups; then the same
 *                                   through initgroups("root", 0). Prints `setgroups ok`; a hang
 *                                   is the failure (the test's limit)
 *   preload_program signal-blocked MB  block SIGUSR1 in every thread of its own, fill MB, send
 *                                   itself SIGUSR1: no thread may run the handler (the signal
 *                                   stays pending) until the main thread unblocks it, and then
 *                                   the main thread runs it. Prints `signal-blocked ok`
 *   preload_program low-limit MB    set the soft descriptor limit to 29 (the hard one as it
 *                                   is), then exec itself as `count-fds MB`, which prints how
 *                                   many descriptors below 29 were open at its start and how
 *                                   many more it could open (`below N opened M`), then fills
 *                                   MB and checks it (`count-fds ok`)
 *   preload_program fork-libc-state MB PATH  use the name service (getpwuid) and open PATH
 *                                   with stdio, writing a line left in the FILE's buffer; fill MB
 *                                   so that the C library's records of both go far; fork. The C
 *                                   library's fork reads the name service's state in the parent
 *                                   and resets every FILE's lock in the child before any fork
 *                                   handler runs. The child writes a line and looks a user up;
 *                                   the parent too, after it. PATH must end up with the parent's
 *                                   and the child's lines. Prints `fork-libc-state ok`
 * Exit status 0 means every check passed; a failed check prints what and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/io_uring.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL

static void fail(const char *what) {
    fprintf(stderr, "preload_program: CHECK FAILED: %s (errno %d)\n", what, errno);
    exit(1);
}

/* Waits for child `pid`; fails with `what` unless it exited with status 0. */
static void wait_ok(pid_t pid, const char *what) {
    int st;
    if (waitpid(pid, &st, 0) != pid) fail("waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s: status %d\n", what, st);
        fail(what);
    }
}

/* A deterministic 64-bit value for word `i` of stream `seed`. */
static uint64_t word(uint64_t seed, uint64_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + i + 1;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static void fill(void *p, size_t len, uint64_t seed) {
    uint64_t *w = p;
    for (size_t i = 0; i < len / 8; i++) w[i] = word(seed, i);
}

static int check(const void *p, size_t len, uint64_t seed) {
    const uint64_t *w = p;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != word(seed, i)) return 0;
    return 1;
}

static int all_zero(const void *p, size_t len) {
    const unsigned char *c = p;
    for (size_t i = 0; i < len; i++)
        if (c[i]) return 0;
    return 1;
}

/* ---- mixed ------------------------------------------------------------------------------- */

struct worker { int id; size_t bytes; };

static void *mixed_worker(void *arg) {
    struct worker *wk = arg;
    uint64_t base = (uint64_t)wk->id << 32;
    size_t nblocks = wk->bytes / 8192;
    void **blocks = calloc(nblocks, sizeof(void *));
    size_t *sizes = calloc(nblocks, sizeof(size_t));
    if (!blocks || !sizes) fail("calloc of the block table");
    /* malloc / calloc / posix_memalign of assorted sizes, some of them big (page-backed). */
    for (size_t i = 0; i < nblocks; i++) {
        size_t sz = 64 + (word(base, i) % 16000);
        if (i % 97 == 0) sz = 300 * 1024; /* big block */
        void *p = NULL;
        switch (i % 3) {
        case 0: p = malloc(sz); break;
        case 1:
            p = calloc(1, sz);
            if (p && !all_zero(p, sz)) fail("calloc memory is not zeroed");
            break;
        case 2:
            if (posix_memalign(&p, 256, sz)) p = NULL;
            if (p && ((uintptr_t)p % 256)) fail("posix_memalign alignment");
            break;
        }
        if (!p) fail("allocation");
        sz &= ~7UL;
        fill(p, sz, base + i);
        blocks[i] = p;
        sizes[i] = sz;
    }
    /* realloc half of them (grow and shrink), free a quarter. */
    for (size_t i = 0; i < nblocks; i += 2) {
        size_t nsz = (i % 4 == 0) ? sizes[i] * 2 : sizes[i] / 2;
        nsz &= ~7UL;
        if (nsz < 8) nsz = 8;
        size_t keep = nsz < sizes[i] ? nsz : sizes[i];
        void *p = realloc(blocks[i], nsz);
        if (!p) fail("realloc");
        if (!check(p, keep, base + i)) fail("realloc lost the old contents");
        fill(p, nsz, base + i);
        blocks[i] = p;
        sizes[i] = nsz;
    }
    if (malloc_usable_size(blocks[1]) < sizes[1]) fail("malloc_usable_size too small");
    for (size_t i = 3; i < nblocks; i += 4) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    /* Anonymous mappings: fill, discard part with DONTNEED and FREE, grow, move, shrink. */
    size_t mlen = 64 * PAGE;
    char *m = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("mmap");
    fill(m, mlen, base + 1000000);
    if (madvise(m, 8 * PAGE, MADV_DONTNEED)) fail("madvise DONTNEED");
    if (!all_zero(m, 8 * PAGE)) fail("MADV_DONTNEED pages do not read as zeros");
    if (madvise(m + 8 * PAGE, 8 * PAGE, MADV_FREE)) fail("madvise FREE");
    fill(m, 16 * PAGE, base + 2000000); /* rewrite the discarded part */
    char *g = mremap(m, mlen, 4 * mlen, MREMAP_MAYMOVE);
    if (g == MAP_FAILED) fail("mremap grow");
    if (!check(g, 16 * PAGE, base + 2000000)) fail("mremap lost the head");
    if (!all_zero(g + mlen, 3 * mlen)) fail("mremap's new tail is not zero");
    fill(g, 4 * mlen, base + 3000000);
    char *s = mremap(g, 4 * mlen, mlen, 0);
    if (s != g) fail("mremap shrink moved");
    if (!check(s, mlen, base + 3000000)) fail("mremap shrink lost data");
    /* read(2) into a managed buffer: the kernel writes the page, not the program. */
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) fail("open /proc/self/exe");
    char *kbuf = malloc(3 * PAGE);
    char *ref = mmap(NULL, 3 * PAGE, PROT_READ, MAP_PRIVATE, fd, 0); /* file-backed: unmanaged */
    if (!kbuf || ref == MAP_FAILED) fail("buffers for read(2)");
    ssize_t n = pread(fd, kbuf, 3 * PAGE, 0);
    if (n != (ssize_t)(3 * PAGE) || memcmp(kbuf, ref, 3 * PAGE)) fail("read(2) into managed memory");
    munmap(ref, 3 * PAGE);
    close(fd);
    free(kbuf);
    /* Everything that survived must still be intact (much of it came back from the memnode). */
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i] && !check(blocks[i], sizes[i], base + i)) fail("heap block corrupted");
    if (!check(s, mlen, base + 3000000)) fail("mapping corrupted");
    if (munmap(s, mlen)) fail("munmap");
    /* A fresh mapping of the same size (likely the same range) reads as zeros. */
    char *z = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (z == MAP_FAILED || !all_zero(z, mlen)) fail("a fresh mapping does not read as zeros");
    munmap(z, mlen);
    for (size_t i = 0; i < nblocks; i++) free(blocks[i]);
    free(blocks);
    free(sizes);
    return NULL;
}

/* MAP_32BIT promises an address in the first 2 GiB (JITs keep pointers in 32 bits there). */
static void check_map_32bit(void) {
    size_t len = 1 << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (p == MAP_FAILED) fail("mmap MAP_32BIT");
    if ((uintptr_t)p + len > (1UL << 31)) fail("MAP_32BIT mapping above 2 GiB");
    fill(p, len, 9);
    if (!check(p, len, 9)) fail("MAP_32BIT mapping");
    munmap(p, len);
}

/* glibc's memalign rounds an alignment that is not a power of two up to one. */
static void check_memalign_rounding(void) {
    char *p = memalign(24, 100);
    if (!p || (uintptr_t)p % 32) fail("memalign(24, 100)");
    memset(p, 7, 100);
    free(p);
}

static int run_mixed(size_t mb) {
    enum { T = 4 };
    pthread_t t[T];
    check_map_32bit();
    check_memalign_rounding();
    struct worker w[T];
    for (int i = 0; i < T; i++) {
        w[i].id = i + 1;
        w[i].bytes = mb * (1UL << 20) / T;
        if (pthread_create(&t[i], NULL, mixed_worker, &w[i])) fail("pthread_create");
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    printf("mixed ok\n");
    return 0;
}

/* ---- small: the heap's size classes ------------------------------------------------------ */

static unsigned char byte_at(uint64_t seed, size_t i) { return (unsigned char)(word(seed, i) >> 17); }

static void fill_bytes(void *p, size_t len, uint64_t seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < len; i++) c[i] = byte_at(seed, i);
}

static int check_bytes(const void *p, size_t len, uint64_t seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < len; i++)
        if (c[i] != byte_at(seed, i)) return 0;
    return 1;
}

static void *small_worker(void *arg) {
    struct worker *wk = arg;
    uint64_t base = (uint64_t)wk->id << 40;
    size_t n = wk->bytes / 1024; /* blocks average ~1 KiB counting the large ones */
    char **p = calloc(n, sizeof *p);
    size_t *sz = calloc(n, sizeof *sz);
    if (!p || !sz) fail("calloc of the block table");
    for (size_t i = 0; i < n; i++) {
        sz[i] = 1 + word(base, i) % 4096; /* every class, and a little beyond the largest */
        p[i] = malloc(sz[i]);
        if (!p[i]) fail("small malloc");
        if ((uintptr_t)p[i] % 16) fail("small block not 16-byte aligned");
        if (malloc_usable_size(p[i]) < sz[i]) fail("malloc_usable_size below the request");
        fill_bytes(p[i], sz[i], base + i);
    }
    /* Free a third (scribbled over first), then reuse their space: calloc must still be zero. */
    for (size_t i = 0; i < n; i += 3) {
        memset(p[i], 0xA5, sz[i]);
        free(p[i]);
    }
    for (size_t i = 0; i < n; i += 3) {
        p[i] = calloc(1, sz[i]);
        if (!p[i] || !all_zero(p[i], sz[i])) fail("calloc of a reused small block is not zeroed");
        fill_bytes(p[i], sz[i], base + i + 7);
    }
    /* realloc across classes: up within the small sizes, up to large and page-sized, and down. */
    static const size_t to[] = {24, 200, 1000, 3000, 3585, 9000, 300 * 1024, 5};
    for (size_t i = 1; i < n; i += 5) {
        uint64_t seed = base + i + (i % 3 == 0 ? 7 : 0);
        size_t nsz = to[(i / 5) % (sizeof to / sizeof *to)];
        size_t keep = nsz < sz[i] ? nsz : sz[i];
        char *q = realloc(p[i], nsz);
        if (!q) fail("small realloc");
        if (!check_bytes(q, keep, seed)) fail("realloc across size classes lost data");
        p[i] = q;
        sz[i] = nsz;
        fill_bytes(q, nsz, base + i + 11);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t seed = base + i + (i % 5 == 1 ? 11 : (i % 3 == 0 ? 7 : 0));
        if (!check_bytes(p[i], sz[i], seed)) fail("small block corrupted");
        free(p[i]);
    }
    free(p);
    free(sz);
    return NULL;
}

/* One size's blocks allocated between larger ones must share pages with each other only (the
 * heap's size classes): a first-fit heap interleaves them with the 1 KiB blocks, so 20000 of
 * them would touch ~5000 pages instead of ~240. */
static void small_blocks_pack_together(void) {
    enum { N = 20000 };
    static char *small_blocks[N], *big_blocks[N];
    size_t pages = 0;
    for (int i = 0; i < N; i++) {
        small_blocks[i] = malloc(40);
        big_blocks[i] = malloc(1024);
        if (!small_blocks[i] || !big_blocks[i]) fail("malloc for the packing check");
        fill_bytes(small_blocks[i], 40, 900 + i);
        if (i == 0 || (uintptr_t)small_blocks[i] / PAGE != (uintptr_t)small_blocks[i - 1] / PAGE)
            pages++;
    }
    if (pages > 2 * (N * 48 / PAGE) + 64) {
        fprintf(stderr, "20000 blocks of 40 bytes lie on %zu pages\n", pages);
        fail("small blocks are not packed by size");
    }
    for (int i = 0; i < N; i++) {
        if (!check_bytes(small_blocks[i], 40, 900 + i)) fail("packed small block corrupted");
        free(small_blocks[i]);
        free(big_blocks[i]);
    }
}

static int run_small(size_t mb) {
    enum { T = 4 };
    pthread_t t[T];
    struct worker w[T];
    small_blocks_pack_together();
    for (int i = 0; i < T; i++) {
        w[i].id = i + 1;
        w[i].bytes = mb * (1UL << 20) / T;
        if (pthread_create(&t[i], NULL, small_worker, &w[i])) fail("pthread_create");
    }
    /* The main thread forks while the workers allocate: the child's heap must work. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        char *b[1000];
        for (int i = 0; i < 1000; i++) {
            b[i] = malloc(1 + i * 3);
            if (!b[i]) _exit(4);
            fill_bytes(b[i], 1 + i * 3, 77 + i);
        }
        for (int i = 0; i < 1000; i++) {
            if (!check_bytes(b[i], 1 + i * 3, 77 + i)) _exit(5);
            free(b[i]);
        }
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) fail("waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("the fork child's small blocks");
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    printf("small ok\n");
    return 0;
}

/* ---- fork ------------------------------------------------------------------------------- */

/* The field `name` of /proc/self/status, in KiB (-1 if unreadable). */
static long status_kb(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256], format[64];
    snprintf(format, sizeof format, "%s: %%ld kB", name);
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, format, &kb) == 1) break;
    fclose(f);
    return kb;
}

/* This process's private resident memory (RssAnon), in KiB. */
static long rss_anon_kb(void) { return status_kb("RssAnon"); }

static int run_fork(size_t mb) {
    size_t len = mb << 20;
    char *a = malloc(len);
    if (!a) fail("malloc");
    fill(a, len, 7);
    /* A second buffer the parent frees while the child still has to read it. */
    char *c = malloc(len / 4);
    if (!c) fail("malloc");
    fill(c, len / 4, 13);
    int pipefd[2];
    if (pipe(pipefd)) fail("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        char go;
        close(pipefd[1]);
        /* Wait until the parent has rewritten everything: the child must still see the old. */
        if (read(pipefd[0], &go, 1) != 1) _exit(3);
        if (!check(a, len, 7) || !check(c, len / 4, 13)) {
            fprintf(stderr, "child: memory differs from the parent's at fork\n");
            _exit(2);
        }
        printf("child rss_anon_kb %ld\n", rss_anon_kb());
        /* The child's own writes and allocations work too. */
        fill(a, len / 4, 8);
        char *b = malloc(1 << 20);
        if (!b) _exit(4);
        fill(b, 1 << 20, 9);
        if (!check(a, len / 4, 8) || !check(b, 1 << 20, 9)) _exit(5);
        free(b);
        fflush(stdout);
        _exit(0);
    }
    close(pipefd[0]);
    printf("parent rss_anon_kb %ld\n", rss_anon_kb());
    fill(a, len, 11); /* the parent moves on (and evicts back under its budget) */
    free(c);
    if (write(pipefd[1], "g", 1) != 1) fail("write to pipe");
    wait_ok(pid, "the fork child's checks");
    if (!check(a, len, 11)) fail("parent memory after fork");
    free(a);
    printf("fork ok\n");
    return 0;
}

/* ---- close-all ------------------------------------------------------------------------- */

static char *filled(size_t mb, uint64_t seed);

/* Closes every descriptor above 2, three ways; returns how many stayed open. */
static int close_everything(void) {
    if (close_range(3, ~0U, 0)) fail("close_range");
    for (int fd = 3; fd < 4096; fd++) close(fd);
    closefrom(3);
    /* What is left is not the program's: a number it cannot take (dup2 refuses it with EBUSY),
     * though it looks closed (fcntl says EBADF, as for a number never opened). */
    int kept = 0;
    long limit = sysconf(_SC_OPEN_MAX); /* dup2 takes no number at or past it */
    for (int fd = 3; fd < limit && fd < 1 << 16; fd++) {
        if (dup2(1, fd) == fd) {
            close(fd);
            continue;
        }
        if (errno != EBUSY) fail("dup2 onto a number");
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) fail("fcntl on a number left open");
        kept++;
    }
    return kept;
}

static int run_close_all(size_t mb) {
    size_t len = mb << 20;
    char *a = filled(mb, 21);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        /* As a fork child about to exec does (Python's subprocess with preexec_fn). */
        close_everything();
        if (!check(a, len, 21)) {
            fprintf(stderr, "child: memory differs after closing every descriptor\n");
            _exit(2);
        }
        _exit(0);
    }
    wait_ok(pid, "the fork child's checks");
    int kept = close_everything();
    /* A shell's `exec 3>file`, `exec 4<&0`: low numbers are the program's to name. */
    for (int fd = 3; fd < 10; fd++)
        if (dup2(1, fd) != fd) fail("dup2 onto a low number");
    for (int fd = 3; fd < 10; fd++) close(fd);
    if (!check(a, len, 21)) fail("memory after closing every descriptor");
    fill(a, len, 22);
    if (!check(a, len, 22)) fail("memory rewritten after closing every descriptor");
    free(a);
    printf("close-all ok, kept %d\n", kept);
    return 0;
}

/* ---- swap-fds ------------------------------------------------------------------------- */

static ino_t inode_of(int fd) {
    struct stat st;
    return fstat(fd, &st) ? 0 : st.st_ino;
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static int run_swap_fds(size_t mb) {
    size_t len = mb << 20;
    char *a = filled(mb, 31);
    char path[] = "/tmp/gleaner-swap-fds-XXXXXX";
    int k = mkstemp(path); /* the lowest free number */
    if (k < 0) fail("mkstemp");
    unlink(path);
    int saved = fcntl(k, F_DUPFD_CLOEXEC, 100); /* a copy out of the low numbers */
    if (saved < 0) fail("F_DUPFD");
    ino_t want = inode_of(k);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long swaps = 0;
    size_t at = 0;
    volatile char sink = 0;
    for (;;) {
        if (close(k)) fail("close of the program's own descriptor (someone closed it)");
        /* Number k is free: whatever the process makes now lands there. */
        for (int i = 0; i < 8; i++) {
            sink += a[at];
            at = (at + 7 * 4096 + 64) % len;
        }
        if (close(k) == 0) {
            fprintf(stderr, "swap %ld: closing the free number %d succeeded: a descriptor the "
                            "program never made was there, and is now closed\n", swaps, k);
            _exit(3);
        }
        if (errno != EBADF) fail("close of a free number");
        if (dup2(saved, k) != k) fail("dup2 of the saved copy");
        if (inode_of(k) != want) {
            fprintf(stderr, "swap %ld: descriptor %d is not the file dup2 just put there\n",
                    swaps, k);
            _exit(3);
        }
        swaps++;
        if (swaps % 64 == 0 && seconds_since(&t0) > 6.0) break;
    }
    if (pwrite(k, "x", 1, 0) != 1) fail("a write through the restored descriptor");
    if (!check(a, len, 31)) fail("memory after the swaps");
    free(a);
    printf("swap-fds ok, swaps %ld\n", swaps);
    return 0;
}

/* ---- fd-limit ------------------------------------------------------------------------- */

static int run_fd_limit(size_t mb) {
    int opened = 0;
    while (open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) opened++;
    if (errno != EMFILE) fail("open stopped short of the descriptor limit");
    size_t len = mb << 20;
    char *a = filled(mb, 31); /* checked as it is filled, at the limit */
    fill(a, len, 32);
    if (!check(a, len, 32)) fail("memory rewritten at the descriptor limit");
    free(a);
    printf("fd-limit ok, opened %d\n", opened);
    return 0;
}

/* ---- fd-churn ----------------------------------------------------------------------- */

static atomic_int churn_done;
static atomic_long churn_limits;

/* Takes every descriptor it can, gives the last 8 back, and again, until told to stop; then
 * closes them all. */
static void *fd_churner(void *arg) {
    (void)arg;
    static int held[1 << 16];
    int n = 0;
    while (!atomic_load(&churn_done)) {
        int fd;
        while (n < (1 << 16) && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) held[n++] = fd;
        if (n < (1 << 16) && errno != EMFILE) fail("open stopped short of the descriptor limit");
        atomic_fetch_add(&churn_limits, 1);
        for (int i = 0; i < 8 && n > 0; i++) close(held[--n]);
    }
    while (n > 0) close(held[--n]);
    return NULL;
}

static int run_fd_churn(size_t mb) {
    pthread_t t;
    if (pthread_create(&t, NULL, fd_churner, NULL)) fail("pthread_create");
    size_t len = mb << 20;
    char *a = filled(mb, 33); /* checked as it is filled, while the thread races */
    fill(a, len, 34);
    if (!check(a, len, 34)) fail("memory rewritten while descriptors were taken");
    atomic_store(&churn_done, 1);
    pthread_join(t, NULL);
    free(a);
    printf("fd-churn ok, limits %ld\n", atomic_load(&churn_limits));
    return 0;
}

/* ---- mlock -------------------------------------------------------------------------------- */

/* This process's locked memory (VmLck), in kB. */
static long locked_kb(void) {
    long kb = status_kb("VmLck");
    if (kb < 0) fail("reading VmLck in /proc/self/status");
    return kb;
}

static int run_mlock(size_t mb) {
    size_t len = mb << 20, blen = 4 << 20;
    if (mlockall(MCL_CURRENT | MCL_FUTURE)) fail("mlockall");
    char *a = filled(mb, 61);
    long locked = locked_kb();
    if (locked <= 0) fail("nothing locked after mlockall");
    char *b = malloc(blen);
    if (!b) fail("malloc");
    if (mlock(b, blen)) fail("mlock");
    fill(b, blen, 62);
    if (!check(a, len, 61)) fail("memory after mlock");
    if (!check(b, blen, 62)) fail("the mlocked buffer");
    if (munlock(b, blen)) fail("munlock");
    free(b);
    if (munlockall()) fail("munlockall");
    fill(a, len, 63);
    if (!check(a, len, 63)) fail("memory rewritten after munlockall");
    free(a);
    printf("mlock ok, locked %ld kB\n", locked);
    return 0;
}

/* ---- wipe-on-fork --------------------------------------------------------------------- */

#define WIPE_PAGES 16

struct wipe_layout {
    char *map;    /* WIPE_PAGES pages, all wiped */
    char *block;  /* WIPE_PAGES pages, first half wiped (KEEPONFORK on the second) */
    char *moved;  /* WIPE_PAGES pages wiped, then moved by mremap */
    char *big;    /* MB of data, never wiped */
    size_t big_len;
};

/* In a fork child: the wiped pages read as zeros and the others as written. */
static void check_wiped(const struct wipe_layout *w, const char *who, uint64_t seed) {
    size_t all = WIPE_PAGES * 4096, half = all / 2;
    if (!all_zero(w->map, all)) { fprintf(stderr, "%s: ", who); fail("wiped mapping not zero"); }
    if (!all_zero(w->block, half)) { fprintf(stderr, "%s: ", who); fail("wiped block half not zero"); }
    if (!check(w->block + half, half, seed + 1)) { fprintf(stderr, "%s: ", who); fail("kept block half"); }
    if (!all_zero(w->moved, all)) { fprintf(stderr, "%s: ", who); fail("moved wiped mapping not zero"); }
    if (!check(w->big, w->big_len, 71)) { fprintf(stderr, "%s: ", who); fail("data beside the wiped pages"); }
}

static void refill_wiped(const struct wipe_layout *w, uint64_t seed) {
    size_t all = WIPE_PAGES * 4096;
    fill(w->map, all, seed);
    fill(w->block, all / 2, seed);
    fill(w->moved, all, seed + 2);
}

static int run_wipe_on_fork(size_t mb) {
    size_t all = WIPE_PAGES * 4096, half = all / 2;
    struct wipe_layout w;
    w.map = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w.map == MAP_FAILED) fail("mmap");
    if (posix_memalign((void **)&w.block, 4096, all)) fail("posix_memalign");
    char *small = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (small == MAP_FAILED) fail("mmap");
    if (madvise(w.map, all, MADV_WIPEONFORK)) fail("madvise WIPEONFORK");
    if (madvise(w.block, all, MADV_WIPEONFORK)) fail("madvise WIPEONFORK block");
    if (madvise(w.block + half, half, MADV_KEEPONFORK)) fail("madvise KEEPONFORK");
    if (madvise(small, all, MADV_WIPEONFORK)) fail("madvise WIPEONFORK small");
    /* Blocks a plain grow in place: the mapping must move, its advice with it. */
    char *after = mmap(small + all, 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    w.moved = mremap(small, all, 2 * all, MREMAP_MAYMOVE);
    if (w.moved == MAP_FAILED) fail("mremap");
    if (after != MAP_FAILED && after != small + all) munmap(after, 4096);
    fill(w.map, all, 72);
    fill(w.block, all, 72);
    fill(w.block + half, half, 73);
    fill(w.moved, all, 74);
    w.big_len = mb << 20;
    w.big = filled(mb, 71); /* pushes most of the above to the memnode */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        check_wiped(&w, "child", 72);
        refill_wiped(&w, 75);
        pid_t grandchild = fork();
        if (grandchild < 0) fail("fork in the child");
        if (grandchild == 0) {
            check_wiped(&w, "grandchild", 72);
            _exit(0);
        }
        wait_ok(grandchild, "the grandchild's checks");
        _exit(0);
    }
    wait_ok(pid, "the child's checks");
    if (!check(w.map, all, 72) || !check(w.block, half, 72) || !check(w.block + half, half, 73) ||
        !check(w.moved, all, 74) || !check(w.big, w.big_len, 71))
        fail("the parent's own data after the fork");
    printf("wipe-on-fork ok\n");
    return 0;
}

/* ---- io_uring ----------------------------------------------------------------------------- */

/* Reads `len` bytes of `fd` into `buf` through a new io_uring instance, the buffer registered
 * first (`fixed`) or not; returns the completion's result. The ring stays open (and the buffer
 * registered) for the rest of the process. */
static int uring_read(int fd, void *buf, size_t len, int fixed) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int ring = (int)syscall(SYS_io_uring_setup, 4, &p);
    if (ring < 0) fail("io_uring_setup");
    struct iovec iov = {buf, len};
    if (fixed && syscall(SYS_io_uring_register, ring, IORING_REGISTER_BUFFERS, &iov, 1) < 0)
        fail("io_uring_register");
    size_t sqsz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cqsz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int shared = MAP_SHARED | MAP_POPULATE, rw = PROT_READ | PROT_WRITE;
    char *sq = mmap(NULL, sqsz, rw, shared, ring, IORING_OFF_SQ_RING);
    char *cq = mmap(NULL, cqsz, rw, shared, ring, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqes =
        mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), rw, shared, ring, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) fail("mapping the ring");
    unsigned *tail = (unsigned *)(sq + p.sq_off.tail);
    unsigned *mask = (unsigned *)(sq + p.sq_off.ring_mask);
    unsigned *array = (unsigned *)(sq + p.sq_off.array);
    memset(&sqes[0], 0, sizeof sqes[0]);
    sqes[0].opcode = fixed ? IORING_OP_READ_FIXED : IORING_OP_READ;
    sqes[0].fd = fd;
    sqes[0].addr = (uint64_t)(uintptr_t)buf;
    sqes[0].len = (unsigned)len;
    array[*tail & *mask] = 0;
    __atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
    if (syscall(SYS_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
        fail("io_uring_enter");
    return ((struct io_uring_cqe *)(cq + p.cq_off.cqes))->res;
}

static int run_uring(size_t mb, int fixed) {
    size_t len = 8 << 20;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, len)) fail("posix_memalign");
    memset(buf, 0xAA, len);
    /* A file of known bytes. */
    char path[] = "/tmp/gleaner-uring-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) fail("mkstemp");
    unlink(path);
    char *data = malloc(len);
    if (!data) fail("malloc");
    fill(data, len, 82);
    if (write(fd, data, len) != (ssize_t)len) fail("write");
    filled(mb, 81); /* pushes the buffer (and the file's bytes) far */
    if (!fixed) {
        if (uring_read(fd, buf, len, 0) != (int)len) fail("io_uring read");
        if (!check(buf, len, 82)) fail("what io_uring read into far memory");
        printf("uring-plain ok\n");
        return 0;
    }
    printf("registered, read %d\n", uring_read(fd, buf, len, 1));
    fflush(stdout);
    sleep(10);
    fprintf(stderr, "preload_program: still running 10 s after registering a buffer\n");
    return 1;
}

/* ---- drop-privileges ------------------------------------------------------------------ */

static int run_drop_privileges(size_t mb) {
    size_t len = mb << 20;
    char *a = filled(mb, 91);
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) fail("becoming nobody");
    if (getuid() != 65534) fail("still root");
    printf("dropped\n");
    fflush(stdout);
    char *b = filled(mb, 92); /* most of `a` goes far now, written back as nobody */
    printf("filled\n");
    fflush(stdout);
    const char *linger = getenv("DROP_PRIVILEGES_LINGER_MS");
    if (linger) usleep((useconds_t)atoi(linger) * 1000);
    if (!check(a, len, 91) || !check(b, len, 92)) fail("memory after dropping privileges");
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) _exit(check(a, len, 91) && check(b, len, 92) ? 0 : 2);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) fail("the child's checks");
    return 0;
}

/* ---- daemon ---------------------------------------------------------------------------- */

/* What setproctitle does (redis, nginx, postgres): copy the environment into the heap (managed
 * memory here) and blank the original strings, which the process title then overwrites (and
 * which /proc/PID/environ reads). */
extern char **environ;
static void move_environment_to_heap(void) {
    size_t n = 0;
    while (environ[n]) n++;
    char **copy = malloc((n + 1) * sizeof *copy);
    if (!copy) fail("malloc");
    for (size_t i = 0; i < n; i++) {
        copy[i] = strdup(environ[i]);
        if (!copy[i]) fail("strdup");
        memset(environ[i], 0, strlen(environ[i]));
    }
    copy[n] = NULL;
    environ = copy;
}

static int run_env_far(size_t mb) {
    move_environment_to_heap();
    size_t len = mb << 20;
    char *a = filled(mb, 71);
    printf("filled\n");
    fflush(stdout);
    for (int pass = 0; pass < 600; pass++) {
        if (!check(a, len, 71)) fail("data");
        usleep(100 * 1000);
    }
    return 0;
}

static int run_daemon(size_t mb, const char *out, int title) {
    if (title) move_environment_to_heap();
    char *warm = filled(4, 61); /* the launcher's own data, which the daemon inherits */
    pid_t parent = getpid();
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid > 0) return 0; /* the launcher leaves at once, as a daemon's does */
    int null = open("/dev/null", O_RDWR);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(3);
    if (setsid() < 0) _exit(3);
    while (getppid() == parent) usleep(10 * 1000);
    usleep(1500 * 1000); /* gleaner looks every second */
    size_t len = mb << 20;
    char *a = filled(mb, 62);
    int ok = check(a, len, 62) && check(warm, 4u << 20, 61);
    long rss = rss_anon_kb();
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f) _exit(4);
    fprintf(f, "rss %ld\n%s\n", rss, ok ? "ok" : "bad");
    fclose(f);
    rename(tmp, out);
    _exit(ok ? 0 : 2);
}

/* ---- exec, thread-exit, sigterm, crash, hog --------------------------------------------- */

static char *filled(size_t mb, uint64_t seed) {
    size_t len = mb << 20;
    char *a = malloc(len);
    if (!a) fail("malloc");
    fill(a, len, seed);
    if (!check(a, len, seed)) fail("fill");
    return a;
}

static int run_exec(size_t mb, const char *self) {
    filled(mb, 21);
    fflush(stdout);
    execl(self, self, "mixed", "8", (char *)NULL);
    fail("execl");
    return 1;
}

/* ---- hint: a runtime prefetch hint through the symbol the preload library exports ----------- */

#include <dlfcn.h>

static int run_hint(size_t mb) {
    int (*hint)(const void *, size_t) =
        (int (*)(const void *, size_t))dlsym(RTLD_DEFAULT, "gleaner_prefetch");
    size_t len = mb << 20, probe = 4u << 20;
    char *a = filled(mb, 41); /* written first: most of it leaves for the memnode ... */
    char *b = filled(mb, 42); /* ... as this one is written */
    if (hint == NULL) {
        printf("hint: no gleaner_prefetch (not under gleaner)\n");
    } else {
        if (hint(a, probe) != 0) fail("gleaner_prefetch refused the heap");
        if (hint((void *)&len, 8) != -1) fail("gleaner_prefetch took a stack address");
        usleep(300 * 1000); /* the hint thread works meanwhile */
    }
    if (!check(a, len, 41) || !check(b, len, 42)) fail("data after the hint");
    printf("hint ok\n");
    return 0;
}

static size_t g_mb;
static char *g_data;

static void *exiter(void *arg) {
    (void)arg;
    if (!check(g_data, g_mb << 20, 31)) fail("data before exit");
    printf("thread-exit ok\n");
    fflush(stdout);
    exit(0);
}

static int run_thread_exit(size_t mb) {
    g_mb = mb;
    g_data = filled(mb, 31);
    pthread_t t;
    if (pthread_create(&t, NULL, exiter, NULL)) fail("pthread_create");
    for (;;) { /* the main thread keeps touching memory until the other thread exits */
        for (size_t i = 0; i < (mb << 20); i += PAGE) ((volatile char *)g_data)[i + 8] = g_data[i + 8];
    }
    return 0;
}

static volatile sig_atomic_t g_term;
static void on_term(int sig) { (void)sig; g_term = 1; }

static int run_sigterm(size_t mb) {
    char *a = filled(mb, 41);
    signal(SIGTERM, on_term);
    printf("ready\n");
    fflush(stdout);
    while (!g_term) pause();
    if (!check(a, mb << 20, 41)) fail("data after SIGTERM");
    return 42;
}

static int run_crash(size_t mb) {
    filled(mb, 51);
    printf("crashing\n");
    fflush(stdout);
    raise(SIGSEGV);
    return 1;
}

static int run_hog(size_t mb) {
    size_t chunk = 1 << 20;
    for (size_t i = 0; i < mb; i++) {
        char *p = malloc(chunk);
        if (!p) {
            fprintf(stderr, "hog: malloc returned NULL after %zu MiB\n", i);
            return 3;
        }
        fill(p, chunk, 60 + i);
    }
    printf("hog: allocated everything (unexpected)\n");
    return 0;
}

/* ---- big: freed big blocks come back for new ones ------------------------------------------- */

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A new big block of `len` bytes filled with `seed`, made one of four ways. */
static void *big_block(size_t len, uint64_t seed, void *old, size_t old_len, uint64_t old_seed) {
    void *p = NULL;
    int how = rnd() % 4;
    if (how != 3 && (rnd() & 1)) {
        /* Freed first: the new block may take the old one's pages. */
        free(old);
        old = NULL;
    }
    switch (how) {
    case 0:
        p = malloc(len);
        break;
    case 1:
        p = calloc(1, len);
        if (p && !all_zero(p, len)) fail("a calloc'd big block does not read as zeros");
        break;
    case 2:
        if (posix_memalign(&p, 1UL << 16, len)) p = NULL;
        if (p && ((uintptr_t)p & 0xffff)) fail("posix_memalign ignored its alignment");
        break;
    default:
        /* Grow or shrink the old block: its first bytes move with it. */
        p = realloc(old, len);
        if (!p) fail("realloc");
        if (!check(p, (old_len < len ? old_len : len) & ~7UL, old_seed))
            fail("realloc lost a big block's data");
        fill(p, len, seed);
        return p;
    }
    if (!p) fail("allocating a big block");
    free(old);
    fill(p, len, seed);
    return p;
}

static int run_big(size_t mb) {
    enum { N = 16 };
    void *blk[N];
    size_t len[N];
    uint64_t seed[N];
    size_t each = (mb << 20) / N;
    uint64_t next_seed = 500;
    for (int i = 0; i < N; i++) {
        len[i] = each;
        seed[i] = next_seed++;
        blk[i] = malloc(each);
        if (!blk[i]) fail("malloc");
        fill(blk[i], each, seed[i]);
    }
    /* Free one block and make another of a similar size, over and over. */
    for (int round = 0; round < 12 * N; round++) {
        int i = rnd() % N;
        size_t n = (each / 2 + rnd() % (each / 2)) & ~7UL;
        uint64_t s = next_seed++;
        blk[i] = big_block(n, s, blk[i], len[i], seed[i]);
        len[i] = n;
        seed[i] = s;
        int j = rnd() % N;
        if (!check(blk[j], len[j], seed[j])) fail("a big block lost its data");
    }
    /* Half of them freed and left alone a while, then as much again in larger blocks. */
    for (int i = 0; i < N / 2; i++) free(blk[i]);
    usleep(300 * 1000);
    for (int i = 0; i < N / 2; i++) {
        len[i] = (each + each / 2) & ~7UL;
        seed[i] = next_seed++;
        blk[i] = malloc(len[i]);
        if (!blk[i]) fail("malloc after the pause");
        fill(blk[i], len[i], seed[i]);
    }
    for (int i = 0; i < N; i++) {
        if (!check(blk[i], len[i], seed[i])) fail("a big block lost its data at the end");
        free(blk[i]);
    }
    printf("big ok\n");
    return 0;
}

/* ---- setgroups: a list the kernel reads on every thread --------------------------------- */

static volatile int g_spin_stop;
static void *spinner(void *arg) {
    (void)arg;
    while (!g_spin_stop) usleep(1000);
    return NULL;
}

static int same_groups(const gid_t *want, int n) {
    gid_t got[64];
    int m = getgroups(64, got);
    if (m != n) return 0;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < m; j++) found |= got[j] == want[i];
        if (!found) return 0;
    }
    return 1;
}

static int run_setgroups(size_t mb) {
    if (geteuid() != 0) {
        printf("setgroups: SKIPPED, not root\n");
        return 2;
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, spinner, NULL)) fail("pthread_create");
    const int n = 5;
    /* In the heap, on pages of its own (a big block), written once, then left alone. */
    gid_t *list = malloc(1 << 20);
    if (!list) fail("malloc");
    for (int i = 0; i < n; i++) list[i] = 100 + i;
    char *a = filled(mb, 81); /* the list's page goes far */
    if (setgroups(n, list)) fail("setgroups");
    if (!same_groups(list, n)) fail("getgroups after setgroups");
    char *b = filled(mb, 82);
    if (initgroups("root", 0)) fail("initgroups");
    gid_t got[64];
    int m = getgroups(64, got);
    int root = 0;
    for (int i = 0; i < m; i++) {
        root |= got[i] == 0;
        if (got[i] >= 100 && got[i] < 100 + (gid_t)n) fail("a group setgroups gave outlived initgroups");
    }
    if (m < 1 || !root) fail("getgroups after initgroups");
    g_spin_stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    if (!check(a, mb << 20, 81) || !check(b, mb << 20, 82)) fail("data after setgroups");
    printf("setgroups ok\n");
    return 0;
}

/* ---- signal-blocked: a signal no thread of the program takes ----------------------------- */

static volatile pid_t g_handled_by;
static char *g_far;
static void on_usr1(int sig) {
    (void)sig;
    g_handled_by = (pid_t)syscall(SYS_gettid);
    g_far[12345] ^= 1; /* the handler touches the program's memory, as handlers do */
}

static int run_signal_blocked(size_t mb) {
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    if (pthread_sigmask(SIG_BLOCK, &usr1, NULL)) fail("pthread_sigmask");
    g_far = filled(mb, 91);
    signal(SIGUSR1, on_usr1);
    char *b = filled(mb, 92); /* g_far goes far */
    if (kill(getpid(), SIGUSR1)) fail("kill");
    usleep(300 * 1000);
    if (g_handled_by != 0) {
        fprintf(stderr, "the handler ran on thread %d while every thread of the program "
                        "blocked the signal\n", (int)g_handled_by);
        fail("a blocked signal was handled");
    }
    if (pthread_sigmask(SIG_UNBLOCK, &usr1, NULL)) fail("pthread_sigmask");
    if (g_handled_by != (pid_t)syscall(SYS_gettid)) fail("the handler ran on another thread");
    g_far[12345] ^= 1;
    if (!check(g_far, mb << 20, 91) || !check(b, mb << 20, 92)) fail("data after the signal");
    printf("signal-blocked ok\n");
    return 0;
}

/* ---- low-limit: a program started under a low descriptor limit ---------------------------- */

#include <sys/resource.h>

static int run_low_limit(size_t mb, const char *self) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim)) fail("getrlimit");
    lim.rlim_cur = 29;
    if (setrlimit(RLIMIT_NOFILE, &lim)) fail("setrlimit");
    char arg[32];
    snprintf(arg, sizeof arg, "%zu", mb);
    fflush(stdout);
    execl(self, self, "count-fds", arg, (char *)NULL);
    fail("execl");
    return 1;
}

static int run_count_fds(size_t mb) {
    int below = 0;
    for (int fd = 0; fd < 29; fd++)
        if (fcntl(fd, F_GETFD) >= 0) below++;
    int opened = 0;
    while (open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) opened++;
    if (errno != EMFILE) fail("open stopped short of the descriptor limit");
    printf("below %d opened %d\n", below, opened);
    char *a = filled(mb, 101); /* at the limit, with every number taken */
    if (!check(a, mb << 20, 101)) fail("data at the descriptor limit");
    printf("count-fds ok\n");
    return 0;
}

/* ---- fork-libc-state: what the C library's fork itself touches ------------------------------ */

#include <pwd.h>

static int run_fork_libc_state(size_t mb, const char *path) {
    if (!getpwuid(0)) fail("getpwuid"); /* the name service's state now exists, in the heap */
    FILE *f = fopen(path, "w");
    if (!f) fail("fopen");
    if (fprintf(f, "before the fork\n") < 0) fail("fprintf"); /* left in the FILE's buffer */
    char *a = filled(mb, 111); /* both go far */
    char *b = filled(mb, 112);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        if (fprintf(f, "the child\n") < 0 || fflush(f)) _exit(2);
        if (!getpwuid(0)) _exit(3);
        if (!check(a, mb << 20, 111)) _exit(4);
        _exit(0);
    }
    wait_ok(pid, "the fork child's checks");
    if (fprintf(f, "the parent\n") < 0 || fclose(f)) fail("the parent's write");
    if (!getpwuid(0)) fail("getpwuid after the fork");
    FILE *r = fopen(path, "r");
    if (!r) fail("fopen to read");
    char text[256] = {0};
    size_t n = fread(text, 1, sizeof text - 1, r);
    fclose(r);
    const char *want = "before the fork\nthe child\nbefore the fork\nthe parent\n";
    if (n != strlen(want) || strcmp(text, want)) {
        fprintf(stderr, "%s holds:\n%s", path, text);
        fail("the file's contents");
    }
    if (!check(a, mb << 20, 111) || !check(b, mb << 20, 112)) fail("data after the fork");
    printf("fork-libc-state ok\n");
    return 0;
}

/* ---- dlopen-tls: the dynamic linker's records in the program's heap ------------------------ */

#define MAX_TLS_MODULES 256
static long (*g_bump[MAX_TLS_MODULES + 1])(long);
static int g_modules;

static void load_tls_module(const char *dir, int i) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tls_%d.so", dir, i);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        fail("dlopen");
    }
    g_bump[g_modules] = (long (*)(long))dlsym(h, "tls_bump");
    if (!g_bump[g_modules]) fail("dlsym tls_bump");
    g_modules++;
}

/* A new thread's counters start at zero in every module, and are its own. */
static void *use_every_module(void *arg) {
    (void)arg;
    for (int i = 0; i < g_modules; i++)
        if (g_bump[i](i + 1) != i + 1 || g_bump[i](1) != i + 2) return (void *)1;
    return NULL;
}

static void thread_using_every_module(const char *who) {
    pthread_t t;
    void *bad;
    if (pthread_create(&t, NULL, use_every_module, NULL)) fail("pthread_create");
    if (pthread_join(t, &bad)) fail("pthread_join");
    if (bad) {
        fprintf(stderr, "%s: a new thread's thread-local storage was not its own\n", who);
        fail("thread-local storage");
    }
}

static int run_dlopen_tls(size_t mb, const char *dir, int n) {
    if (n < 1 || n >= MAX_TLS_MODULES) fail("module count");
    for (int i = 0; i < n; i++) load_tls_module(dir, i);
    char *a = filled(mb, 71); /* the records made above go far */
    thread_using_every_module("parent");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        thread_using_every_module("child");
        char *b = filled(mb, 72);
        if (!check(a, mb << 20, 71)) _exit(2);
        fflush(stdout);
        pid_t grandchild = fork();
        if (grandchild < 0) _exit(3);
        if (grandchild == 0) {
            thread_using_every_module("grandchild");
            _exit(check(b, mb << 20, 72) ? 0 : 4);
        }
        int st;
        if (waitpid(grandchild, &st, 0) != grandchild || !WIFEXITED(st) || WEXITSTATUS(st))
            _exit(5);
        _exit(0);
    }
    wait_ok(pid, "the fork child's checks");
    /* One more module after the others went far: every thread's next use of thread-local
     * storage (the pager's own included) brings its records up to date. */
    load_tls_module(dir, n);
    char *c = filled(mb, 73);
    thread_using_every_module("parent, after one more module");
    if (!check(a, mb << 20, 71) || !check(c, mb << 20, 73)) fail("data after the last module");
    printf("dlopen-tls ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s mixed|small|fork|exec|hint|thread-exit|sigterm|crash|hog MB\n",
                argv[0]);
        return 64;
    }
    size_t mb = strtoul(argv[2], NULL, 10);
    if (!strcmp(argv[1], "mixed")) return run_mixed(mb);
    if (!strcmp(argv[1], "small")) return run_small(mb);
    if (!strcmp(argv[1], "fork")) return run_fork(mb);
    if (!strcmp(argv[1], "exec")) return run_exec(mb, "/proc/self/exe");
    if (!strcmp(argv[1], "hint")) return run_hint(mb);
    if (!strcmp(argv[1], "thread-exit")) return run_thread_exit(mb);
    if (!strcmp(argv[1], "sigterm")) return run_sigterm(mb);
    if (!strcmp(argv[1], "crash")) return run_crash(mb);
    if (!strcmp(argv[1], "hog")) return run_hog(mb);
    if (!strcmp(argv[1], "big")) return run_big(mb);
    if (!strcmp(argv[1], "close-all")) return run_close_all(mb);
    if (!strcmp(argv[1], "fd-limit")) return run_fd_limit(mb);
    if (!strcmp(argv[1], "swap-fds")) return run_swap_fds(mb);
    if (!strcmp(argv[1], "fd-churn")) return run_fd_churn(mb);
    if (!strcmp(argv[1], "mlock")) return run_mlock(mb);
    if (!strcmp(argv[1], "wipe-on-fork")) return run_wipe_on_fork(mb);
    if (!strcmp(argv[1], "uring-plain")) return run_uring(mb, 0);
    if (!strcmp(argv[1], "drop-privileges")) return run_drop_privileges(mb);
    if (!strcmp(argv[1], "uring-fixed")) return run_uring(mb, 1);
    if (!strcmp(argv[1], "daemon") && argc > 3)
        return run_daemon(mb, argv[3], argc > 4 && !strcmp(argv[4], "title"));
    if (!strcmp(argv[1], "env-far")) return run_env_far(mb);
    if (!strcmp(argv[1], "setgroups")) return run_setgroups(mb);
    if (!strcmp(argv[1], "signal-blocked")) return run_signal_blocked(mb);
    if (!strcmp(argv[1], "low-limit")) return run_low_limit(mb, "/proc/self/exe");
    if (!strcmp(argv[1], "count-fds")) return run_count_fds(mb);
    if (!strcmp(argv[1], "fork-libc-state") && argc > 3) return run_fork_libc_state(mb, argv[3]);
    if (!strcmp(argv[1], "dlopen-tls") && argc > 4) return run_dlopen_tls(mb, argv[3], atoi(argv[4]));
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 64;
}

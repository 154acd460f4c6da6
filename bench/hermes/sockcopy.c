// bench/hermes/sockcopy.c: the kernel's socket copies into and out of malloc'd 200 KiB blocks,
// as redis makes them for a 200 KiB SET and GET, without redis: a peer thread (two page-aligned
// buffers allocated before the measured part) sends a value over TCP
// loopback; the main thread receives it into a fresh malloc'd block (_copy_to_iter), keeps it in
// one of `live` slots (freeing the one it replaces), copies a stored value into another fresh
// block (the reply) and sends that back (_copy_from_iter), then frees the reply.
// Prints one line: ns per round trip (median and p99 over rounds), page faults. A fourth
// argument adds that many bytes to each block (-1: page-aligned blocks from aligned_alloc).
// Build: gcc -O2 -pthread -o sockcopy bench/hermes/sockcopy.c
// Run:   taskset -c 0 ./sockcopy 204800 4000 250 [OFFSET]   (under `gleaner run --far off
//        --latency-critical -q --`, or with LD_PRELOAD=libjemalloc.so.2, or alone)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static size_t S;
static long N;
static int peer_fd;
static char *psrc, *pdst;

static void all(int fd, char *b, size_t n, int snd) {
    while (n) {
        ssize_t r = snd ? send(fd, b, n, 0) : recv(fd, b, n, 0);
        if (r <= 0) { perror(snd ? "send" : "recv"); exit(1); }
        b += r; n -= (size_t)r;
    }
}
static void *peer(void *arg) {
    (void)arg;
    for (long i = 0; i < N; i++) { all(peer_fd, psrc, S, 1); all(peer_fd, pdst, S, 0); }
    return NULL;
}
static long ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }
static int cmp(const void *a, const void *b) { long x = *(long *)a, y = *(long *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    S = argc > 1 ? strtoul(argv[1], 0, 0) : 204800;
    N = argc > 2 ? atol(argv[2]) : 4000;
    int live = argc > 3 ? atoi(argv[3]) : 250;
    long off = argc > 4 ? atol(argv[4]) : 0;   // bytes added to each block's address (-1: page-aligned blocks)
    psrc = aligned_alloc(4096, S); pdst = aligned_alloc(4096, S);   // before the measured part
    memset(psrc, 'v', S); memset(pdst, 0, S);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1)) { perror("bind"); return 1; }
    socklen_t al = sizeof a; getsockname(ls, (void *)&a, &al);
    peer_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(peer_fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }
    int fd = accept(ls, 0, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(peer_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char **slot = calloc(live, sizeof *slot);
    long *t = malloc(N * sizeof *t);
    struct rusage r0, r1; getrusage(RUSAGE_SELF, &r0);
    pthread_t th; pthread_create(&th, 0, peer, 0);
    long start = ns();
    for (long i = 0; i < N; i++) {
        long t0 = ns();
        char *q = off < 0 ? aligned_alloc(4096, S) : (char *)malloc(S + off) + off;                 // the query buffer: the value lands here
        all(fd, q, S, 0);
        int k = i % live;
        if (slot[k]) free(off > 0 ? slot[k] - off : slot[k]);  // the value it replaces
        slot[k] = q;                                            // stored
        char *reply = off < 0 ? aligned_alloc(4096, S) : (char *)malloc(S + off) + off;             // the reply block
        memcpy(reply, slot[(i * 7919) % live] ? slot[(i * 7919) % live] : q, S);
        all(fd, reply, S, 1);
        free(off > 0 ? reply - off : reply);
        t[i] = ns() - t0;
    }
    long total = ns() - start;
    pthread_join(th, 0);
    getrusage(RUSAGE_SELF, &r1);
    qsort(t, N, sizeof *t, cmp);
    printf("{\"size\": %zu, \"rounds\": %ld, \"mean_ns\": %ld, \"p50_ns\": %ld, \"p99_ns\": %ld, "
           "\"minflt\": %ld, \"majflt\": %ld}\n", S, N, total / N, t[N / 2], t[N * 99 / 100],
           r1.ru_minflt - r0.ru_minflt, r1.ru_majflt - r0.ru_majflt);
    return 0;
}

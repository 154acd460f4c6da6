/*
 * mcload: a memcached load generator for the gleaner benchmark harness (text protocol).
 *
 *   mcload load   HOST PORT NKEYS VSIZE                 set keys 0..NKEYS-1 (pipelined)
 *   mcload verify HOST PORT NKEYS VSIZE STRIDE          get every STRIDE-th key, compare values
 *   mcload open   HOST PORT NKEYS VSIZE RATE SECS GETPCT ZIPF_S CONNS SEED
 *                 open loop: request i is due at start + i/RATE, sent then whatever the answers
 *                 do; its latency runs from that scheduled time to its complete answer, so a
 *                 stalled server is charged for every request queued behind the stall; answers
 *                 still missing 10 s after the last send are counted as unanswered; SIGUSR1
 *                 ends the phase early (no request is issued after it; answers are awaited
 *                 as at the end), so a phase can last exactly as long as something else runs
 *   mcload closed HOST PORT NKEYS VSIZE SECS GETPCT ZIPF_S CONNS DEPTH SEED
 *                 closed loop: DEPTH requests outstanding per connection, for maximum throughput
 *
 * Keys are "k%08u"; the value of key k is VSIZE pseudo-random letters determined by k alone, so
 * every GET answer is checked in full (a SET writes the same value again). Key popularity is Zipf
 * (exponent ZIPF_S) over ranks, ranks scattered over the key space by a fixed permutation so the
 * popular keys are not the first ones loaded. Prints one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXCONN 64
#define KEYLEN 9 /* "k" + 8 digits */

enum { M_LOAD, M_VERIFY, M_OPEN, M_CLOSED };

typedef struct {
    uint32_t key;
    uint8_t is_get;
    uint64_t sched_ns;
} req_t;

typedef struct {
    int fd;
    char *out;
    size_t out_len, out_cap, out_off;
    char *in;
    size_t in_len, in_cap;
    req_t *q; /* ring of outstanding requests */
    size_t q_head, q_len, q_cap;
} conn_t;

static uint32_t nkeys, vsize;
static double *zipf_cdf;
static uint64_t perm_mul, perm_add;
static uint64_t rng_state;
static char *scratch;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(void) { return (splitmix(&rng_state) >> 11) * (1.0 / 9007199254740992.0); }

static void value_of(uint32_t key, char *buf) {
    uint64_t s = 0x5eed0000ull ^ ((uint64_t)key * 0x100000001b3ull);
    uint32_t i = 0;
    while (i < vsize) {
        uint64_t r = splitmix(&s);
        for (int b = 0; b < 8 && i < vsize; b++, r >>= 8) buf[i++] = 'a' + (char)((r & 0xff) % 26);
    }
}

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void zipf_init(double s) {
    zipf_cdf = malloc(sizeof(double) * nkeys);
    double sum = 0;
    for (uint32_t r = 0; r < nkeys; r++) {
        sum += 1.0 / pow((double)r + 1.0, s);
        zipf_cdf[r] = sum;
    }
    for (uint32_t r = 0; r < nkeys; r++) zipf_cdf[r] /= sum;
    perm_mul = 2654435761ull % nkeys;
    if (perm_mul == 0) perm_mul = 1;
    while (gcd(perm_mul, nkeys) != 1) perm_mul++;
    perm_add = 40503ull % nkeys;
}

static uint32_t zipf_key(void) {
    double u = uniform();
    uint32_t lo = 0, hi = nkeys - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (zipf_cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint32_t)(((uint64_t)lo * perm_mul + perm_add) % nkeys);
}

static void die(const char *what) {
    fprintf(stderr, "mcload: %s: %s\n", what, strerror(errno));
    exit(2);
}

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) {
        fprintf(stderr, "mcload: cannot resolve %s:%s\n", host, port);
        exit(2);
    }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) die("connect");
    freeaddrinfo(res);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 65536;
    while (c < need) c *= 2;
    *buf = realloc(*buf, c);
    if (!*buf) die("realloc");
    *cap = c;
}

static void enqueue(conn_t *c, uint32_t key, int is_get, uint64_t sched) {
    if (c->q_len == c->q_cap) {
        size_t nc = c->q_cap ? c->q_cap * 2 : 1024;
        req_t *nq = malloc(sizeof(req_t) * nc);
        for (size_t i = 0; i < c->q_len; i++) nq[i] = c->q[(c->q_head + i) % c->q_cap];
        free(c->q);
        c->q = nq;
        c->q_head = 0;
        c->q_cap = nc;
    }
    c->q[(c->q_head + c->q_len) % c->q_cap] = (req_t){key, (uint8_t)is_get, sched};
    c->q_len++;
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (is_get) {
        reserve(&c->out, &c->out_cap, c->out_len + 32);
        c->out_len += (size_t)sprintf(c->out + c->out_len, "get k%08u\r\n", key);
    } else {
        reserve(&c->out, &c->out_cap, c->out_len + 64 + vsize);
        c->out_len += (size_t)sprintf(c->out + c->out_len, "set k%08u 0 0 %u\r\n", key, vsize);
        value_of(key, c->out + c->out_len);
        c->out_len += vsize;
        memcpy(c->out + c->out_len, "\r\n", 2);
        c->out_len += 2;
    }
}

/* Results. */
static uint64_t n_sent, n_done, n_get, n_set, n_hit, n_miss, n_bad, n_err;
static uint32_t *lat_us;
static size_t lat_len, lat_cap;
static uint64_t max_lag_ns;

static void record(uint64_t ns) {
    if (lat_len == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 1 << 16;
        lat_us = realloc(lat_us, sizeof(uint32_t) * lat_cap);
    }
    uint64_t us = ns / 1000;
    lat_us[lat_len++] = us > 0xffffffffu ? 0xffffffffu : (uint32_t)us;
}

static char *find_crlf(char *p, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n') return p + i;
    return NULL;
}

/* Parses complete answers at the front of c->in; returns how many were consumed. */
static int parse(conn_t *c, uint64_t t) {
    int got = 0;
    size_t off = 0;
    while (c->q_len > 0) {
        char *p = c->in + off;
        size_t n = c->in_len - off;
        char *eol = find_crlf(p, n);
        if (!eol) break;
        req_t *r = &c->q[c->q_head];
        size_t used;
        if (r->is_get && n >= 6 && memcmp(p, "VALUE ", 6) == 0) {
            unsigned flags, len;
            char k[64];
            if (sscanf(p, "VALUE %63s %u %u", k, &flags, &len) != 3) {
                n_err++;
                used = (size_t)(eol - p) + 2;
            } else {
                size_t hdr = (size_t)(eol - p) + 2;
                if (n < hdr + len + 2 + 5) break;
                value_of(r->key, scratch);
                char want[16];
                snprintf(want, sizeof want, "k%08u", r->key);
                if (len != vsize || strcmp(k, want) != 0 || memcmp(p + hdr, scratch, vsize) != 0 ||
                    memcmp(p + hdr + len, "\r\nEND\r\n", 7) != 0)
                    n_bad++;
                else
                    n_hit++;
                used = hdr + len + 2 + 5;
            }
        } else if (r->is_get && (size_t)(eol - p) == 3 && memcmp(p, "END", 3) == 0) {
            n_miss++;
            used = 5;
        } else if (!r->is_get && (size_t)(eol - p) == 6 && memcmp(p, "STORED", 6) == 0) {
            used = 8;
        } else {
            if (n_err < 5) fprintf(stderr, "mcload: unexpected answer: %.*s\n", (int)(eol - p), p);
            n_err++;
            used = (size_t)(eol - p) + 2;
        }
        off += used;
        record(t - r->sched_ns);
        c->q_head = (c->q_head + 1) % c->q_cap;
        c->q_len--;
        n_done++;
        got++;
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    return got;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p) {
    if (lat_len == 0) return 0;
    size_t i = (size_t)ceil(p / 100.0 * (double)lat_len);
    if (i == 0) i = 1;
    if (i > lat_len) i = lat_len;
    return lat_us[i - 1];
}

/* Set by SIGUSR1: issue nothing more (see the open mode above). */
static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop; /* no SA_RESTART: ppoll returns EINTR at once */
    sigaction(SIGUSR1, &sa, NULL);
    if (argc < 6) {
        fprintf(stderr, "usage: see the comment at the top of mcload.c\n");
        return 2;
    }
    const char *mode_s = argv[1], *host = argv[2], *port = argv[3];
    nkeys = (uint32_t)strtoul(argv[4], 0, 10);
    vsize = (uint32_t)strtoul(argv[5], 0, 10);
    int mode, conns = 1, depth = 64;
    double rate = 0, secs = 0, getpct = 100, zs = 0.99;
    uint32_t stride = 1;
    uint64_t seed = 1;
    if (!strcmp(mode_s, "load")) {
        mode = M_LOAD;
    } else if (!strcmp(mode_s, "verify") && argc >= 7) {
        mode = M_VERIFY;
        stride = (uint32_t)strtoul(argv[6], 0, 10);
        if (!stride) stride = 1;
    } else if (!strcmp(mode_s, "open") && argc >= 12) {
        mode = M_OPEN;
        rate = atof(argv[6]);
        secs = atof(argv[7]);
        getpct = atof(argv[8]);
        zs = atof(argv[9]);
        conns = atoi(argv[10]);
        seed = strtoull(argv[11], 0, 10);
    } else if (!strcmp(mode_s, "closed") && argc >= 12) {
        mode = M_CLOSED;
        secs = atof(argv[6]);
        getpct = atof(argv[7]);
        zs = atof(argv[8]);
        conns = atoi(argv[9]);
        depth = atoi(argv[10]);
        seed = strtoull(argv[11], 0, 10);
    } else {
        fprintf(stderr, "usage: see the comment at the top of mcload.c\n");
        return 2;
    }
    if (nkeys == 0 || vsize == 0 || conns < 1 || conns > MAXCONN) {
        fprintf(stderr, "mcload: bad arguments\n");
        return 2;
    }
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    scratch = malloc(vsize + 8);
    if (mode == M_OPEN || mode == M_CLOSED) zipf_init(zs);
    if (mode == M_LOAD || mode == M_VERIFY) depth = 64;

    conn_t cs[MAXCONN];
    memset(cs, 0, sizeof cs);
    struct pollfd pfd[MAXCONN];
    for (int i = 0; i < conns; i++) {
        cs[i].fd = connect_to(host, port);
        pfd[i].fd = cs[i].fd;
    }

    uint64_t total; /* requests to issue; UINT64_MAX = until the deadline */
    if (mode == M_LOAD)
        total = nkeys;
    else if (mode == M_VERIFY)
        total = (nkeys + stride - 1) / stride;
    else if (mode == M_OPEN)
        total = (uint64_t)(rate * secs);
    else
        total = UINT64_MAX;
    double drain_s = 10.0;
    uint64_t start = now_ns();
    uint64_t deadline = mode == M_CLOSED ? start + (uint64_t)(secs * 1e9) : UINT64_MAX;
    uint64_t issued = 0, stop_at = 0;
    int rr = 0;

    for (;;) {
        uint64_t t = now_ns();
        if (stop_requested && total > issued) total = issued;
        int issuing = issued < total && t < deadline;
        if (issuing) {
            if (mode == M_OPEN) {
                for (;;) {
                    if (issued >= total) break;
                    uint64_t sched = start + (uint64_t)((double)issued * 1e9 / rate);
                    if (sched > t) break;
                    if (t - sched > max_lag_ns) max_lag_ns = t - sched;
                    int g = uniform() * 100.0 < getpct;
                    conn_t *c = &cs[rr];
                    rr = (rr + 1) % conns;
                    enqueue(c, zipf_key(), g, sched);
                    issued++;
                    n_sent++;
                    g ? n_get++ : n_set++;
                }
            } else {
                for (int i = 0; i < conns && issued < total; i++) {
                    conn_t *c = &cs[i];
                    while (c->q_len < (size_t)depth && issued < total) {
                        uint32_t key;
                        int g;
                        if (mode == M_LOAD) {
                            key = (uint32_t)issued;
                            g = 0;
                        } else if (mode == M_VERIFY) {
                            key = (uint32_t)(issued * stride);
                            g = 1;
                        } else {
                            key = zipf_key();
                            g = uniform() * 100.0 < getpct;
                        }
                        enqueue(c, key, g, t);
                        issued++;
                        n_sent++;
                        g ? n_get++ : n_set++;
                    }
                }
            }
        }
        size_t outstanding = 0;
        for (int i = 0; i < conns; i++) outstanding += cs[i].q_len;
        if (!(issued < total && t < deadline)) {
            if (!stop_at) stop_at = t;
            if (mode == M_CLOSED) break; /* answers still in flight are not counted */
            if (outstanding == 0) break;
            if (t - stop_at > (uint64_t)(drain_s * 1e9)) break;
        }
        /* Write what can be written. */
        for (int i = 0; i < conns; i++) {
            conn_t *c = &cs[i];
            while (c->out_off < c->out_len) {
                ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
                if (w < 0) {
                    if (errno == EAGAIN || errno == EINTR) break;
                    die("write");
                }
                c->out_off += (size_t)w;
            }
            pfd[i].events = POLLIN | (c->out_off < c->out_len ? POLLOUT : 0);
        }
        /* Wait until the next scheduled send, or an answer. */
        struct timespec to = {0, 1000000};
        if (mode == M_OPEN && issued < total) {
            uint64_t next = start + (uint64_t)((double)issued * 1e9 / rate);
            uint64_t t2 = now_ns();
            uint64_t d = next > t2 ? next - t2 : 0;
            to.tv_sec = (time_t)(d / 1000000000ull);
            to.tv_nsec = (long)(d % 1000000000ull);
        }
        int pr = ppoll(pfd, (nfds_t)conns, &to, NULL);
        if (pr < 0 && errno != EINTR) die("ppoll");
        if (pr <= 0) continue;
        for (int i = 0; i < conns; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLERR | POLLHUP))) continue;
            conn_t *c = &cs[i];
            for (;;) {
                reserve(&c->in, &c->in_cap, c->in_len + 65536);
                ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
                if (r < 0) {
                    if (errno == EAGAIN || errno == EINTR) break;
                    die("read");
                }
                if (r == 0) {
                    fprintf(stderr, "mcload: server closed the connection\n");
                    goto done;
                }
                c->in_len += (size_t)r;
                parse(c, now_ns());
            }
        }
    }
done:;
    uint64_t end = now_ns();
    uint64_t timeouts = 0;
    for (int i = 0; i < conns; i++) timeouts += cs[i].q_len;
    if (mode == M_CLOSED) timeouts = 0;
    double elapsed = (double)((stop_at ? stop_at : end) - start) / 1e9;
    double wall = (double)(end - start) / 1e9;
    qsort(lat_us, lat_len, sizeof(uint32_t), cmp_u32);
    double mean = 0;
    for (size_t i = 0; i < lat_len; i++) mean += lat_us[i];
    if (lat_len) mean /= (double)lat_len;
    printf("{\"mode\":\"%s\",\"nkeys\":%u,\"value_size\":%u,\"conns\":%d,\"offered_rps\":%.1f,"
           "\"get_pct\":%.1f,\"zipf_s\":%.3f,\"seconds\":%.3f,\"wall_seconds\":%.3f,"
           "\"sent\":%llu,\"completed\":%llu,\"gets\":%llu,\"sets\":%llu,\"hits\":%llu,"
           "\"misses\":%llu,\"mismatches\":%llu,\"errors\":%llu,\"unanswered\":%llu,"
           "\"throughput_rps\":%.1f,\"max_send_lag_us\":%.1f,"
           "\"latency_us\":{\"p50\":%.0f,\"p90\":%.0f,\"p99\":%.0f,\"p999\":%.0f,\"max\":%.0f,"
           "\"mean\":%.1f}}\n",
           mode_s, nkeys, vsize, conns, rate, getpct, zs, elapsed, wall,
           (unsigned long long)n_sent, (unsigned long long)n_done, (unsigned long long)n_get,
           (unsigned long long)n_set, (unsigned long long)n_hit, (unsigned long long)n_miss,
           (unsigned long long)n_bad, (unsigned long long)n_err, (unsigned long long)timeouts,
           (double)n_done / (mode == M_OPEN ? wall : elapsed), (double)max_lag_ns / 1e3,
           pct(50), pct(90), pct(99), pct(99.9), lat_len ? (double)lat_us[lat_len - 1] : 0.0,
           mean);
    return (n_bad || n_err) ? 1 : 0;
}

/* RocksDB put/get latency (Hermes, Middleware'21, section 5.3) on librocksdb's C API.
 *
 * usage: rocksdb_latency DBDIR N_SMALL N_LARGE [SAMPLES_FILE]
 *
 * Opens (creates) a database in DBDIR and, in rounds, puts one 1 KiB record ("s<i>") and, every
 * N_SMALL / N_LARGE rounds, one 200 KiB record ("l<j>"), each with contents derived from its key;
 * then gets every record back in a scrambled order and compares it byte for byte with what was
 * put. Each put and get is timed (CLOCK_MONOTONIC). Prints one JSON object: for each of put_1k,
 * get_1k, put_200k, get_200k its count, mean, p50, p90, p99 and max (ns), and "verified" (records
 * read back equal). With SAMPLES_FILE, also writes every latency there, one line per class:
 * "CLASS NS NS ...". Any error, a missing record or a record that differs ends it with status 1
 * and a message naming the key: a wrong read is never reported as a latency. With the variable
 * ROCKSDB_LATENCY_STATS=FILE, RocksDB's own statistics ("rocksdb.stats": flushes, compactions,
 * write stalls) are written to FILE at the end. */
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "latency.h"

#define SMALL 1024
#define LARGE (200 * 1024)

enum { PUT_1K, GET_1K, PUT_200K, GET_200K, CLASSES };
static const char *NAMES[CLASSES] = {"put_1k", "get_1k", "put_200k", "get_200k"};

struct samples {
    double *ns;
    size_t n;
};

static void die(const char *what, const char *key, char *err) {
    fprintf(stderr, "rocksdb_latency: %s %s: %s\n", what, key, err ? err : "(no error text)");
    exit(1);
}

/* The record for `key`: a xorshift stream seeded by the key's bytes, so every record differs. */
static void fill(char *buf, size_t len, const char *key) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (const char *p = key; *p; p++) x = (x ^ (unsigned char)*p) * 0x100000001b3ull;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (char)(x >> 24);
    }
}

static void put(rocksdb_t *db, rocksdb_writeoptions_t *wo, const char *key, char *buf, size_t len,
                struct samples *s) {
    fill(buf, len, key);
    char *err = NULL;
    double t0 = now_ns();
    rocksdb_put(db, wo, key, strlen(key), buf, len, &err);
    s->ns[s->n++] = now_ns() - t0;
    if (err) die("put", key, err);
}

static void get(rocksdb_t *db, rocksdb_readoptions_t *ro, const char *key, char *want, size_t len,
                struct samples *s) {
    char *err = NULL;
    size_t got_len = 0;
    double t0 = now_ns();
    char *got = rocksdb_get(db, ro, key, strlen(key), &got_len, &err);
    s->ns[s->n++] = now_ns() - t0;
    if (err) die("get", key, err);
    if (!got) die("get", key, "the record is missing");
    fill(want, len, key);
    if (got_len != len || memcmp(got, want, len) != 0) {
        fprintf(stderr, "rocksdb_latency: get %s: %zu bytes read back differ from the %zu put\n",
                key, got_len, len);
        exit(1);
    }
    rocksdb_free(got);
}

static void report(FILE *out, const char *name, struct samples *s, int last) {
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->ns[i];
    double *v = malloc(s->n * sizeof(double) + 1);
    memcpy(v, s->ns, s->n * sizeof(double));
    qsort(v, s->n, sizeof(double), cmp);
#define PCT(p) (s->n ? v[(size_t)((s->n - 1) * (p))] : 0.0)
    fprintf(out, "\"%s\": {\"count\": %zu, \"mean_ns\": %.0f, \"p50_ns\": %.0f, \"p90_ns\": %.0f, "
                 "\"p99_ns\": %.0f, \"max_ns\": %.0f}%s",
            name, s->n, s->n ? sum / s->n : 0.0, PCT(0.5), PCT(0.9), PCT(0.99),
            s->n ? v[s->n - 1] : 0.0, last ? "" : ", ");
    free(v);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DBDIR N_SMALL N_LARGE [SAMPLES_FILE]\n", argv[0]);
        return 2;
    }
    long n_small = atol(argv[2]), n_large = atol(argv[3]);
    if (n_small < 1 || n_large < 0) {
        fprintf(stderr, "rocksdb_latency: N_SMALL must be at least 1, N_LARGE at least 0\n");
        return 2;
    }
    rocksdb_options_t *opt = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(opt, 1);
    char *err = NULL;
    rocksdb_t *db = rocksdb_open(opt, argv[1], &err);
    if (err) die("open", argv[1], err);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();

    struct samples s[CLASSES];
    s[PUT_1K].ns = malloc(n_small * sizeof(double));
    s[GET_1K].ns = malloc(n_small * sizeof(double));
    s[PUT_200K].ns = malloc((n_large + 1) * sizeof(double));
    s[GET_200K].ns = malloc((n_large + 1) * sizeof(double));
    for (int c = 0; c < CLASSES; c++) s[c].n = 0;
    char *buf = malloc(LARGE), *want = malloc(LARGE);
    char key[32];

    long every = n_large ? (n_small + n_large - 1) / n_large : 0, large = 0;
    for (long i = 0; i < n_small; i++) {
        snprintf(key, sizeof key, "s%ld", i);
        put(db, wo, key, buf, SMALL, &s[PUT_1K]);
        if (every && i % every == 0 && large < n_large) {
            snprintf(key, sizeof key, "l%ld", large++);
            put(db, wo, key, buf, LARGE, &s[PUT_200K]);
        }
    }
    /* Read back in a scrambled order (a stride coprime with the count). */
    long stride = 7919;
    while (n_small % stride == 0) stride++;
    for (long k = 0; k < n_small; k++) {
        snprintf(key, sizeof key, "s%ld", (k * stride) % n_small);
        get(db, ro, key, want, SMALL, &s[GET_1K]);
    }
    for (long j = 0; j < large; j++) {
        snprintf(key, sizeof key, "l%ld", large - 1 - j); /* newest last-written first */
        get(db, ro, key, want, LARGE, &s[GET_200K]);
    }

    if (argc > 4) {
        FILE *f = fopen(argv[4], "w");
        if (!f) {
            perror(argv[4]);
            return 1;
        }
        for (int c = 0; c < CLASSES; c++) {
            fprintf(f, "%s", NAMES[c]);
            for (size_t i = 0; i < s[c].n; i++) fprintf(f, " %.0f", s[c].ns[i]);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    const char *stats_file = getenv("ROCKSDB_LATENCY_STATS");
    if (stats_file && *stats_file) {
        char *text = rocksdb_property_value(db, "rocksdb.stats");
        FILE *f = fopen(stats_file, "w");
        if (!f) {
            perror(stats_file);
            return 1;
        }
        fputs(text ? text : "(no rocksdb.stats)\n", f);
        fclose(f);
        rocksdb_free(text);
    }
    printf("{");
    for (int c = 0; c < CLASSES; c++) report(stdout, NAMES[c], &s[c], 0);
    printf("\"verified\": %zu}\n", s[GET_1K].n + s[GET_200K].n);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(opt);
    return 0;
}

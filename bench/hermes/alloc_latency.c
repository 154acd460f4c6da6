/* malloc + first touch latency (Hermes, Middleware'21, section 5.2): allocate blocks of SIZE
 * bytes until TOTAL bytes are allocated, writing one byte per page of each block (its first
 * touch), and time each malloc plus its touches. THINK_US between allocations stands for the
 * service's own work between requests. Prints one JSON object: mean, p50, p90, p99, max (ns).
 * With ALLOC_LATENCY_RAW=FILE set, each request's latency (ns) is also written to FILE, one a
 * line in request order (to see which requests are slow: the first ones, or spread out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "latency.h"
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s SIZE TOTAL THINK_US\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], 0, 10), total = strtoull(argv[2], 0, 10);
    int think = atoi(argv[3]);
    size_t n = total / size;
    double *lat = malloc(n * sizeof(double));
    char **blocks = malloc(n * sizeof(char *));
    if (!lat || !blocks) return 1;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        double t = now_ns();
        char *p = malloc(size);
        if (!p) { fprintf(stderr, "malloc failed at %zu\n", i); return 1; }
        for (size_t j = 0; j < size; j += 4096) p[j] = (char)i;
        p[size - 1] = (char)i;
        lat[i] = now_ns() - t;
        sum += lat[i];
        blocks[i] = p;
        if (think) {
            /* busy think time: a sleeping thread would hand its CPU to the reserve's thread */
            double until = now_ns() + think * 1000.0;
            while (now_ns() < until) {}
        }
    }
    /* every block is checked before it is freed: the reserve never hands a block out twice */
    for (size_t i = 0; i < n; i++) {
        if (blocks[i][0] != (char)i || blocks[i][size - 1] != (char)i) {
            fprintf(stderr, "block %zu corrupted\n", i);
            return 1;
        }
        free(blocks[i]);
    }
    const char *raw = getenv("ALLOC_LATENCY_RAW");
    if (raw && *raw) {
        FILE *f = fopen(raw, "w");
        if (!f) { perror(raw); return 1; }
        for (size_t i = 0; i < n; i++) fprintf(f, "%.0f\n", lat[i]);
        fclose(f);
    }
    qsort(lat, n, sizeof(double), cmp);
    printf("{\"size\": %zu, \"count\": %zu, \"mean_ns\": %.0f, \"p50_ns\": %.0f, \"p90_ns\": %.0f, "
           "\"p99_ns\": %.0f, \"max_ns\": %.0f}\n",
           size, n, sum / n, lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100], lat[n - 1]);
    return 0;
}

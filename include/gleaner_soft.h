/*
 * gleaner_soft.h: the C API of gleaner soft memory (link with -lgleaner_soft).
 *
 * Soft memory holds state a program can rebuild (caches, memo tables, decoded blocks). The
 * machine may take it back at any moment: a pool registered with the node daemon
 * (`gleaner node`) is granted idle memory and shrunk under pressure, and if the program does
 * not give memory back in time the daemon takes it directly. Objects whose memory was taken
 * are rebuilt by the pool's reconstructor on their next read.
 *
 * Reads return copies and never torn or foreign bytes: a read that races the loss of its
 * memory becomes a miss and runs the reconstructor.
 *
 * Threads: every function may be called from any thread. The reconstructor is called from
 * whichever thread misses, possibly from several at once, so it and its context must be
 * thread-safe.
 */
#ifndef GLEANER_SOFT_H
#define GLEANER_SOFT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Pool settings; fill with gleaner_soft_config_init, then change what you need. */
typedef struct gleaner_soft_config {
    const char *name;        /* for status output (NULL: "pool") */
    uint64_t capacity;       /* the most bytes the pool can ever hold (default 1 GiB) */
    uint64_t limit;          /* its grant without (or before) a daemon (default 64 MiB) */
    const char *node_socket; /* NULL: no daemon; "": the default socket; else a socket path */
    int autostart;           /* nonzero: start `gleaner node` if none answers ($GLEANER_BIN) */
    double weight;           /* relative weight in the daemon's allocation (default 1) */
    uint64_t floor;          /* the least the daemon should leave it (pressure permitting) */
    uint64_t ceiling;        /* the most the daemon may grant it (0: capacity) */
    int verify;              /* debug: every hit also runs the reconstructor and compares */
} gleaner_soft_config;

/* A pool's counters. */
typedef struct gleaner_soft_stats {
    uint64_t hits;              /* reads served from soft memory */
    uint64_t misses;            /* reads that ran the reconstructor */
    uint64_t victim_hits;       /* misses on objects evicted recently */
    uint64_t rebuild_ns;        /* nanoseconds spent in the reconstructor */
    uint64_t torn_caught;       /* reads that raced a loss of memory and became misses */
    uint64_t verify_mismatches; /* debug mode: hits that differed from their reconstruction */
    uint64_t resident_bytes;    /* memory the pool holds now (the kernel's count) */
    uint64_t limit;             /* its grant now */
} gleaner_soft_stats;

/*
 * A reconstructor: write the value for `args` (`args_len` bytes) into `out` (capacity `cap`)
 * and return its length. Returning more than `cap` asks to be called again with that
 * capacity. Return -1 if the value cannot be rebuilt (the read then fails).
 */
typedef ssize_t (*gleaner_soft_recon)(void *ctx, const void *args, size_t args_len, void *out,
                                      size_t cap);

typedef struct gleaner_soft_pool gleaner_soft_pool;
typedef struct gleaner_soft_ptr gleaner_soft_ptr;
typedef struct gleaner_soft_map gleaner_soft_map;

void gleaner_soft_config_init(gleaner_soft_config *config);

/* A pool (config NULL: the defaults). NULL on failure: see gleaner_soft_last_error(). */
gleaner_soft_pool *gleaner_soft_pool_create(const gleaner_soft_config *config,
                                            gleaner_soft_recon recon, void *ctx);
/* Frees a pool; free its pointers and maps first. */
void gleaner_soft_pool_destroy(gleaner_soft_pool *pool);
/* Sets the grant of a pool without a daemon (a daemon's grant replaces it). */
void gleaner_soft_pool_set_limit(const gleaner_soft_pool *pool, uint64_t bytes);
/* 0, or -1 on a NULL argument. */
int gleaner_soft_pool_stats(const gleaner_soft_pool *pool, gleaner_soft_stats *out);

/* A soft unique pointer: empty until written or first read (which reconstructs). */
gleaner_soft_ptr *gleaner_soft_alloc(const gleaner_soft_pool *pool);
void gleaner_soft_free(gleaner_soft_ptr *ptr);
/*
 * Copies the object into buf (at most cap bytes) and returns its full length (more than cap:
 * the copy was cut short; call again with a bigger buffer). On a miss the reconstructor runs
 * with args. -1 if it could not be rebuilt.
 */
ssize_t gleaner_soft_read(const gleaner_soft_ptr *ptr, const void *args, size_t args_len,
                          void *buf, size_t cap);
/* Sets the value: 1 if it is cached, 0 if the grant had no room (the next read rebuilds). */
int gleaner_soft_write(const gleaner_soft_ptr *ptr, const void *data, size_t len);
/* 1 if the object is in soft memory now. */
int gleaner_soft_present(const gleaner_soft_ptr *ptr);

/* A soft hash map: a miss calls the pool's reconstructor with the key as args. */
gleaner_soft_map *gleaner_soft_map_create(const gleaner_soft_pool *pool);
void gleaner_soft_map_destroy(gleaner_soft_map *map);
ssize_t gleaner_soft_map_get(const gleaner_soft_map *map, const void *key, size_t klen, void *buf,
                             size_t cap);
int gleaner_soft_map_put(const gleaner_soft_map *map, const void *key, size_t klen,
                         const void *val, size_t vlen);

/* The calling thread's last error message. */
const char *gleaner_soft_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GLEANER_SOFT_H */

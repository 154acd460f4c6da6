/*
 * gleaner.h: the C API of gleaner far-memory regions (link with -lgleaner).
 *
 * A region is `size` bytes of ordinary memory of which at most `local_budget` bytes are resident
 * at once; the rest lives on a memory node. Use it like any other memory. Pages are fetched on
 * fault through userfaultfd and evicted by background threads.
 *
 * If the memory node becomes unreachable while the program needs a page that only it holds, the
 * process is stopped with exit status GLEANER_FATAL_EXIT_CODE and a message on stderr: it is never
 * handed zero-filled pages in place of its data.
 */
#ifndef GLEANER_H
#define GLEANER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status of a process stopped because far memory failed. */
#define GLEANER_FATAL_EXIT_CODE 86

/* An opaque far-memory region. */
typedef struct gleaner_region gleaner_region;

/*
 * Creates a region of `size` bytes with at most `local_budget` bytes resident.
 * `memnode`: a memnode address ("HOST:PORT" or "unix:PATH"), several separated by commas (a
 *            pool: every far page on two of them, so losing one loses nothing), or NULL to
 *            start a private embedded memnode (needs the `gleaner` executable: $GLEANER_BIN or
 *            $PATH).
 * `token_file`: the memnode's token file, or NULL for the default (~/.gleaner/token).
 * Returns NULL on failure; gleaner_last_error() then says why.
 */
gleaner_region *gleaner_region_create(size_t size, size_t local_budget, const char *memnode,
                                      const char *token_file);

/* The first byte of the region (page-aligned). */
void *gleaner_region_addr(const gleaner_region *region);

/* The region's size in bytes (the requested size rounded up to whole pages). */
size_t gleaner_region_size(const gleaner_region *region);

/* Asks for `len` bytes at `offset` of the region to be fetched ahead of use (a prefetch hint):
 * its far pages come back in the background at prefetch priority, only while the budget has
 * room. Returns at once. */
void gleaner_region_prefetch(const gleaner_region *region, size_t offset, size_t len);

/* Under `gleaner run` (or LD_PRELOAD=libgleaner_preload.so), the program's own heap takes hints
 * the same way, through a function the preload library exports. A program or runtime finds it
 * without linking to gleaner, and runs unchanged without it:
 *
 *     int (*hint)(const void *, size_t) = dlsym(RTLD_DEFAULT, "gleaner_prefetch");
 *     if (hint) hint(addr, len);   // 0: queued; -1: not far-memory heap
 */

/* The region's statistics as a JSON document; free it with gleaner_string_free(). */
char *gleaner_region_stats_json(const gleaner_region *region);

/* Stops the region's threads, releases its pages on the memnode and unmaps it. */
void gleaner_region_destroy(gleaner_region *region);

/* Frees a string returned by this library. */
void gleaner_string_free(char *s);

/* The last error on this thread, or NULL. Valid until the next call into this library. */
const char *gleaner_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GLEANER_H */

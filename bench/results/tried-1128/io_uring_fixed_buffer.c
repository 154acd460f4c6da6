/* Tried 2026-11-28 (docs/compatibility.md, "Memory the kernel pins for devices"):
 *
 *   gcc -O2 -o ur io_uring_fixed_buffer.c
 *   ./ur 64 fixed; gleaner run -q --local-mem 16M -- ./ur 64 fixed   # 0, then 8355840 bytes stale
 *   ./ur 64 plain; gleaner run -q --local-mem 16M -- ./ur 64 plain   # 0 and 0
 *
 * Since f1a4233 a run like the second one is stopped (exit 86) when it outlives the pager's
 * one-second look; the test is preload_program's uring-fixed mode (run_programs.rs). */
/* Registers a malloc'd buffer with io_uring (long-term pinned), pushes it far, then reads a file
 * into it with IORING_OP_READ_FIXED and checks what the program sees. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static int setup(unsigned n, struct io_uring_params *p) { return syscall(SYS_io_uring_setup, n, p); }
static int enter(int fd, unsigned sub, unsigned min, unsigned fl) { return syscall(SYS_io_uring_enter, fd, sub, min, fl, NULL, 0); }
static int reg(int fd, unsigned op, void *arg, unsigned n) { return syscall(SYS_io_uring_register, fd, op, arg, n); }

int main(int argc, char **argv) { int fixed = argc < 3 || strcmp(argv[2], "plain");
    size_t blen = 8 << 20, other = (size_t)atoi(argv[1]) << 20;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, blen)) return 2;
    memset(buf, 0xAA, blen);
    struct io_uring_params p; memset(&p, 0, sizeof p);
    int ring = setup(4, &p);
    if (ring < 0) { perror("io_uring_setup"); return 2; }
    struct iovec iov = { buf, blen };
    if (fixed && reg(ring, IORING_REGISTER_BUFFERS, &iov, 1) < 0) { perror("register"); return 2; }
    /* Push the buffer's pages far. */
    unsigned char *o = malloc(other);
    for (size_t i = 0; i < other; i++) o[i] = (unsigned char)i;
    for (size_t i = 0; i < other; i += 4096) o[i] += 1;
    /* A file of known bytes. */
    char path[] = "/tmp/urXXXXXX"; int fd = mkstemp(path); unlink(path);
    unsigned char *data = malloc(blen);
    for (size_t i = 0; i < blen; i++) data[i] = (unsigned char)(i * 7 + 3);
    if (write(fd, data, blen) != (ssize_t)blen) return 2;
    /* Map the rings and submit one READ_FIXED of the whole file into the buffer. */
    size_t sqsz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cqsz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(0, sqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQ_RING);
    char *cq = mmap(0, cqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
    unsigned *tail = (unsigned *)(sq + p.sq_off.tail), *arr = (unsigned *)(sq + p.sq_off.array);
    memset(&sqes[0], 0, sizeof sqes[0]);
    sqes[0].opcode = fixed ? IORING_OP_READ_FIXED : IORING_OP_READ; sqes[0].fd = fd; sqes[0].addr = (uint64_t)buf;
    sqes[0].len = blen; sqes[0].off = 0; sqes[0].buf_index = 0;
    arr[*tail & *(unsigned *)(sq + p.sq_off.ring_mask)] = 0;
    __atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
    if (enter(ring, 1, 1, IORING_ENTER_GETEVENTS) < 0) { perror("enter"); return 2; }
    struct io_uring_cqe *cqe = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    printf("read_fixed res %d\n", cqe->res);
    size_t bad = 0;
    for (size_t i = 0; i < blen; i++) bad += buf[i] != data[i];
    printf("bytes differing from the file: %zu of %zu\n", bad, blen);
    return bad ? 1 : 0;
}

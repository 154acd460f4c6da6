/* Fills MB mebibytes of heap (malloc, every page written, then checked) and prints
 * "filled MB MiB". Built static by tests/service.rs (`cc -static`) to stand for a program
 * LD_PRELOAD cannot reach; it knows nothing of gleaner. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long mb = argc > 1 ? atol(argv[1]) : 64;
    size_t len = (size_t)mb << 20;
    unsigned char *p = malloc(len);
    if (!p) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < len; i += 4096)
        p[i] = (unsigned char)(i >> 12);
    for (size_t i = 0; i < len; i += 4096)
        if (p[i] != (unsigned char)(i >> 12)) {
            fprintf(stderr, "page %zu lost\n", i >> 12);
            return 1;
        }
    printf("filled %ld MiB\n", mb);
    return 0;
}

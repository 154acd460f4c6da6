/* A shared library with thread-local storage, for `preload_program dlopen-tls`: the test copies
 * it under many names and dlopens each, as an interpreter loads extension modules, so that the
 * dynamic linker's bookkeeping of thread-local storage (one record per module, and the lists
 * that index them) grows after the program started. */
__thread long tls_counter[32];

/* Adds `by` to this thread's counter and returns it. */
long tls_bump(long by) {
    tls_counter[0] += by;
    return tls_counter[0];
}

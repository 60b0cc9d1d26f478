/* What the C test producers (writer.c, holder.c) share: creating their
 * segment and saying where it is (the first line the test reads), and
 * waiting for the test's line on stdin. Included after vramscope_ring.h.
 */
#ifndef VS_TEST_ANNOUNCE_H
#define VS_TEST_ANNOUNCE_H

/* Creates `seg` as `cfg` says and prints its path; on failure prints why
 * and exits with status 1. */
static void create_and_announce(vs_segment *seg, const vs_config *cfg) {
    char err[2048];
    if (vs_segment_create(seg, cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    printf("%s\n", seg->path);
    fflush(stdout);
}

/* Reads one line (of at most 15 bytes) from stdin; 0 at its end. */
static int await_line(void) {
    char line[16];
    return fgets(line, sizeof line, stdin) != NULL;
}

#endif

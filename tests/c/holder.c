/* A producer of the C header that holds one segment: creates it in DIR
 * (labelled LABEL when given; DIR left out: the header's default
 * directory), prints its path, waits for a line on stdin, closes it. For
 * tests/ring_same_name.rs and the hostile agent tests.
 *
 *   holder [DIR [LABEL]]
 */
#include "../../assets/agent/vramscope_ring.h"
#include "announce.h"

int main(int argc, char **argv) {
    if (argc > 3) return 2;
    vs_config cfg = vs_default_config();
    cfg.dir = argv[1]; /* NULL when left out (argv[argc]) */
    if (argc == 3) cfg.label = argv[2];
    cfg.rings[0].slots = 64;
    cfg.rings[1].slots = 64;
    vs_segment seg;
    create_and_announce(&seg, &cfg);
    await_line();
    vs_segment_close(&seg);
    return 0;
}

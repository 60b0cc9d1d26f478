/* An agent of the previous version: compiled against the 1.0 header as it
 * was at commit e1cdefb (tests/compat/v1_0/vramscope_ring.h), it writes a
 * snapshot, allocator events, a statistics sample and a marker exactly as a
 * 1.0 producer did, prints the segment path, and waits for a line on stdin
 * before closing. Read by today's reader in tests/compat_ring.rs.
 *
 *   writer_1_0 DIR
 */
#include "v1_0/vramscope_ring.h.frozen"

#define MIB (1ull << 20)

static vs_segment seg;

static void put(int ring, uint64_t w0, uint64_t t, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e) {
    uint64_t w[7] = {w0, t, a, b, c, d, e};
    if (!vs_ring_write(&seg.rings[ring], w)) fprintf(stderr, "dropped\n");
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    vs_config cfg = vs_default_config();
    cfg.dir = argv[1];
    cfg.producer = VS_PRODUCER_TORCH_EXACT;
    cfg.flags = VS_FLAG_EVENTS | VS_FLAG_STATS;
    cfg.framework = "c-writer 1.0";
    cfg.label = "old agent";
    cfg.rings[0].slots = 1024;
    cfg.rings[1].slots = 1024;
    cfg.rings[1].device = 0;
    char err[2048];
    if (vs_segment_create(&seg, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const uint64_t B = 0x7f0000000000ull, S2 = B + (1ull << 30);
    uint64_t t = vs_monotonic_ns();
    /* The state before the events: one 20 MiB segment, 4 MiB allocated. */
    put(0, vs_head_word(VS_K_SNAP_BEGIN, 0, 1), t, 1, 2, 0, 0, 0);
    put(0, vs_head_word(VS_K_SNAP_SEGMENT, 0, 1), t, B, 20 * MIB, 0, 0, 0);
    put(0, vs_head_word(VS_K_SNAP_BLOCK, 0, 1), t, B, 4 * MIB, 4 * MIB, 0, 0);
    put(0, vs_head_word(VS_K_SNAP_BLOCK, 0, 1), t, B + 4 * MIB, 16 * MIB, 0, 2, 0);
    put(0, vs_head_word(VS_K_SNAP_END, 0, 1), t, 0, 0, 0, 0, 0);
    /* Events: a 2 MiB tensor from the free block, a new segment and an
       8 MiB tensor in it, then the first 4 MiB tensor freed. */
    put(1, vs_head_word(VS_K_ALLOC, 0, 0), t + 1000, B + 4 * MIB, 2 * MIB, 0, 0, 0);
    put(1, vs_head_word(VS_K_SEGMENT_ALLOC, 0, 0), t + 2000, S2, 20 * MIB, 0, 0, 0);
    put(1, vs_head_word(VS_K_ALLOC, 0, 0), t + 3000, S2, 8 * MIB, 0, 0, 0);
    put(1, vs_head_word(VS_K_FREE_REQUESTED, 0, 0), t + 4000, B, 4 * MIB, 0, 0, 0);
    put(1, vs_head_word(VS_K_FREE_COMPLETED, 0, 0), t + 5000, B, 4 * MIB, 0, 0, 0);
    /* A statistics sample that agrees, and a step marker. */
    put(0, vs_head_word(VS_K_STATS_A, 0, 1), t + 6000, 10 * MIB, 40 * MIB, 10 * MIB, 0, 10 * MIB);
    put(0, vs_head_word(VS_K_STATS_B, 0, 1), t + 6000, 14 * MIB, 40 * MIB, 14 * MIB, 0, 2ull << 32);
    put(0, vs_head_word(VS_K_MARKER, VS_NO_DEVICE, 0), t + 7000, 3, 0, 0, 0, 0);
    printf("%s\n", seg.path);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) line[0] = 0; /* the reader is done */
    vs_segment_close(&seg);
    return 0;
}

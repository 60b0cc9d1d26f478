/* A writer of the current version: every record kind added in 1.1 and 1.2, built
 * with the vs_rec_* helpers of assets/agent/vramscope_ring.h, plus 1.0
 * records around them. tests/compat_ring.rs reads it with today's reader
 * (the helpers must agree with the Rust codec) and decodes the same words
 * with the frozen 1.0 decoder (1.0 kinds unchanged, new kinds skipped).
 *
 *   writer_1_1 DIR
 */
#include "../../assets/agent/vramscope_ring.h"

static vs_segment seg;

static void put(int ring, const uint64_t w[7]) {
    if (!vs_ring_write(&seg.rings[ring], w)) fprintf(stderr, "dropped\n");
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    vs_config cfg = vs_default_config();
    cfg.dir = argv[1];
    cfg.producer = VS_PRODUCER_TORCH_EXACT;
    cfg.flags = VS_FLAG_EVENTS | VS_FLAG_STATS | VS_FLAG_POSITIONS | VS_FLAG_CONTEXTS;
    cfg.framework = "c-writer 1.1";
    cfg.label = "new agent";
    cfg.rings[0].slots = 1024;
    cfg.rings[1].slots = 1024;
    cfg.rings[1].device = 0;
    char err[2048];
    if (vs_segment_create(&seg, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint64_t w[7];
    const uint64_t t = 1000;
    /* Definitions (agent ring). */
    if (vs_write_string(&seg.rings[0], 1, t, "transformer.h.3.attn") != 0) return 1;
    if (vs_write_string(&seg.rings[0], 2, t, "/home/u/train.py:an exceptionally long path name, longer than one chunk") != 0)
        return 1;
    vs_rec_frame(w, 1, t + 1, 2, 1, 118);
    put(0, w);
    vs_rec_stack(w, 1, t + 2, 1, 0);
    put(0, w);
    vs_rec_context(w, 5, t + 3, 1, VS_PHASE_FORWARD, 1, 0, 0);
    put(0, w);
    vs_rec_context(w, 6, t + 4, 0, VS_PHASE_OPTIMIZER, 0, 1, 41);
    put(0, w);
    /* A step boundary from an optimizer hook, and one from mark(). */
    vs_rec_marker(w, t + 5, 41, VS_MARK_OPTIMIZER_STEP, 1);
    put(0, w);
    vs_rec_marker(w, t + 6, 7, VS_MARK_USER, 99); /* the argument is 0 unless an optimizer step */
    put(0, w);
    /* Allocator events with a context tag (device ring). */
    uint32_t tag = vs_ctx_tag(5, vs_step_tag(41));
    vs_rec_alloc_event(w, VS_K_SEGMENT_ALLOC, 0, tag, t + 7, 0x7f0000000000ull, 20ull << 20, 0, 0, 0);
    vs_ring_write_exclusive(&seg.rings[1], w);
    vs_rec_alloc_event(w, VS_K_ALLOC, 0, tag, t + 8, 0x7f0000000000ull, 4096, 0, 0, 0);
    vs_ring_write_exclusive(&seg.rings[1], w);
    /* A statistics sample placed in the device ring: A, B, then C. */
    uint64_t a[7] = {vs_head_word(VS_K_STATS_A, 0, 9), t + 9, 4096, 20ull << 20, 4096, 0, 4096};
    uint64_t b[7] = {vs_head_word(VS_K_STATS_B, 0, 9), t + 9, 4096, 20ull << 20, 4096, 0, 1ull << 32};
    put(0, a);
    put(0, b);
    vs_rec_stats_c(w, 0, 9, t + 9, 1, 2, 2, 1);
    put(0, w);
    /* A snapshot with positions (ambiguous), a block with its tag. */
    vs_rec_snap_begin(w, 0, 3, t + 10, 1, 1, 1, 1, 2, 0);
    put(0, w);
    uint64_t sg[7] = {vs_head_word(VS_K_SNAP_SEGMENT, 0, 3), t + 10, 0x7f0000000000ull, 20ull << 20, 0, 0, 0};
    put(0, sg);
    uint64_t bl[7] = {vs_head_word(VS_K_SNAP_BLOCK, 0, 3), t + 10, 0x7f0000000000ull, 20ull << 20, 4096, 0, tag};
    put(0, bl);
    uint64_t en[7] = {vs_head_word(VS_K_SNAP_END, 0, 3), t + 10, 0, 0, 0, 0, 0};
    put(0, en);
    vs_rec_dropped(w, VS_NO_DEVICE, VS_DROP_STACKS, t + 11, 12, 64);
    put(0, w);
    /* 1.2: a role list naming the allocated block's tensor. */
    vs_rec_roles(w, 1, t + 12, 1, 0);
    put(0, w);
    vs_rec_role(w, 1, t + 12, 0, 0x7f0000000000ull, 4096, VS_HELD_PARAMETER, 1);
    put(0, w);
    vs_rec_roles(w, 1, t + 12, 1, 1);
    put(0, w);
    vs_rec_dropped(w, VS_NO_DEVICE, VS_DROP_ROLES, t + 13, 5, 16384);
    put(0, w);
    /* 1.3: memory outside the caching allocator: the context, NCCL's
       buffer allocated and freed, pinned host memory of a library the
       format does not name (a name longer than the 24 bytes sent). */
    vs_rec_outside(w, VS_K_OUTSIDE_TOTAL, t + 14, 0, VS_LIB_CUDA, VS_OUT_CONTEXT, 0, 500ull << 20, NULL);
    put(0, w);
    vs_rec_outside(w, VS_K_OUTSIDE_ALLOC, t + 15, 0, VS_LIB_NCCL, VS_OUT_PHYSICAL, 0x7f2000000000ull, 64ull << 20,
                   "libnccl.so.2");
    put(0, w);
    vs_rec_outside(w, VS_K_OUTSIDE_FREE, t + 16, 0, VS_LIB_NCCL, VS_OUT_PHYSICAL, 0x7f2000000000ull, 64ull << 20,
                   "libnccl.so.2");
    put(0, w);
    vs_rec_outside(w, VS_K_OUTSIDE_ALLOC, t + 17, VS_NO_DEVICE, VS_LIB_OTHER, VS_OUT_HOST, 0x5500ull, 4096,
                   "libcudnn_engines_runtime_compiled.so.9");
    put(0, w);
    printf("%s\n", seg.path);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) line[0] = 0;
    vs_segment_close(&seg);
    return 0;
}

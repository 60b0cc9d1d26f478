/* A test producer for the cross-language test (tests/ring_c_writer.rs):
 * N threads write checksummed ALLOC records through vramscope_ring.h while a
 * Rust reader drains; then it answers commands until told to quit.
 *
 *   writer DIR THREADS PER_THREAD SLOTS
 */
#include "../../assets/agent/vramscope_ring.h"
#include "announce.h"
#include <pthread.h>

static vs_segment seg;
static unsigned long per_thread;

/* The payload a record must carry: every word derives from (thread, i). */
static void make(uint64_t thread, uint64_t i, uint64_t w[7]) {
    uint64_t x = (thread << 40) | i;
    w[0] = vs_head_word(VS_K_ALLOC, (uint16_t)thread, 0);
    w[1] = x;
    w[2] = x * 0x9E3779B97F4A7C15ull;
    w[3] = ~x;
    w[4] = x ^ 0x5555555555555555ull;
    w[5] = x + 1;
    w[6] = w[2] ^ w[3] ^ w[4] ^ w[5];
}

static int exclusive; /* one writer thread: the read-modify-write-free path */

static void *run(void *arg) {
    uint64_t t = (uint64_t)(uintptr_t)arg;
    uint64_t w[7];
    for (unsigned long i = 0; i < per_thread; i++) {
        make(t, i, w);
        if (exclusive)
            vs_ring_write_exclusive(&seg.rings[1], w);
        else
            vs_ring_write(&seg.rings[1], w);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: writer DIR THREADS PER_THREAD SLOTS\n");
        return 2;
    }
    vs_config cfg = vs_default_config();
    cfg.dir = argv[1];
    cfg.producer = VS_PRODUCER_TEST;
    cfg.flags = VS_FLAG_EVENTS;
    cfg.framework = "c-writer 1.0";
    cfg.label = "cross-language test \xc3\xa9"; /* UTF-8 survives */
    cfg.rings[1].slots = (uint32_t)strtoul(argv[4], NULL, 10);
    int threads = atoi(argv[2]);
    exclusive = threads == 1;
    per_thread = strtoul(argv[3], NULL, 10);
    create_and_announce(&seg, &cfg);
    /* Wait for the reader to say "go" on stdin, so it sees the run live. */
    if (!await_line()) return 1;
    pthread_t th[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&th[i], NULL, run, (void *)(uintptr_t)i);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(th[i], NULL);
    /* One statistics sample and a marker in the agent ring. */
    uint64_t a[7] = {vs_head_word(VS_K_STATS_A, 0, 1), vs_monotonic_ns(), 100, 200, 150, 50, 90};
    uint64_t b[7] = {vs_head_word(VS_K_STATS_B, 0, 1), vs_monotonic_ns(), 101, 201, 151, 3, (7ull << 32) | 2};
    uint64_t m[7] = {vs_head_word(VS_K_MARKER, VS_NO_DEVICE, 0), vs_monotonic_ns(), 42, 0, 0, 0, 0};
    vs_ring_write(&seg.rings[0], a);
    vs_ring_write(&seg.rings[0], b);
    vs_ring_write(&seg.rings[0], m);
    printf("written\n");
    fflush(stdout);
    /* Serve commands: ping echoes, empty cache reports 300 -> 100, ping 0 quits. */
    for (int spins = 0; spins < 20000; spins++) {
        vs_heartbeat(&seg);
        vs_request req;
        if (vs_command_poll(&seg, &req)) {
            if (req.kind == VS_CMD_PING) {
                vs_command_answer(&seg, &req, VS_STATUS_OK, req.arg, 0);
                if (req.arg == 0) break;
            } else if (req.kind == VS_CMD_EMPTY_CACHE) {
                vs_command_answer(&seg, &req, VS_STATUS_OK, 300, 100);
            } else {
                vs_command_answer(&seg, &req, VS_STATUS_UNSUPPORTED, 0, 0);
            }
        }
        usleep(1000);
    }
    vs_segment_close(&seg);
    return 0;
}

/*
 * vramscope_ring.h — the C writer of the vramscope segment format 1.1.
 *
 * A single header for C (gnu11) and C++ (gnu++17 and later), built with gcc or
 * clang. The format is specified in crates/wire/src/ring/FORMAT.md of the vramscope
 * repository; this file implements the producer side of it:
 *
 *   vs_segment seg;
 *   vs_config cfg = vs_default_config();       // then set label, rings, ...
 *   char err[256];
 *   if (vs_segment_create(&seg, &cfg, err, sizeof err) != 0) { warn(err); }
 *   vs_ring_write(&seg.rings[1], words);        // any thread, never blocks
 *   vs_heartbeat(&seg);                         // at least once a second
 *   if (vs_command_poll(&seg, &req)) { ...; vs_command_answer(&seg, &req, 0, a, b); }
 *   vs_segment_close(&seg);                     // state = closed, unlink
 *
 * vs_ring_write is safe to call from any number of threads at once and from
 * under a lock: it makes no system call, allocates nothing and never waits.
 * Shared words are accessed only through the __atomic builtins.
 *
 * Format 1.1 records (context tags, definitions, positions, DROPPED) are
 * built with the vs_rec_* helpers below: each fills seven words on the
 * caller's stack and touches nothing else, so it may be called from the
 * allocator callback like vs_ring_write.
 */
#ifndef VRAMSCOPE_RING_H
#define VRAMSCOPE_RING_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VS_MAGIC 0x3165706f63534d56ULL /* "VMScope1" little-endian */
#define VS_MAJOR 1
#define VS_MINOR 3
#define VS_HEADER_SIZE 256
#define VS_RING_ENTRY_SIZE 32
#define VS_RING_HEADER_SIZE 128
#define VS_SLOT_SIZE 64
#define VS_CONTROL_SIZE 128
#define VS_MAX_RINGS 64

/* Producers (header `producer`). */
#define VS_PRODUCER_TORCH_EXACT 1
#define VS_PRODUCER_TORCH_SAMPLED 2
#define VS_PRODUCER_SIMULATOR 3
#define VS_PRODUCER_TEST 4

/* Header flags. */
#define VS_FLAG_EVENTS 1u
#define VS_FLAG_STATS 2u
#define VS_FLAG_SIMULATED 4u
#define VS_FLAG_POSITIONS 8u /* 1.1: SNAP_BEGIN and STATS_C carry ring positions */
#define VS_FLAG_CONTEXTS 16u /* 1.1: allocator events carry context tags */

/* Ring roles. */
#define VS_ROLE_AGENT 0u
#define VS_ROLE_DEVICE 1u

/* Record kinds (FORMAT.md, "Records"). */
#define VS_K_ALLOC 1
#define VS_K_FREE_REQUESTED 2
#define VS_K_FREE_COMPLETED 3
#define VS_K_SEGMENT_ALLOC 4
#define VS_K_SEGMENT_FREE 5
#define VS_K_SEGMENT_MAP 6
#define VS_K_SEGMENT_UNMAP 7
#define VS_K_OOM 9
#define VS_K_STATS_A 16
#define VS_K_STATS_B 17
#define VS_K_SNAP_BEGIN 32
#define VS_K_SNAP_SEGMENT 33
#define VS_K_SNAP_BLOCK 34
#define VS_K_SNAP_END 35
#define VS_K_MARKER 48
/* Added in 1.1. */
#define VS_K_STATS_C 18
#define VS_K_DROPPED 49
#define VS_K_STRING 64
#define VS_K_FRAME 65
#define VS_K_STACK 66
#define VS_K_CONTEXT 67
#define VS_K_ROLES 68     /* 1.2 */
#define VS_K_ROLE 69      /* 1.2 */
#define VS_K_ROLES_END 70 /* 1.2 */
#define VS_K_OUTSIDE_ALLOC 80 /* 1.3 */
#define VS_K_OUTSIDE_FREE 81  /* 1.3 */
#define VS_K_OUTSIDE_TOTAL 82 /* 1.3 */

/* OUTSIDE_* libraries and kinds (FORMAT.md, "Outside the caching
   allocator"). */
#define VS_LIB_OTHER 0
#define VS_LIB_CUDA 1
#define VS_LIB_TORCH 2
#define VS_LIB_NCCL 3
#define VS_LIB_CUBLAS 4
#define VS_LIB_CUDNN 5
#define VS_LIB_CUFFT 6
#define VS_LIB_TRITON 7
#define VS_LIB_TENSORRT 8
#define VS_LIB_CUPY 9
#define VS_OUT_CONTEXT 1
#define VS_OUT_ALLOCATION 2
#define VS_OUT_PHYSICAL 3
#define VS_OUT_STREAM_ORDERED 4
#define VS_OUT_MANAGED 5
#define VS_OUT_HOST 6
#define VS_OUT_KERNELS 7
#define VS_OUT_STREAMS 8
#define VS_OUT_BEFORE 9
#define VS_NO_DEVICE 0xffffu

/* MARKER sources (w3), 1.1. */
#define VS_MARK_UNKNOWN 0
#define VS_MARK_USER 1
#define VS_MARK_OPTIMIZER_STEP 2
#define VS_MARK_INFERRED 3
#define VS_MARK_OTHER 4
/* CONTEXT phases (w3), 1.1. */
#define VS_PHASE_NOT_GIVEN 0
#define VS_PHASE_FORWARD 1
#define VS_PHASE_BACKWARD 2
#define VS_PHASE_OPTIMIZER 3
#define VS_PHASE_OTHER 4
/* DROPPED `what` (aux), 1.1. */
#define VS_DROP_RECORDS 1
#define VS_DROP_CONTEXT_IDS 2
#define VS_DROP_STACKS 3
#define VS_DROP_STRINGS 4
#define VS_DROP_DEFINITIONS 5
#define VS_DROP_BLOCK_TAGS 6
#define VS_DROP_ROLES 7 /* 1.2 */
#define VS_DROP_OUTSIDE 8 /* 1.3 */

/* ROLE w4 (1.2) */
#define VS_HELD_PARAMETER 1
#define VS_HELD_BUFFER 2
#define VS_HELD_GRADIENT 3
#define VS_HELD_OPTIMIZER_STATE 4
/* Position flags (SNAP_BEGIN w6, STATS_C w4), 1.1. */
#define VS_SPAN_GIVEN 1ull
#define VS_SPAN_EXACT 2ull
#define VS_SPAN_AMBIGUOUS 4ull
#define VS_CONTEXT_STEP_GIVEN 1ull
#define VS_CONTEXT_MAX 0xffffffu /* context ids are 24-bit */
#define VS_STRING_CHUNK 32
#define VS_STRING_MAX 4096

/* Commands and statuses (FORMAT.md, "Control block"). */
#define VS_CMD_EMPTY_CACHE 1
#define VS_CMD_RESET_PEAKS 2
#define VS_CMD_SNAPSHOT 3
#define VS_CMD_PING 4
#define VS_CMD_CAPTURE_STACKS 5 /* 1.1: arg bits 0-31 steps, 32-47 depth */
#define VS_STATUS_OK 0
#define VS_STATUS_UNSUPPORTED 1
#define VS_STATUS_FAILED 2
#define VS_STATUS_REFUSED 3

/* Header field offsets. */
#define VS_OFF_HEARTBEAT 72
#define VS_OFF_STATE 80
/* Control block offsets. */
#define VS_CTL_CMD_SEQ 16
#define VS_CTL_CMD_KIND 24
#define VS_CTL_CMD_ARG 32
#define VS_CTL_ACK_SEQ 64
#define VS_CTL_STATUS 72
#define VS_CTL_RESULT0 80
#define VS_CTL_RESULT1 88
#define VS_CTL_RESULT2 96

typedef struct vs_ring_spec {
    uint32_t slots; /* power of two, 2 .. 2^24 */
    uint32_t role;
    uint32_t device; /* 0xffffffff: any */
} vs_ring_spec;

typedef struct vs_config {
    const char *dir;   /* NULL: $VRAMSCOPE_SHM_DIR, else /dev/shm */
    const char *tag;   /* NULL or [A-Za-z0-9_]{1,32} */
    uint32_t producer;
    uint32_t flags;
    const char *framework;
    const char *label;
    uint32_t ring_count;
    vs_ring_spec rings[VS_MAX_RINGS];
} vs_config;

typedef struct vs_ring {
    uint64_t *head;
    uint64_t *dropped;
    uint64_t *slots; /* slot i starts at slots + 8 * i */
    uint64_t mask;
} vs_ring;

typedef struct vs_segment {
    uint8_t *base;
    size_t size;
    uint32_t control_offset;
    uint32_t ring_count;
    vs_ring rings[VS_MAX_RINGS];
    char path[512];
} vs_segment;

typedef struct vs_request {
    uint64_t seq;
    uint64_t kind;
    uint64_t arg;
} vs_request;

static inline uint64_t vs_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t vs_head_word(uint16_t kind, uint16_t device, uint32_t aux) {
    return (uint64_t)kind | ((uint64_t)device << 16) | ((uint64_t)aux << 32);
}

/* ---- format 1.1 record builders (FORMAT.md, "Records") ------------------ */

/* (step mod 255) + 1: the step tag of an allocator event (0: not given). */
static inline uint8_t vs_step_tag(uint64_t step) { return (uint8_t)(step % 255u + 1u); }

/* The context tag that goes into an allocator event's aux. */
static inline uint32_t vs_ctx_tag(uint32_t context, uint8_t step_tag) {
    return (context & VS_CONTEXT_MAX) | ((uint32_t)step_tag << 24);
}

/* Any record: its header word, its time and words 2 to 6. */
static inline void vs_rec_words(uint64_t w[7], uint16_t kind, uint16_t device, uint32_t aux, uint64_t time,
                                uint64_t w2, uint64_t w3, uint64_t w4, uint64_t w5, uint64_t w6) {
    w[0] = vs_head_word(kind, device, aux);
    w[1] = time;
    w[2] = w2;
    w[3] = w3;
    w[4] = w4;
    w[5] = w5;
    w[6] = w6;
}

/* An allocator event (kinds 1-7, 9) with its context tag. */
static inline void vs_rec_alloc_event(uint64_t w[7], uint16_t kind, uint16_t device, uint32_t tag, uint64_t time,
                                      uint64_t addr, uint64_t size, uint64_t stream, uint64_t pool0, uint64_t pool1) {
    vs_rec_words(w, kind, device, tag, time, addr, size, stream, pool0, pool1);
}

/* The flags word of a position span: `before` and `after` are the device
   ring's head loaded just before and just after the state was read. */
static inline uint64_t vs_span_flags(uint8_t ring, uint64_t before, uint64_t after, int exact) {
    return VS_SPAN_GIVEN | (exact ? VS_SPAN_EXACT : 0) | (after != before ? VS_SPAN_AMBIGUOUS : 0) |
           ((uint64_t)ring << 8);
}

/* A step boundary: `source` is a VS_MARK_*; `optimizer` numbers the optimizer
   for VS_MARK_OPTIMIZER_STEP (1, 2, ...; 0 not given). */
static inline void vs_rec_marker(uint64_t w[7], uint64_t time, uint64_t value, uint8_t source, uint32_t optimizer) {
    uint64_t arg = source == VS_MARK_OPTIMIZER_STEP ? optimizer : 0;
    vs_rec_words(w, VS_K_MARKER, VS_NO_DEVICE, 0, time, value, source, arg, 0, 0);
}

/* STATS_C: written after the STATS_B of sample `sample`, same device. */
static inline void vs_rec_stats_c(uint64_t w[7], uint16_t device, uint32_t sample, uint64_t time, uint8_t ring,
                                  uint64_t before, uint64_t after, int exact) {
    uint64_t flags = vs_span_flags(ring, before, after, exact);
    vs_rec_words(w, VS_K_STATS_C, device, sample, time, before, after, flags, 0, 0);
}

/* SNAP_BEGIN with the device ring's positions around the snapshot. */
static inline void vs_rec_snap_begin(uint64_t w[7], uint16_t device, uint32_t id, uint64_t time, uint64_t segments,
                                     uint64_t blocks, uint8_t ring, uint64_t before, uint64_t after, int exact) {
    uint64_t flags = vs_span_flags(ring, before, after, exact);
    vs_rec_words(w, VS_K_SNAP_BEGIN, device, id, time, segments, blocks, before, after, flags);
}

/* DROPPED: `count` is cumulative since the segment was created. */
static inline void vs_rec_dropped(uint64_t w[7], uint16_t device, uint32_t what, uint64_t time, uint64_t count,
                                  uint64_t bound) {
    vs_rec_words(w, VS_K_DROPPED, device, what, time, count, bound, 0, 0, 0);
}

/* The length a STRING record sends for `s` (n bytes): at most VS_STRING_MAX,
   cut on a UTF-8 character boundary. */
static inline uint32_t vs_string_len(const char *s, size_t n) {
    if (n > VS_STRING_MAX) {
        n = VS_STRING_MAX;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    return (uint32_t)n;
}

/* The STRING chunk of string `id` at byte `offset` (a multiple of 32) of
   `s`, `len` bytes long (from vs_string_len). A string of `len` bytes takes
   max(1, ceil(len / 32)) chunks. */
static inline void vs_rec_string(uint64_t w[7], uint32_t id, uint64_t time, const char *s, uint32_t len,
                                 uint32_t offset) {
    uint8_t chunk[VS_STRING_CHUNK];
    memset(chunk, 0, sizeof chunk);
    if (offset < len) memcpy(chunk, s + offset, len - offset < VS_STRING_CHUNK ? len - offset : VS_STRING_CHUNK);
    w[0] = vs_head_word(VS_K_STRING, VS_NO_DEVICE, id);
    w[1] = time;
    w[2] = (uint64_t)len | ((uint64_t)offset << 32);
    for (int i = 0; i < 4; i++) {
        uint64_t v = 0;
        for (int b = 7; b >= 0; b--) v = (v << 8) | chunk[i * 8 + b];
        w[3 + i] = v;
    }
}

/* Writes every chunk of string `id` into `ring` (no allocation). Returns the
   number of chunks that were dropped because their slot was held. */
static inline int vs_write_string(vs_ring *ring, uint32_t id, uint64_t time, const char *s);

static inline void vs_rec_frame(uint64_t w[7], uint32_t id, uint64_t time, uint32_t file, uint32_t function,
                                uint32_t line) {
    vs_rec_words(w, VS_K_FRAME, VS_NO_DEVICE, id, time, file, function, line, 0, 0);
}

static inline void vs_rec_stack(uint64_t w[7], uint32_t id, uint64_t time, uint32_t frame, uint32_t parent) {
    vs_rec_words(w, VS_K_STACK, VS_NO_DEVICE, id, time, frame, parent, 0, 0, 0);
}

/* CONTEXT: `module` a string id (0 none), `phase` a VS_PHASE_*, `stack` a
   stack id (0 none); `has_step` says whether `step` is given. */
static inline void vs_rec_context(uint64_t w[7], uint32_t id, uint64_t time, uint32_t module, uint8_t phase,
                                  uint32_t stack, int has_step, uint64_t step) {
    vs_rec_words(w, VS_K_CONTEXT, VS_NO_DEVICE, id, time, module, phase, has_step ? step : 0, stack,
                 has_step ? VS_CONTEXT_STEP_GIVEN : 0);
}

/* ROLES and ROLES_END (1.2): list `list` of `count` ROLE records. */
static inline void vs_rec_roles(uint64_t w[7], uint32_t list, uint64_t time, uint64_t count, int end) {
    vs_rec_words(w, end ? VS_K_ROLES_END : VS_K_ROLES, VS_NO_DEVICE, list, time, count, 0, 0, 0, 0);
}

/* ROLE (1.2): the tensor at `addr` of `bytes` on `device` is held as `held`
   (a VS_HELD_*) by module path string `module` (0 none). */
static inline void vs_rec_role(uint64_t w[7], uint32_t list, uint64_t time, uint16_t device, uint64_t addr,
                               uint64_t bytes, uint8_t held, uint32_t module) {
    vs_rec_words(w, VS_K_ROLE, device, list, time, addr, bytes, held, module, 0);
}

/* OUTSIDE_ALLOC, OUTSIDE_FREE or OUTSIDE_TOTAL (1.3, `kind` a
   VS_K_OUTSIDE_*): `bytes` of memory outside the caching allocator on
   `device` (VS_NO_DEVICE: host), made by `library` (a VS_LIB_*) of
   `out_kind` (a VS_OUT_*); `addr` 0 for a total; `name` the library's file
   name (its first 24 bytes are sent; NULL: none). */
static inline void vs_rec_outside(uint64_t w[7], uint16_t kind, uint64_t time, uint16_t device, uint8_t library,
                                  uint8_t out_kind, uint64_t addr, uint64_t bytes, const char *name) {
    uint8_t packed[24] = {0};
    if (name) {
        size_t n = 0;
        while (n < sizeof packed && name[n]) n++;
        memcpy(packed, name, n);
    }
    uint64_t n0, n1, n2;
    memcpy(&n0, packed, 8);
    memcpy(&n1, packed + 8, 8);
    memcpy(&n2, packed + 16, 8);
    vs_rec_words(w, kind, device, (uint32_t)library | (uint32_t)out_kind << 8, time, addr, bytes, n0, n1, n2);
}

/*
 * Writes one record (seven payload words) into `ring`. Returns 1 if written,
 * 0 if the slot was held by another writer (the record is lost and counted).
 */
static inline int vs_ring_write(vs_ring *ring, const uint64_t w[7]) {
    uint64_t p = __atomic_fetch_add(ring->head, 1, __ATOMIC_RELAXED);
    uint64_t *slot = ring->slots + 8 * (p & ring->mask);
    uint64_t writing = 2 * p + 1;
    uint64_t s = __atomic_load_n(&slot[0], __ATOMIC_RELAXED);
    if ((s & 1) || s >= writing ||
        !__atomic_compare_exchange_n(&slot[0], &s, writing, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(ring->dropped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < 7; i++) __atomic_store_n(&slot[1 + i], w[i], __ATOMIC_RELAXED);
    __atomic_store_n(&slot[0], writing + 1, __ATOMIC_RELEASE);
    return 1;
}

static inline int vs_write_string(vs_ring *ring, uint32_t id, uint64_t time, const char *s) {
    uint32_t len = vs_string_len(s, strlen(s));
    int dropped = 0;
    uint32_t off = 0;
    do {
        uint64_t w[7];
        vs_rec_string(w, id, time, s, len, off);
        dropped += !vs_ring_write(ring, w);
        off += VS_STRING_CHUNK;
    } while (off < len);
    return dropped;
}

/*
 * vs_ring_write for a ring that only one thread writes at a time (e.g. a
 * device's ring, written only under that device's allocator lock): the same
 * slot protocol with plain atomic stores instead of read-modify-writes.
 * Readers cannot tell the difference. Concurrent use voids the guarantee
 * that no torn record is accepted.
 */
static inline void vs_ring_write_exclusive(vs_ring *ring, const uint64_t w[7]) {
    uint64_t p = __atomic_load_n(ring->head, __ATOMIC_RELAXED);
    __atomic_store_n(ring->head, p + 1, __ATOMIC_RELAXED);
    uint64_t *slot = ring->slots + 8 * (p & ring->mask);
    __atomic_store_n(&slot[0], 2 * p + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < 7; i++) __atomic_store_n(&slot[1 + i], w[i], __ATOMIC_RELAXED);
    __atomic_store_n(&slot[0], 2 * p + 2, __ATOMIC_RELEASE);
}

static inline uint64_t *vs_word(vs_segment *seg, size_t off) {
    return (uint64_t *)(seg->base + off);
}

static inline void vs_heartbeat(vs_segment *seg) {
    __atomic_store_n(vs_word(seg, VS_OFF_HEARTBEAT), vs_monotonic_ns(), __ATOMIC_RELEASE);
}

/* Reads a posted command not yet answered. Returns 1 and fills `req` if one is there. */
static inline int vs_command_poll(vs_segment *seg, vs_request *req) {
    uint64_t *c = vs_word(seg, seg->control_offset);
    uint64_t s1 = __atomic_load_n(&c[VS_CTL_CMD_SEQ / 8], __ATOMIC_ACQUIRE);
    if ((s1 & 1) || s1 == 0 || s1 == __atomic_load_n(&c[VS_CTL_ACK_SEQ / 8], __ATOMIC_ACQUIRE))
        return 0;
    uint64_t kind = __atomic_load_n(&c[VS_CTL_CMD_KIND / 8], __ATOMIC_RELAXED);
    uint64_t arg = __atomic_load_n(&c[VS_CTL_CMD_ARG / 8], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&c[VS_CTL_CMD_SEQ / 8], __ATOMIC_RELAXED) != s1) return 0;
    req->seq = s1;
    req->kind = kind;
    req->arg = arg;
    return 1;
}

/* Publishes the outcome of `req`. */
static inline void vs_command_answer(vs_segment *seg, const vs_request *req, uint64_t status,
                                     uint64_t result0, uint64_t result1) {
    uint64_t *c = vs_word(seg, seg->control_offset);
    __atomic_store_n(&c[VS_CTL_ACK_SEQ / 8], req->seq - 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&c[VS_CTL_STATUS / 8], status, __ATOMIC_RELAXED);
    __atomic_store_n(&c[VS_CTL_RESULT0 / 8], result0, __ATOMIC_RELAXED);
    __atomic_store_n(&c[VS_CTL_RESULT1 / 8], result1, __ATOMIC_RELAXED);
    __atomic_store_n(&c[VS_CTL_RESULT2 / 8], vs_monotonic_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&c[VS_CTL_ACK_SEQ / 8], req->seq, __ATOMIC_RELEASE);
}

static inline vs_config vs_default_config(void) {
    vs_config c;
    memset(&c, 0, sizeof c);
    c.producer = VS_PRODUCER_TEST;
    c.ring_count = 2;
    c.rings[0].slots = 65536;
    c.rings[0].role = VS_ROLE_AGENT;
    c.rings[0].device = 0xffffffffu;
    c.rings[1].slots = 65536;
    c.rings[1].role = VS_ROLE_DEVICE;
    c.rings[1].device = 0xffffffffu;
    return c;
}

static inline size_t vs__align(size_t v, size_t a) { return (v + a - 1) / a * a; }

static inline void vs__put(uint8_t *b, size_t off, const void *v, size_t n) { memcpy(b + off, v, n); }

static inline void vs__text(uint8_t *b, size_t off, size_t cap, const char *s) {
    if (!s) return;
    size_t n = strlen(s);
    if (n > cap - 1) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* keep UTF-8 whole */
    }
    memcpy(b + off, s, n);
}

/* Up to `cap - 1` bytes of the file at `path`, NUL-terminated; the length,
   or -1 if it cannot be read. */
static inline ssize_t vs__read_text(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    return (ssize_t)n;
}

/* Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot
   (0 if unreadable). `pid` names a /proc entry: a number, or "self". */
static inline uint64_t vs__proc_start_time(const char *pid) {
    char path[288], buf[1024]; /* a /proc entry name is at most 255 bytes */
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    if (vs__read_text(path, buf, sizeof buf) <= 0) return 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p++; /* the space before field 3 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p + 1, ' '); /* the space before field + 1 */
    }
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* This process's start time (the header's `start_time`). */
static inline uint64_t vs__start_time(void) { return vs__proc_start_time("self"); }

static inline int vs__valid_tag(const char *t) {
    size_t n = strlen(t);
    if (n < 1 || n > 32) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

/* The segment's path: DIR/vramscope-UID-PID[-TAG]. Returns 0 or -1. */
static inline int vs__segment_path(vs_segment *seg, const vs_config *cfg, char *err, size_t errlen) {
    const char *dir = cfg->dir;
    if (!dir || !*dir) dir = getenv("VRAMSCOPE_SHM_DIR");
    if (!dir || !*dir) dir = "/dev/shm";
    unsigned uid = (unsigned)geteuid();
    unsigned pid = (unsigned)getpid();
    int n = cfg->tag ? snprintf(seg->path, sizeof seg->path, "%s/vramscope-%u-%u-%s", dir, uid, pid, cfg->tag)
                     : snprintf(seg->path, sizeof seg->path, "%s/vramscope-%u-%u", dir, uid, pid);
    if (n < 0 || (size_t)n >= sizeof seg->path) {
        snprintf(err, errlen, "vramscope: segment path too long under %s", dir);
        return -1;
    }
    return 0;
}

/* Lays out header, table, control block, then page-aligned rings: sets
   `*control` and `offsets`, returns the segment size (0: bad ring size). */
static inline size_t vs__layout(const vs_config *cfg, size_t *control, size_t offsets[VS_MAX_RINGS], char *err,
                                size_t errlen) {
    *control = vs__align(VS_HEADER_SIZE + cfg->ring_count * VS_RING_ENTRY_SIZE, 64);
    size_t at = vs__align(*control + VS_CONTROL_SIZE, 4096);
    for (uint32_t i = 0; i < cfg->ring_count; i++) {
        uint32_t s = cfg->rings[i].slots;
        if (s < 2 || s > (1u << 24) || (s & (s - 1))) {
            snprintf(err, errlen, "vramscope: ring %u: %u slots is not a power of two in 2..2^24", i, s);
            return 0;
        }
        offsets[i] = at;
        at = vs__align(at + VS_RING_HEADER_SIZE + (size_t)s * VS_SLOT_SIZE, 4096);
    }
    return at;
}

/* Random bits for a tag: /dev/urandom, else the clock and the pid. */
static inline uint64_t vs__random(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    return v ^ vs_monotonic_ns() ^ ((uint64_t)getpid() << 40);
}

/* The pid process `pid` (a /proc entry) calls itself: the last entry of
   the NSpid line of its status; `fallback` on a kernel without that line
   (before 4.1); -1 if unreadable. */
static inline long long vs__proc_ns_pid(const char *pid, long long fallback) {
    char path[288];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    long long last = fallback;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "NSpid:", 6) != 0) continue;
        last = -1;
        char *p = line + 6, *end;
        for (;;) {
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            last = v;
            p = end;
        }
        break;
    }
    free(line);
    fclose(f);
    return last;
}

/* Whether process `p` (a /proc entry) is the one that calls itself
   `ns_pid` and started at `start`. */
static inline int vs__is_producer(const char *p, uint32_t ns_pid, uint64_t start) {
    return vs__proc_start_time(p) == start && vs__proc_ns_pid(p, strtoll(p, NULL, 10)) == (long long)ns_pid;
}

/* Clock ticks since boot, the clock of start times, rounded up to the next
   second (whole seconds: no strtod, whose decimal point is the locale's);
   0 if unknown. */
static inline uint64_t vs__ticks_now(void) {
    char buf[128];
    long hz = sysconf(_SC_CLK_TCK);
    if (vs__read_text("/proc/uptime", buf, sizeof buf) <= 0 || hz <= 0) return 0;
    return (strtoull(buf, NULL, 10) + 1) * (uint64_t)hz;
}

/* Whether the producer (pid, start time) of a segment is gone, by the rule
   of FORMAT.md ("Liveness and hygiene"): no process here is pid `pid` of
   its own namespace with that start time (found by the NSpid lines of
   /proc, so a producer in a container is found from the host too), and
   this process sees every process (it runs in the root pid namespace).
   A producer that cannot be told (start time 0 or in the future, or not
   found from inside a pid namespace, where it may run unseen) is not gone. */
static inline int vs__producer_gone(uint32_t pid, uint64_t start) {
    uint64_t now = vs__ticks_now();
    if (start == 0 || now == 0 || start > now + 100) return 0;
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) != 0 || ns.st_ino != 0xEFFFFFFCu) return 0;
    char name[16];
    snprintf(name, sizeof name, "%u", pid);
    if (vs__is_producer(name, pid, start)) return 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9') found = vs__is_producer(e->d_name, pid, start);
    }
    closedir(d);
    return !found;
}

/* Whether the file at `path` is a stale segment of this user: a regular
   file of ours, mode 0600, holding a segment (magic, major, uid and size
   as readers check them) that is closed or whose producer is gone. `*id`
   gets the file that was checked: only that file may be removed. Anything
   else is kept: a live segment, one whose producer cannot be told,
   another user's file, a file that is not a segment (FORMAT.md, "Naming
   and creation"). No device, FIFO or link is ever opened. */
static inline int vs__stale_segment(const char *path, struct stat *id) {
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    uint8_t h[VS_HEADER_SIZE];
    int ok = fstat(fd, id) == 0 && id->st_dev == st.st_dev && id->st_ino == st.st_ino && S_ISREG(id->st_mode) &&
             pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h;
    close(fd);
    if (!ok) return 0;
    uint64_t magic, size, start;
    uint32_t pid, uid, state;
    uint16_t major;
    memcpy(&magic, h, 8);
    memcpy(&major, h + 8, 2);
    memcpy(&size, h + 16, 8);
    memcpy(&pid, h + 24, 4);
    memcpy(&uid, h + 28, 4);
    memcpy(&start, h + 32, 8);
    memcpy(&state, h + VS_OFF_STATE, 4);
    if (magic != VS_MAGIC || major != VS_MAJOR || uid != (uint32_t)geteuid() || size != (uint64_t)id->st_size)
        return 0;
    return state == 2 || vs__producer_gone(pid, start);
}

/* Removes `path` only if it still names the file `id`: renamed to a
   private name in its directory (never replacing anything), checked
   there, then unlinked, or renamed back. A newer producer given the same
   name meanwhile keeps its file. Returns 1 if removed. */
static inline int vs__remove_if_same(const char *path, const struct stat *id) {
#ifdef SYS_renameat2
    const char *slash = strrchr(path, '/');
    if (!slash) return 0;
    char tmp[640];
    int n = snprintf(tmp, sizeof tmp, "%.*s/.vramscope-unlink-%u-c%016llx", (int)(slash - path), path,
                     (unsigned)getpid(), (unsigned long long)vs__random());
    if (n < 0 || (size_t)n >= sizeof tmp) return 0;
    const unsigned noreplace = 1; /* RENAME_NOREPLACE */
    if (syscall(SYS_renameat2, AT_FDCWD, path, AT_FDCWD, tmp, noreplace) != 0) return 0;
    struct stat st;
    if (lstat(tmp, &st) == 0 && st.st_dev == id->st_dev && st.st_ino == id->st_ino) return unlink(tmp) == 0;
    syscall(SYS_renameat2, AT_FDCWD, tmp, AT_FDCWD, path, noreplace);
    return 0;
#else
    (void)path;
    (void)id;
    return 0; /* no rename without replacing: never remove */
#endif
}

/* A new file at `path` (O_EXCL), or -1 with errno. A stale segment of ours
   at that name is replaced (that very file only); anything else holding it
   is kept, and `held` (NUL-terminated, else empty) says what it is: the
   caller then takes a tagged name. */
static inline int vs__open_new(const char *path, char *held, size_t heldlen) {
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    held[0] = 0;
    int fd = open(path, flags, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
    struct stat id;
    if (vs__stale_segment(path, &id) && vs__remove_if_same(path, &id)) {
        fd = open(path, flags, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    struct stat st;
    if (lstat(path, &st) == 0 && st.st_uid != geteuid())
        snprintf(held, heldlen, "a file of uid %ld that this process cannot remove", (long)st.st_uid);
    else
        snprintf(held, heldlen, "a file of ours that is not a stale segment (a live producer's, or one that cannot be told)");
    errno = EEXIST;
    return -1;
}

/* Opens the segment's file, new, at `seg->path`. When that name is held by
   anything but a stale segment of ours (another user's file, a live
   segment, one whose producer cannot be told), takes a tagged name instead
   (DIR/vramscope-UID-PID-[TAG_]rXXXXXXXXXX, FORMAT.md "Naming and
   creation"), updates `seg->path` and says so in one line on stderr.
   Returns the descriptor, or -1 with a message in `err`. */
static inline int vs__create_file(vs_segment *seg, const vs_config *cfg, char *err, size_t errlen) {
    char held[128];
    int fd = vs__open_new(seg->path, held, sizeof held);
    if (fd < 0 && held[0]) {
        char first[sizeof seg->path];
        memcpy(first, seg->path, sizeof first);
        const char *dir = cfg->dir;
        if (!dir || !*dir) dir = getenv("VRAMSCOPE_SHM_DIR");
        if (!dir || !*dir) dir = "/dev/shm";
        for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
            unsigned long long r = (unsigned long long)(vs__random() & 0xffffffffffull);
            int n = cfg->tag ? snprintf(seg->path, sizeof seg->path, "%s/vramscope-%u-%u-%.20s_r%010llx", dir,
                                        (unsigned)geteuid(), (unsigned)getpid(), cfg->tag, r)
                             : snprintf(seg->path, sizeof seg->path, "%s/vramscope-%u-%u-r%010llx", dir,
                                        (unsigned)geteuid(), (unsigned)getpid(), r);
            if (n < 0 || (size_t)n >= sizeof seg->path) {
                snprintf(err, errlen, "vramscope: segment path too long under %s", dir);
                return -1;
            }
            fd = open(seg->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0 && errno != EEXIST) break;
        }
        if (fd >= 0) {
            const char *base = strrchr(seg->path, '/');
            fprintf(stderr, "vramscope: %s is taken by %s; using %s\n", first, held, base ? base + 1 : seg->path);
            fflush(stderr);
        }
    }
    if (fd < 0) snprintf(err, errlen, "vramscope: cannot create %s: %s", seg->path, strerror(errno));
    return fd;
}

/* Creates the segment's file (see vs__create_file) with `size` bytes
   reserved and maps it. Returns the mapping, or NULL with no file left
   behind. */
static inline void *vs__map_new(vs_segment *seg, const vs_config *cfg, size_t size, char *err, size_t errlen) {
    const char *path = seg->path;
    int fd = vs__create_file(seg, cfg, err, errlen);
    if (fd < 0) return NULL;
    /* tmpfs allocates pages lazily: reserve them now, so that a full
       /dev/shm is an error here rather than a SIGBUS later, inside the
       allocator callback. */
    int rc = 0;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)size) != 0) rc = errno;
    if (rc == 0) rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc != 0) {
        snprintf(err, errlen, "vramscope: cannot reserve %zu bytes for %s: %s", size, path, strerror(rc));
        close(fd);
        unlink(path);
        return NULL;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "vramscope: cannot map %s: %s", path, strerror(errno));
        unlink(path);
        return NULL;
    }
    return base;
}

/* The header and ring table, all but the magic, into `hdr` (zeroed). */
static inline void vs__fill_header(uint8_t *hdr, const vs_config *cfg, size_t control, size_t size,
                                   const size_t offsets[VS_MAX_RINGS]) {
    uint16_t major = VS_MAJOR, minor = VS_MINOR;
    uint32_t hsize = VS_HEADER_SIZE, ring_count = cfg->ring_count, table = VS_HEADER_SIZE;
    uint32_t ctl = (uint32_t)control, ctl_size = VS_CONTROL_SIZE;
    uint32_t upid = (uint32_t)getpid(), uuid = (uint32_t)geteuid();
    uint64_t size64 = size, start = vs__start_time();
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t created = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    vs__put(hdr, 8, &major, 2);
    vs__put(hdr, 10, &minor, 2);
    vs__put(hdr, 12, &hsize, 4);
    vs__put(hdr, 16, &size64, 8);
    vs__put(hdr, 24, &upid, 4);
    vs__put(hdr, 28, &uuid, 4);
    vs__put(hdr, 32, &start, 8);
    vs__put(hdr, 40, &cfg->producer, 4);
    vs__put(hdr, 44, &cfg->flags, 4);
    vs__put(hdr, 48, &created, 8);
    vs__put(hdr, 56, &ring_count, 4);
    vs__put(hdr, 60, &table, 4);
    vs__put(hdr, 64, &ctl, 4);
    vs__put(hdr, 68, &ctl_size, 4);
    vs__text(hdr, 88, 32, cfg->framework);
    vs__text(hdr, 120, 64, cfg->label);
    for (uint32_t i = 0; i < cfg->ring_count; i++) {
        size_t e = VS_HEADER_SIZE + i * VS_RING_ENTRY_SIZE;
        uint64_t off = offsets[i];
        uint32_t slots = cfg->rings[i].slots, slot_size = VS_SLOT_SIZE;
        vs__put(hdr, e, &off, 8);
        vs__put(hdr, e + 8, &slots, 4);
        vs__put(hdr, e + 12, &slot_size, 4);
        vs__put(hdr, e + 16, &cfg->rings[i].role, 4);
        vs__put(hdr, e + 20, &cfg->rings[i].device, 4);
    }
}

/*
 * Creates and publishes a segment for this process. Returns 0, or -1 with a
 * message in `err`. Never leaves a half-made file behind on failure.
 */
static inline int vs_segment_create(vs_segment *seg, const vs_config *cfg, char *err, size_t errlen) {
    memset(seg, 0, sizeof *seg);
    if (cfg->ring_count < 1 || cfg->ring_count > VS_MAX_RINGS) {
        snprintf(err, errlen, "vramscope: %u rings requested, 1 to %d allowed", cfg->ring_count, VS_MAX_RINGS);
        return -1;
    }
    if (cfg->tag && !vs__valid_tag(cfg->tag)) {
        snprintf(err, errlen, "vramscope: bad segment tag '%s'", cfg->tag);
        return -1;
    }
    if (vs__segment_path(seg, cfg, err, errlen) != 0) return -1;
    size_t control, offsets[VS_MAX_RINGS];
    size_t size = vs__layout(cfg, &control, offsets, err, errlen);
    if (size == 0) return -1;
    void *base = vs__map_new(seg, cfg, size, err, errlen);
    if (!base) return -1;
    uint8_t hdr[VS_HEADER_SIZE + VS_MAX_RINGS * VS_RING_ENTRY_SIZE];
    memset(hdr, 0, sizeof hdr);
    vs__fill_header(hdr, cfg, control, size, offsets);
    /* Header words go in with relaxed atomic stores (the file is fresh and
       zeroed); the magic is stored last with release ordering. */
    uint64_t *words = (uint64_t *)base;
    size_t nwords = (VS_HEADER_SIZE + cfg->ring_count * VS_RING_ENTRY_SIZE) / 8;
    for (size_t i = 1; i < nwords; i++) {
        uint64_t v;
        memcpy(&v, hdr + 8 * i, 8);
        __atomic_store_n(&words[i], v, __ATOMIC_RELAXED);
    }
    seg->base = (uint8_t *)base;
    seg->size = size;
    seg->control_offset = (uint32_t)control;
    seg->ring_count = cfg->ring_count;
    for (uint32_t i = 0; i < cfg->ring_count; i++) {
        uint64_t *r = (uint64_t *)(seg->base + offsets[i]);
        seg->rings[i].head = r;
        seg->rings[i].dropped = r + 1;
        seg->rings[i].slots = (uint64_t *)(seg->base + offsets[i] + VS_RING_HEADER_SIZE);
        seg->rings[i].mask = cfg->rings[i].slots - 1;
    }
    __atomic_store_n((uint32_t *)(seg->base + VS_OFF_STATE), 1u, __ATOMIC_RELAXED);
    vs_heartbeat(seg);
    __atomic_store_n(&words[0], VS_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* Marks the segment closed, removes its file and unmaps it. */
static inline void vs_segment_close(vs_segment *seg) {
    if (!seg->base) return;
    __atomic_store_n((uint32_t *)(seg->base + VS_OFF_STATE), 2u, __ATOMIC_RELEASE);
    unlink(seg->path);
    munmap(seg->base, seg->size);
    seg->base = NULL;
}

/* Unmaps without unlinking: for a forked child, whose parent still owns the
   segment. The child must not write into it. */
static inline void vs_segment_forget(vs_segment *seg) {
    if (!seg->base) return;
    munmap(seg->base, seg->size);
    seg->base = NULL;
}

#ifdef __cplusplus
}
#endif
#endif /* VRAMSCOPE_RING_H */

#!/usr/bin/env python3
"""Writes the seeds of the `snapshot_shared` fuzz target
(fuzz/seeds/snapshot_shared/): small snapshot pickles, written opcode by
opcode, whose values are memo references shared many times, each a small
version of an attack on `vramscope open` (tests/hostile/pickles.rs):

    scripts/fuzz_seeds_shared.py [DIR]
"""
import os
import struct
import sys


class Pickle:
    """A pickle (protocol 4); dict keys written once, then from the memo."""

    def __init__(self):
        self.b = bytearray(b"\x80\x04")
        self.memo = 0
        self.keys = {}

    def op(self, x):
        self.b += x
        return self

    def memoize(self):
        self.b += b"\x94"
        self.memo += 1
        return self.memo - 1

    def get(self, i):
        self.b += b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
        return self

    def again(self, i, n):
        for _ in range(n):
            self.get(i)
        return self

    def str(self, t):
        t = t.encode()
        self.b += b"\x8c" + bytes([len(t)]) if len(t) < 256 else b"X" + struct.pack("<I", len(t))
        self.b += t
        return self

    def int(self, v):
        if v < 1 << 8:
            self.b += b"K" + bytes([v])
        elif v < 1 << 16:
            self.b += b"M" + struct.pack("<H", v)
        else:
            self.b += b"\x8a\x08" + struct.pack("<Q", v)
        return self

    def key(self, k):
        if k in self.keys:
            return self.get(self.keys[k])
        self.str(k)
        self.keys[k] = self.memoize()
        return self

    def dict(self):
        self.b += b"}"
        i = self.memoize()
        self.b += b"("
        return i

    def list(self):
        self.b += b"]"
        i = self.memoize()
        self.b += b"("
        return i

    def end_dict(self):
        return self.op(b"u")

    def end_list(self):
        return self.op(b"e")

    def stop(self):
        return bytes(self.b + b".")


def shared_blocks(blocks, segments):
    p = Pickle()
    p.dict()
    p.key("segments").list()
    s = p.dict()
    p.key("address").int(1 << 20).key("total_size").int(1 << 40)
    p.key("blocks").list()
    b = p.dict()
    p.key("size").int(512).key("state").str("inactive").end_dict()
    p.again(b, blocks - 1).end_list().end_dict()
    p.again(s, segments - 1).end_list().end_dict()
    return p.stop()


def shared_filename(frames, length):
    p = Pickle()
    p.dict()
    p.key("segments").list()
    p.dict()
    p.key("address").int(0).key("total_size").int(2 << 20)
    p.key("frames").list()
    p.dict()
    p.key("filename").str("x" * length)
    name = p.memoize()
    p.key("line").int(0).key("name").str("f").end_dict()
    for i in range(1, frames):
        p.op(b"}(").key("filename").get(name).key("line").int(i).end_dict()
    p.end_list().end_dict().end_list().end_dict()
    return p.stop()


def shared_settings(keys, fan, length):
    p = Pickle()
    p.dict()
    p.key("segments").list()
    p.end_list()
    p.key("allocator_settings").dict()
    p.str("k0")
    outer = p.list()
    inner = p.list()
    p.str("s" * length)
    s = p.memoize()
    p.again(s, fan - 1).end_list()
    p.again(inner, fan - 1).end_list()
    for k in range(1, keys):
        p.str("k%d" % k).get(outer)
    p.end_dict().end_dict()
    return p.stop()


def shared_trace(n, entry):
    p = Pickle()
    p.dict()
    p.key("segments").list()
    p.end_list()
    p.key("device_traces").list()
    p.list()
    e = p.dict()
    entry(p)
    p.end_dict()
    p.again(e, n - 1).end_list().end_list().end_dict()
    return p.stop()


def stack(p, depth, length):
    p.key("frames").list()
    f = p.dict()
    p.key("filename").str("x" * length)
    p.key("line").int(1).key("name").str("f").end_dict()
    p.again(f, depth - 1).end_list()


def oom(p):
    p.key("action").str("oom").key("device_free").int(0).key("size").int(1 << 30)
    stack(p, 200, 300)


def alloc(p):
    p.key("action").str("alloc").key("addr").int(0x10000).key("size").int(512)
    stack(p, 200, 300)


def maps(segments, events):
    p = Pickle()
    p.dict()
    p.key("segments").list()
    for i in range(segments):
        p.op(b"}(").key("address").int((i + 1) << 21).key("total_size").int(2 << 20)
        p.key("is_expandable").op(b"\x88").end_dict()
    p.end_list()
    p.key("device_traces").list()
    p.list()
    top = (segments + 2) << 21
    m = p.dict()
    p.key("action").str("segment_map").key("addr").int(top).key("size").int(2 << 20).end_dict()
    u = p.dict()
    p.key("action").str("segment_unmap").key("addr").int(top).key("size").int(2 << 20).end_dict()
    for _ in range(events // 2 - 1):
        p.get(m).get(u)
    p.end_list().end_list().end_dict()
    return p.stop()


def marks(depth, ops):
    b = bytearray(b"\x80\x04]\x94N\x940" + b"(" * depth + b"h\x00")
    for _ in range(ops):
        b += b"NaNq\x010"
    return bytes(b + b".")


SEEDS = {
    "shared-blocks": shared_blocks(300, 300),
    "shared-filename": shared_filename(200, 1000),
    "shared-settings": shared_settings(4, 16, 256),
    "shared-oom-stack": shared_trace(300, oom),
    "shared-alloc-stack": shared_trace(300, alloc),
    "shared-entries": shared_trace(1500, lambda p: p.key("action").str("alloc")
                                   .key("addr").int(0x10000).key("size").int(512)),
    "maps": maps(64, 1000),
    "marks": marks(64, 300),
}


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "fuzz/seeds/snapshot_shared")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            f.write(data)
        print("%s.pickle: %d bytes" % (name, len(data)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""check_includes.py SOURCE_DIR - the rooms' one-way order, read off every
#include "..." of the sources (DESIGN.md section 3, issue 38):

  common/ -> kernels/, shm/, lifecycle/ (and proto/) -> store/ -> persist/ -> daemon/

A room may include its own headers and those of rooms before it, never after
it; client/ (and python/) use proto/, shm/, kernels/, common/ and never the
log (libraries never print); bench/ uses store/, never persist/ or daemon/;
tools/ and examples/ never store/, persist/ or daemon/.  Fails on any include
against that order, on any circle of includes between folders, and on any
circle between modules (foo.c with foo.h) of one folder (kernels/ excepted).  Prints each
violation with file and line, then the include counts, and exits 1 on any."""
import collections
import os
import re
import sys

RANK = {"common": 0, "commitkv": 0, "proto": 1, "kernels": 1, "shm": 1, "lifecycle": 1,
        "store": 2, "persist": 3, "daemon": 4}
# Rooms outside the chain and what they may include (None: anything).
SIDE = {
    "client": {"common", "commitkv", "proto", "shm", "kernels", "client"},
    "python": {"common", "commitkv", "proto", "shm", "kernels", "client", "python"},
    "bench": {"common", "commitkv", "proto", "shm", "kernels", "lifecycle", "store", "client", "examples", "bench"},
    "tools": {"common", "commitkv", "proto", "shm", "kernels", "lifecycle", "client", "examples", "tools"},
    "examples": {"common", "commitkv", "proto", "shm", "kernels", "lifecycle", "client", "examples"},
    "tests": None,
}
NEVER = {("client", "common/log.h"), ("python", "common/log.h")}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def room_of(rel):
    parts = rel.split("/")
    if parts[0] == "client" and len(parts) > 2 and parts[1] == "include":
        return "commitkv"
    return parts[0]


def sources(root):
    for top in sorted(set(RANK) | set(SIDE)):
        base = os.path.join(root, top if top != "commitkv" else "client/include/commitkv")
        for d, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    full = os.path.join(d, f)
                    yield os.path.relpath(full, root)


def target_path(root, rel, inc):
    """The repository path an include names (by path from the root, or beside the file)."""
    if "/" in inc:
        first = inc.split("/")[0]
        if first == "commitkv":
            return "client/include/" + inc
        if first in RANK or first in SIDE:
            return inc
    beside = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
    return beside if os.path.exists(os.path.join(root, beside)) else None


def allowed(src_room, dst_room, inc):
    if (src_room, inc) in NEVER:
        return False
    if src_room == dst_room:
        return True
    if src_room in RANK:
        # below, or a sibling on the same floor (common/ and the public headers; kernels/, shm/, lifecycle/)
        return dst_room in RANK and RANK[dst_room] <= RANK[src_room] and RANK[src_room] <= 1 or (
            dst_room in RANK and RANK[dst_room] < RANK[src_room])
    rule = SIDE.get(src_room)
    return rule is None or dst_room in rule


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = []
    folder_graph = collections.defaultdict(set)
    file_graph = collections.defaultdict(set)
    counts = collections.Counter()
    for rel in sources(root):
        src_room = room_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                dst = target_path(root, rel, m.group(1))
                if dst is None:
                    continue  # a generated header (proto/*.pb-c.h in the build tree) or a system one in quotes
                dst_room = room_of(dst)
                counts[src_room] += 1
                if not allowed(src_room, dst_room, m.group(1)):
                    bad.append(f"{rel}:{n}: {src_room}/ includes \"{m.group(1)}\" ({dst_room}/), against the order")
                if src_room != dst_room and src_room != "tests" and dst_room != "commitkv":
                    folder_graph[src_room].add(dst_room)
                # modules: foo.c and foo.h are one node
                src_mod, dst_mod = os.path.splitext(rel)[0], os.path.splitext(dst)[0]
                if src_room == dst_room and src_room != "tests" and dst_mod != src_mod:
                    file_graph[src_mod].add(dst_mod)
    for comp in circles(folder_graph):
        bad.append("include circle between folders: " + " -> ".join(comp))
    for comp in circles(file_graph):
        room = room_of(comp[0])
        if room != "kernels":
            bad.append(f"{room}/: include circle of {len(comp)} modules: " + ", ".join(comp))
    for line in bad:
        print("check_includes: " + line)
    print("check_includes: includes by room: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"check_includes: {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

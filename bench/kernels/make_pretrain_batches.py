#!/usr/bin/env python3
"""Builds Pretrain-recipe server batches for the kernel benchmark from /work/shared/data/doclen_pretrain.json
(DistCA recipe, see /work/shared/data/README.md): split at 64K, keep 90% of the shorter documents, repeat
the longer ones twice, shuffle (fixed seed), scale by context/65536, pack into buffers of `context` tokens
(an overflowing document is cut and its remainder starts the next buffer). Writes pretrain_batches.txt:
one batch per line, "name len len len ...", each length one causal segment. The GPU machine has no copy
of the data file, so the output is committed next to the benchmark."""
import json
import random
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/doclen_pretrain.json"
rng = random.Random(20251021)
lengths = json.load(open(SRC))
docs = []
for n in lengths:
    if n > 65536:
        pieces = [65536] * (n // 65536) + ([n % 65536] if n % 65536 else [])
        docs += pieces + pieces  # longer documents: split at 64K, repeated twice
    elif rng.random() < 0.9:
        docs.append(n)
rng.shuffle(docs)


def buffers(context, count):
    scaled = [max(1, round(n * context / 65536)) for n in docs]
    out, cur, room = [], [], context
    for n in scaled:
        while n > 0:
            take = min(n, room)
            cur.append(take)
            n -= take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], context
                if len(out) == count:
                    return out
    return out


def cost(batch):
    return sum(q * q for q in batch)


lines = []
b64 = buffers(65536, 32)
lines.append(("pretrain_64k_buf0", b64[0]))
heavy = max(range(len(b64)), key=lambda i: cost(b64[i]))
lines.append(("pretrain_64k_heaviest_of32", b64[heavy]))
light = min(range(len(b64)), key=lambda i: cost(b64[i]))
lines.append(("pretrain_64k_lightest_of32", b64[light]))
b128 = buffers(131072, 1)
lines.append(("pretrain_128k_buf0", b128[0]))
with open("pretrain_batches.txt", "w") as f:
    for name, batch in lines:
        f.write(name + " " + " ".join(map(str, batch)) + "\n")
for name, batch in lines:
    print(name, len(batch), "segments, tokens", sum(batch), "max", max(batch))

#!/bin/bash
# How much of each server's attention work in run 24's 64K batches is on the rank's own documents (so could run
# before any moved row arrives): the trainer's batches (train_llama.py cached_batch, 2 ranks, 65536 tokens, seeds of
# steps 1-3's two micro-batches), planned by prefix_aware with `cad plan --lengths` (each rank's documents fill its
# buffer exactly, so no document spans ranks, as in the trainer). CPU only; from the repository root after a build.
set -euo pipefail
for seed in 1001 1002 2001 2002 3001 3002; do
  PYTHONPATH=host_adapter/python python3 -c "
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('tl', 'examples/train_llama.py'); tl = importlib.util.module_from_spec(spec)
sys.modules['tl'] = tl; spec.loader.exec_module(tl)
batch = tl.cached_batch(json.load(open('../shared/data/doclen_pretrain.json')), 65536, 2, $seed)
json.dump([n for docs in batch for n in (docs or [65536])], open('/tmp/own_rows_batch.json', 'w'))"
  build/bin/cad plan --lengths /tmp/own_rows_batch.json --ranks 2 --context 65536 --balancer prefix_aware --json --tasks |
    python3 -c "
import json, sys
d = json.load(sys.stdin); plan = d['balancers'][0]
owner = {doc: r for r, pieces in enumerate(d['pieces']) for doc, _, _, _ in pieces}
total, own = [0, 0], [0, 0]
for doc, qb, qe, s in plan['task_list']:
    work = (qe * (qe + 1) - qb * (qb + 1)) // 2
    total[s] += work
    own[s] += work if owner[doc] == s else 0
mean = sum(d['cost_before']) / 2
print($seed, 'load before / mean', [round(c / mean, 2) for c in d['cost_before']],
      'own-document share of each server', [round(o / t, 2) for o, t in zip(own, total)])"
done

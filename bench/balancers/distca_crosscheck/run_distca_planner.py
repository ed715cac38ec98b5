#!/usr/bin/env python3
"""Runs DistCA's own planner (Planner.plan_items in distca/planner/planner.py of a hao-ai-lab/DistCA
checkout) on one batch of whole documents and prints the query rows each server computes, one
"doc begin end server" line per task, touching rows of one document on one server merged (as our
plans are). Its heavy imports (torch, rich, distca.runtime) are replaced by empty stand-ins: the
planning code does not use them.

usage: run_distca_planner.py PLANNER_PY BATCHES_JSON TOLERANCE
  BATCHES_JSON: [[doc lengths of rank 0], [rank 1], ...]; documents are numbered in that order.
"""
import importlib.util
import json
import sys
import types


def stub_modules():
    for name in ["torch", "rich", "rich.console", "rich.panel", "rich.table", "distca", "distca.runtime",
                 "distca.runtime.compute_metadata", "distca.runtime.shard_info"]:
        sys.modules[name] = types.ModuleType(name)
    torch, rich = sys.modules["torch"], sys.modules["rich"]
    torch.dtype, torch.bfloat16, torch.Tensor = object, None, object
    rich.print = print
    rich.console = sys.modules["rich.console"]
    rich.console.Console, rich.console.RenderResult = object, object
    sys.modules["rich.panel"].Panel = object
    sys.modules["rich.table"].Table = object
    sys.modules["distca.runtime.compute_metadata"].from_planner_output = None
    for name in ["ShardInfo", "handle_planner_metadata", "items_into_shardinfos"]:
        setattr(sys.modules["distca.runtime.shard_info"], name, None)


def main():
    planner_py, batches_json, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    stub_modules()
    spec = importlib.util.spec_from_file_location("distca_planner", planner_py)
    planner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planner)
    batches = json.load(open(batches_json))
    # Our cost model's defaults: Hq = 32, Hkv = 8, D = 128.
    model = types.SimpleNamespace(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8)
    items = planner.batch_to_items_class(batches, model)
    p = planner.Planner.__new__(planner.Planner)  # __init__ wants Megatron's parallel config
    p.model_config, p.attention_server_world_size, p.tolerance_factor = model, len(batches), tolerance
    rows = []
    for item in p.plan_items(items):
        for chunk in item.items:
            if chunk["q"] > 0:
                rows.append([item.seqid, chunk["kv"] - chunk["q"], chunk["kv"], item.gpuid])
    rows.sort(key=lambda r: (r[3], r[0], r[1]))
    merged = []
    for r in rows:
        if merged and merged[-1][3] == r[3] and merged[-1][0] == r[0] and merged[-1][2] == r[1]:
            merged[-1][2] = r[2]
        else:
            merged.append(r)
    for r in merged:
        print(*r)


if __name__ == "__main__":
    main()

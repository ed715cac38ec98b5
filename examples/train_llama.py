#!/usr/bin/env python3
"""Train a transformers Llama model (random weights from a config, nothing downloaded) on packed Pretrain-recipe
batches, with attention on CAD or local, under torchrun (or as one process).

    torchrun --nproc-per-node 4 examples/train_llama.py --attention cad --balancer prefix_aware \
        --context 4096 --layers 2 --steps 10 --device cpu

Batches follow the DistCA recipe over ../shared/data/doclen_pretrain.json (the same generator as the C++
host_adapter/workload/batch_recipe.cpp, so a seed gives the batch `cad demo` uses): documents cut at 64K (long
chunks twice), 90% of the rest kept, shuffled, scaled by context/64K, packed into one buffer of --context tokens
per rank (a document cut by a buffer end continues as its own document on the next rank). Each rank's buffer is
one packed sequence (position_ids restart per document); gradients are averaged over the ranks (data parallel).
Per step: loss, tokens/s, every rank's attention time, the attention imbalance; then a summary.
"""
import argparse
import json
import math
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parent.parent
MASK64 = (1 << 64) - 1


# ---- the DistCA batch recipe (a port of host_adapter/workload/batch_recipe.cpp) ------------------------
class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        limit = MASK64 - MASK64 % n
        while True:
            x = self.next()
            if x < limit:
                return x % n


def recipe_documents(lengths, context, seed, split=65536):
    rng, docs = SplitMix64(seed), []
    for n in lengths:
        while n >= split:
            docs += [split, split]
            n -= split
        if n > 0 and rng.uniform() < 0.9:
            docs.append(n)
    for i in range(len(docs), 1, -1):
        j = rng.below(i)
        docs[i - 1], docs[j] = docs[j], docs[i - 1]
    scale = context / split
    return [max(1, int(math.floor(d * scale + 0.5))) for d in docs]  # llround for positive values


def sample_batch(lengths, context, ranks, seed):
    """Per rank, the document lengths of its buffer (pieces of cut documents count as documents here)."""
    docs = recipe_documents(lengths, context, seed)
    pass_ = 1
    while sum(docs) < context * ranks and pass_ < 1024:
        docs += recipe_documents(lengths, context, seed + pass_)
        pass_ += 1
    out, rank, room = [[] for _ in range(ranks)], 0, context
    for n in docs:
        if rank >= ranks:
            break
        n = min(n, room + (ranks - 1 - rank) * context)
        while n > 0:
            take = min(n, room)
            out[rank].append(take)
            n, room = n - take, room - take
            if room == 0:
                rank, room = rank + 1, context
    return out


def causal_cost(lengths):
    return sum(n * (n + 1) // 2 for n in lengths)


# ---- the model and one step ---------------------------------------------------------------------------
def build_model(args, device, dtype):
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig

    cad.hf.register()
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate or args.hidden * 3, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.context, 2048),
                         attention_dropout=0.0)
    torch.manual_seed(args.seed)  # the same weights on every rank
    implementation = "cad" if args.attention == "cad" else "cad_local"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=dtype)
    return model.to(device)


def make_inputs(doc_lengths, vocab, seed, device):
    total = sum(doc_lengths)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (1, total), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in doc_lengths]).unsqueeze(0)
    labels = input_ids.clone()
    starts = torch.tensor([0] + doc_lengths[:-1]).cumsum(0)
    labels[0, starts] = -100  # never predict a document's first token from the previous document
    return {k: t.to(device) for k, t in dict(input_ids=input_ids, position_ids=position_ids, labels=labels).items()}


def all_gather_floats(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    if world == 1:
        return [t.tolist()]
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=_cpu_group())
    return [o.tolist() for o in out]


_GROUP = {}


def _cpu_group():
    if "g" not in _GROUP:
        _GROUP["g"] = dist.new_group(backend="gloo")
    return _GROUP["g"]


def average_gradients(model, world, backend):
    if world == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    on_host = backend == "gloo" and flat.is_cuda
    buffer = flat.cpu() if on_host else flat
    dist.all_reduce(buffer)
    buffer /= world
    if on_host:
        flat.copy_(buffer)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


def train(args):
    import cad
    import cad.hf

    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    # NCCL for the gradients only where CAD uses NCCL too (one process per GPU); processes sharing a GPU
    # (communicator host or mpi) average their gradients over gloo.
    backend = "nccl" if args.device == "cuda" and args.communicator in (None, "nccl") else "gloo"
    if distributed:
        dist.init_process_group(backend)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    cad.init(balancer=args.balancer, communicator=args.communicator, timeout_ms=args.timeout_ms)
    cad.timing(sync_cuda=True)
    lengths = json.loads(pathlib.Path(args.data).read_text())
    model = build_model(args, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    history = []
    for step in range(args.steps):
        batch = sample_batch(lengths, args.context, world, args.seed + 1000 * step)
        mine = batch[rank] or [args.context]
        inputs = make_inputs(mine, args.vocab, args.seed * 7919 + 31 * step + rank, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        cad.attention_time(reset=True)
        loss = model(**inputs).loss
        loss.backward()
        average_gradients(model, world, backend)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        attention = cad.attention_time(reset=True)
        plan = cad.hf.current_plan() if args.attention == "cad" else None
        stats = plan.stats if plan is not None else None
        gathered = all_gather_floats([loss.item(), seconds, attention, float(sum(mine))], world)
        costs = [causal_cost(b) for b in batch]
        colocated = max(costs) / (sum(costs) / len(costs))
        imbalance = stats["imbalance"] if stats else colocated
        record = {"step": step, "loss": sum(g[0] for g in gathered) / world,
                  "losses": [g[0] for g in gathered],
                  "tokens_per_s": sum(g[3] for g in gathered) / max(g[1] for g in gathered),
                  "attention_s": [g[2] for g in gathered], "imbalance": imbalance, "colocated_imbalance": colocated}
        history.append(record)
        if rank == 0:
            print(f"step {step:3d}  loss {record['loss']:.5f}  {record['tokens_per_s']:9.0f} tok/s  attention s/rank "
                  f"[{', '.join(f'{a:.3f}' for a in record['attention_s'])}]  imbalance {imbalance:.3f} "
                  f"(colocated {colocated:.3f})", flush=True)
    if rank == 0:
        tail = history[1:] or history
        summary = {"attention": args.attention, "balancer": args.balancer if args.attention == "cad" else None,
                   "ranks": world, "context": args.context, "layers": args.layers, "steps": args.steps,
                   "hidden": args.hidden, "intermediate": args.intermediate or args.hidden * 3,
                   "device": str(device), "dtype": args.dtype,
                   "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
                   "mean_tokens_per_s_after_step0": sum(r["tokens_per_s"] for r in tail) / len(tail),
                   "mean_max_attention_s": sum(max(r["attention_s"]) for r in tail) / len(tail),
                   "mean_imbalance": sum(r["imbalance"] for r in tail) / len(tail)}
        print("summary " + json.dumps(summary), flush=True)
        if args.json_out:
            pathlib.Path(args.json_out).write_text(json.dumps({"summary": summary, "steps": history}, indent=1))
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", choices=["local", "cad"], default="cad")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", default=None, help="host, mpi or nccl (default: host on CPU, nccl on CUDA)")
    p.add_argument("--context", type=int, default=2048, help="tokens per rank and step")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=0,
                   help="MLP width (Llama's intermediate_size; Llama-3 8B: 14336); default 3 x --hidden")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--json-out", default=None, help="write every step's record and the summary here (rank 0)")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.intermediate < 0:
        p.error(f"--intermediate must be positive (or 0 for 3 x --hidden), got {args.intermediate}")
    return args


if __name__ == "__main__":
    train(parse_args())
    sys.exit(0)

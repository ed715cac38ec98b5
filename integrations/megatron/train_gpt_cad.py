#!/usr/bin/env python3
"""A minimal Megatron-Core training script (megatron-core from PyPI): a GPT (Megatron's GPTModel on its local,
non-Transformer-Engine layer spec) trained data parallel over torch.distributed on packed documents, with
Megatron-Core's own attention or CAD as the core attention, under torchrun (or as one process).

    torchrun --nproc-per-node 2 integrations/megatron/train_gpt_cad.py --device cpu --configs megatron,cad
    torchrun --nproc-per-node 2 integrations/megatron/train_gpt_cad.py --device cuda --model llama3-8b \
        --layers 4 --vocab 32768 --context 65536 --configs local,cad --json-out 'run_{config}.json'
    torchrun --nproc-per-node 8 integrations/megatron/train_gpt_cad.py --device cuda --model llama3-8b \
        --tensor-parallel-size 2 --pipeline-parallel-size 2 --sequence-parallel --micro-batches 4 --configs te,cad

Trainers (--trainer): 'megatron' (default on CUDA) is Megatron-Core's own: its DistributedDataParallel, its
distributed optimizer (fp32 master weights) and get_forward_backward_func (1F1B with --pipeline-parallel-size > 1),
through cad_megatron_schedule; tensor (--tensor-parallel-size, --sequence-parallel: Transformer Engine's layer spec,
whose norms take sequence parallelism), pipeline and context parallel sizes > 1 train there. 'torch' (the CPU's:
Megatron-Core 0.16 allocates its DDP buffers and schedule state on CUDA) is torch's DistributedDataParallel and
AdamW on the model's parameters, tensor and pipeline parallel size 1.

Configurations (--configs, trained one after another from the same weights):
  megatron  Megatron-Core's DotProductAttention (the local spec's core attention) on each document
            (cad_megatron.PerDocumentDotProductAttention; DotProductAttention refuses packed input): memory
            O(heads x longest document^2), short contexts only;
  te        Megatron-Core's Transformer Engine spec (TEDotProductAttention, THD): only where transformer_engine
            imports (skipped with a note otherwise);
  local     CadCoreAttention without plans: the project's varlen kernels on each rank's own documents;
  local_balanced  'local' on the micro-batches made balanced (every rank keeps its tokens, its documents cut to
            equal lengths whose causal work is the mean rank's: examples/train_llama.py's balanced_documents):
            the measured ideal that perfect balance would give, everything else as in the real batch;
  cad       CadCoreAttention with a CAD plan per micro-batch, made ahead (attach_plan(ahead=True)) when the micro-batch
            before it starts; 'cad+now' makes no plan in the loop: each micro-batch's first CAD layer makes it
            from packed_seq_params.cu_seqlens_q (collective there).

Context parallelism (--context-parallel-size N > 1, cad and cad+now only): CAD is the context parallelism. A step's
micro-batch is the recipe's documents for the world / N data-parallel replicas at N x --context tokens each, laid
in order over all ranks (data x context) by cad.pack_documents (cad_megatron_cp.pack_for_context_parallel): a
document is cut wherever a rank's --context tokens end and CAD attends it whole; positions run on across a cut,
and the label of a piece's last token is the next rank's first. DDP averages over the data x context group.
--layout cad gives the same layout at N = 1: one process with --context N x C trains the losses that N ranks with
--context-parallel-size N --context C train (the documents never cut). RoPE is exact there: each token's angle
from its position in its document (cad_megatron_rope), not Megatron's head/tail split.

Data: the DistCA batch recipe of examples/train_llama.py over ../shared/data/doclen_pretrain.json (--data):
documents cut at 64K, scaled by context/64K, packed into --context tokens per rank and micro-batch; a
micro-batch is one packed THD sequence per rank (PackedSeqParams qkv_format='thd', position ids restarting per
document). Tokens are random (seeded); labels are the next token of the same document (a document's last token
predicts nothing). The loss is the token-weighted mean over every rank's tokens of the step.

Model: TransformerConfig with RMSNorm, SwiGLU, no biases, no dropout; RoPE on CUDA, learned absolute positions on
the CPU by default (--position-embedding rope computes RoPE on the CPU too, cad_megatron_rope.rope_on_cpu); bf16
through Megatron's Float16Module (the model in bf16, the loss in fp32). --trainer megatron: Megatron's DDP over the
data x context group of each TP index and stage, its distributed optimizer (Adam on fp32 master weights), its
schedule. --trainer torch: torch DistributedDataParallel over that group and AdamW on the model's parameters (no
fp32 master copy). On the CPU, cad_megatron.megatron_cpu_support() lets Megatron's local attention run there (its
buffers are allocated on CUDA otherwise).

Per step rank 0 prints the loss, the slowest rank's step time, tokens/s, and the attention imbalance (CAD: the
plans' max/mean server cost; otherwise each rank's own documents' causal cost, max/mean); --json-out keeps
every step's record (per rank: step_s, attention_s for local/cad, peak GPU memory) and a summary.
"""
import argparse
import datetime
import functools
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

MODELS = {
    "tiny": dict(hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1024, layers=2),  # head dim 64: CUDA's kernels
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, layers=32),
}


@functools.lru_cache(maxsize=None)
def _recipe():
    """The trainers' parts this script uses (cad.train: the batch recipe, causal cost, attention timing option and
    rank gather), one of each for every trainer of the project."""
    import types
    from cad.train import flops, launch, options, recipe
    return types.SimpleNamespace(
        causal_cost=flops.causal_cost, cached_batch=recipe.cached_batch, balanced_documents=recipe.balanced_documents,
        add_attention_timing_option=options.add_attention_timing_option,
        resolve_attention_timing=options.resolve_attention_timing, all_gather_floats=launch.all_gather_floats)


def causal_cost(lengths):
    return _recipe().causal_cost(lengths)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="megatron,cad",
                   help="comma list of megatron, te, local, local_balanced, cad, cad+now (default megatron,cad)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="parameters and activations (default: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny", help="shape preset (the flags below override)")
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--position-embedding", choices=["auto", "rope", "learned_absolute", "none"], default="auto",
                   help="auto: rope on CUDA, learned_absolute on the CPU")
    p.add_argument("--context", type=int, default=1024, help="tokens per rank and micro-batch")
    p.add_argument("--context-parallel-size", type=int, default=1,
                   help="Megatron's context_parallel_size; > 1 lays the step's documents over the data x context "
                        "ranks and attends them whole through CAD (cad and cad+now only)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="Megatron's tensor_model_parallel_size")
    p.add_argument("--pipeline-parallel-size", type=int, default=1, help="Megatron's pipeline_model_parallel_size")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="sequence parallelism with tensor parallelism (Transformer Engine's layer spec)")
    p.add_argument("--trainer", choices=["megatron", "torch"], default=None,
                   help="megatron: Megatron-Core's DDP, distributed optimizer and schedules (CUDA; the default there); "
                        "torch: torch DDP and AdamW (the CPU's)")
    p.add_argument("--layout", choices=["rank", "cad"], default=None,
                   help="rank: each rank its own documents (default at context parallel size 1); cad: the step's "
                        "documents over all ranks, cut at the ranks' ends (the only one, and the default, above 1)")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--balancer", default="prefix_aware", help="CAD's balancer (cad.init)")
    p.add_argument("--timeout-ms", type=int, default=120000, help="CAD's collectives' deadline")
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="steps left out of the means (default 1). The first configuration of the process still warms "
                        "up in its second step (DDP rebuilds its gradient buckets after the first iteration, the "
                        "allocator grows): 2 compares configurations more fairly (measured on 2 H200s, 2026-11-27)")
    _recipe().add_attention_timing_option(p, "a CUDA synchronisation around every attention call, so the "
                                             "per-rank attention times are real")
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--json-out", default=None,
                   help="rank 0 writes every step's record and the summary here; {config} is replaced by the "
                        "configuration's name")
    args = p.parse_args(argv)
    for key, value in MODELS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.position_embedding == "auto":
        args.position_embedding = "rope" if args.device == "cuda" else "learned_absolute"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU")
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps {args.warmup_steps}: expected 0 to --steps - 1 ({args.steps - 1})")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads and --heads by --kv-heads")
    known = {"megatron", "te", "local", "local_balanced", "cad", "cad+now"}
    args.config_list = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.config_list if c not in known]
    if unknown:
        p.error(f"--configs: unknown {unknown} (known: {sorted(known)})")
    cp = args.context_parallel_size
    if cp < 1:
        p.error(f"--context-parallel-size {cp}: expected 1 or more")
    args.layout = args.layout or ("cad" if cp > 1 else "rank")
    if args.layout == "cad":
        refused = [c for c in args.config_list if c not in ("cad", "cad+now")]
        if refused:
            p.error(f"--configs {refused} with --layout cad / --context-parallel-size {cp}: documents cut across "
                    f"ranks are attended whole by CAD only (cad, cad+now)")
    elif cp > 1:
        p.error(f"--layout rank with --context-parallel-size {cp}: context parallelism lays documents over the "
                f"ranks (--layout cad)")
    args.trainer = args.trainer or ("megatron" if args.device == "cuda" else "torch")
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if tp < 1 or pp < 1:
        p.error(f"--tensor-parallel-size {tp} / --pipeline-parallel-size {pp}: expected 1 or more")
    if args.trainer == "megatron" and args.device != "cuda":
        p.error("--trainer megatron needs --device cuda (megatron-core allocates its DDP buffers and schedule state on "
                "CUDA); on the CPU use --trainer torch")
    if args.trainer == "torch" and (tp > 1 or pp > 1):
        p.error(f"--tensor-parallel-size {tp} / --pipeline-parallel-size {pp} need --trainer megatron (its "
                f"schedules and gradient reduction)")
    if args.sequence_parallel and (tp == 1 or "megatron" in args.config_list):
        p.error("--sequence-parallel needs --tensor-parallel-size > 1 and Transformer Engine's spec (configs te, "
                "local, local_balanced, cad, cad+now; Megatron's local norms refuse sequence parallelism)")
    _recipe().resolve_attention_timing(args)
    return args


# ---- the model ------------------------------------------------------------------------------------------------
def transformer_config(args, dtype):
    from megatron.core.transformer.transformer_config import TransformerConfig
    cpu = args.device == "cpu"
    return TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        num_query_groups=args.kv_heads, ffn_hidden_size=args.ffn, kv_channels=args.hidden // args.heads,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, pipeline_dtype=dtype,
        use_cpu_initialization=cpu, perform_initialization=True,
        # Megatron's fused kernels need CUDA (and some of them apex or TE): the plain PyTorch paths.
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=False, context_parallel_size=args.context_parallel_size,
        tensor_model_parallel_size=args.tensor_parallel_size, pipeline_model_parallel_size=args.pipeline_parallel_size,
        sequence_parallel=args.sequence_parallel)


def layer_spec(config_name, sequence_parallel=False):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    import cad_megatron
    if sequence_parallel:  # Transformer Engine's layers (its norms take sequence parallelism), CAD's core attention
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        spec = get_gpt_layer_with_transformer_engine_spec()
        return spec if config_name == "te" else cad_megatron.use_cad(
            spec, **({} if not config_name.startswith("local") else {"balance": False}))
    if config_name == "megatron":
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = cad_megatron.PerDocumentDotProductAttention
        return spec
    if config_name == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        return get_gpt_layer_with_transformer_engine_spec()
    return cad_megatron.cad_gpt_layer_spec(normalization="RMSNorm", balance=not config_name.startswith("local"))


def build_model(args, config_name, config, device):
    from megatron.core.models.gpt import GPTModel
    # A document spans up to context_parallel_size ranks: positions up to that many ranks' tokens.
    from megatron.core import parallel_state as ps
    model = GPTModel(config, layer_spec(config_name, args.sequence_parallel), vocab_size=args.vocab,
                     max_sequence_length=args.context * args.context_parallel_size,
                     position_embedding_type=args.position_embedding, share_embeddings_and_output_weights=False,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())
    if args.position_embedding == "rope" and torch.device(device).type == "cpu":
        from cad_megatron_rope import rope_on_cpu
        rope_on_cpu(model)  # Megatron-Core would move RoPE's frequencies to CUDA
    return model.to(device)


def te_unavailable():
    try:
        import transformer_engine  # noqa: F401
        return None
    except Exception as exc:  # noqa: BLE001
        return f"transformer_engine does not import ({type(exc).__name__}: {exc})"


# ---- the data -------------------------------------------------------------------------------------------------
def micro_batch(args, recipe, lengths, rank, world, step, index, device, balanced=False):
    """Rank `rank`'s share of micro-batch `index` of `step`: inputs on `device`, the documents of every rank;
    balanced: the documents made balanced (local_balanced, the measured ideal)."""
    docs = recipe.cached_batch(lengths, args.context, world, args.seed + 1000 * step + index)
    if balanced:
        docs = recipe.balanced_documents(docs)
    mine = docs[rank]
    total = sum(mine)
    g = torch.Generator().manual_seed(args.seed * 7919 + 1000 * step + 17 * index + rank)
    tokens = torch.randint(0, args.vocab, (1, total + 1), generator=g)
    input_ids, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    position_ids = torch.cat([torch.arange(n) for n in mine]).unsqueeze(0)
    loss_mask = torch.ones(1, total)
    ends = torch.tensor(mine).cumsum(0) - 1
    loss_mask[0, ends] = 0.0  # a document's last token: its next token belongs to the next document
    predicted = sum(sum(n - 1 for n in d) for d in docs)  # every rank's predicted tokens of this micro-batch
    return dict(docs=docs, mine=mine, predicted=predicted,
                input_ids=input_ids.to(device), labels=labels.to(device), position_ids=position_ids.to(device),
                loss_mask=loss_mask.to(device))


def cad_layout_micro_batch(args, recipe, lengths, world, step, index, device, config, config_name, tag):
    """This rank's share of micro-batch `index` of `step` under --layout cad: the recipe's documents for the
    world / cp replicas at cp x --context tokens each, in order over all ranks (cut at each rank's --context
    tokens; the step's token stream the same on every rank), with its PackedSeqParams (for 'cad' its plan asked
    for now, made ahead)."""
    from cad_megatron_cp import pack_for_context_parallel
    cp = args.context_parallel_size
    docs = recipe.cached_batch(lengths, args.context * cp, world // cp, args.seed + 1000 * step + index)
    flat = [n for d in docs for n in d]
    g = torch.Generator().manual_seed(args.seed * 7919 + 1000 * step + 17 * index)
    stream = torch.randint(0, args.vocab, (args.context * world,), generator=g)
    attach = dict(config=config, ahead=True, tag=tag) if config_name == "cad" else {}
    mine, p = pack_for_context_parallel(flat, args.context, device=device, drop_remainder=False, **attach)
    targets = mine.targets(stream)
    loss_mask = (targets != -100).float()  # a document's last token predicts nothing
    return dict(docs=docs, predicted=sum(n - 1 for n in flat), packed=p,
                input_ids=stream[mine.start:mine.stop].unsqueeze(0).to(device),
                labels=targets.clamp_min(0).unsqueeze(0).to(device),
                position_ids=mine.position_ids().unsqueeze(0).to(device), loss_mask=loss_mask.unsqueeze(0).to(device))


def packed(batch, args, config, config_name, device, tag):
    """The micro-batch's PackedSeqParams; for 'cad', with its plan asked for now (made ahead)."""
    import cad_megatron
    if config_name == "cad":
        p, _ = cad_megatron.packed_seq_params(batch["mine"], device, config=config, ahead=True, tag=tag)
    else:
        p, _ = cad_megatron.packed_seq_params(batch["mine"], device)
    return p


# ---- training -------------------------------------------------------------------------------------------------
def train_one(args, config_name, state, rank, world, device, dtype, recipe, lengths):
    import cad_megatron
    from megatron.core import parallel_state

    config = transformer_config(args, dtype)
    context = None
    if config_name.startswith("cad") or config_name.startswith("local"):
        context = cad_megatron.init_cad(balancer=args.balancer, timeout_ms=args.timeout_ms)
        context.timing(sync_cuda=args.sync_attention_timing == "on" and device.type == "cuda")
        context.attention_time()
    model = build_model(args, config_name, config, device)
    model.load_state_dict(state)
    if config.bf16:  # Megatron's mixed-precision wrapper: the whole model in bf16 (norms too), outputs back in fp32
        from megatron.core.transformer.module import Float16Module
        model = Float16Module(config, model)
    module = model
    if world > 1:
        module = torch.nn.parallel.DistributedDataParallel(  # the ranks holding distinct tokens: data x context
            model, process_group=parallel_state.get_data_parallel_group(
                with_context_parallel=args.context_parallel_size > 1),
            device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    plans_in_loop = config_name == "cad"
    records = []
    n_micro = args.micro_batches
    order = [(s, i) for s in range(args.steps) for i in range(n_micro)]

    def load(k):
        s, i = order[k]
        if args.layout == "cad":
            return cad_layout_micro_batch(args, recipe, lengths, world, s, i, device, config, config_name, tag=k)
        batch = micro_batch(args, recipe, lengths, rank, world, s, i, device, balanced=config_name == "local_balanced")
        batch["packed"] = packed(batch, args, config, config_name, device, tag=k)
        return batch

    nxt = load(0)
    for step in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64)
        imbalances = []
        for i in range(n_micro):
            k = step * n_micro + i
            batch = nxt
            # The next micro-batch (the next step's first during this step's last) is loaded, and with 'cad' its
            # plan asked for, before this one computes: CAD's planning thread makes it meanwhile.
            nxt = load(k + 1) if k + 1 < len(order) else None
            sync = module.no_sync() if world > 1 and i < n_micro - 1 else _null()
            with sync:
                token_loss = module(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"],
                                    packed_seq_params=batch["packed"])
                local_sum = (token_loss.float() * batch["loss_mask"]).sum()
                # DDP averages the gradients over the ranks: world x (this rank's share of the global mean).
                (local_sum * (world / (batch["predicted"] * n_micro))).backward()
            loss_sum += local_sum.detach().double().cpu() / batch["predicted"] / n_micro
            plans = cad_megatron.plans_of(batch["packed"]) if config_name.startswith("cad") else []
            if plans and plans[0].stats:
                imbalances.append(plans[0].stats["imbalance"])
            elif not config_name.startswith("cad"):
                costs = [causal_cost(d) for d in batch["docs"]]
                imbalances.append(max(costs) * len(costs) / max(1, sum(costs)))
            del batch
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_s = time.perf_counter() - start
        attention_s = context.attention_time() if context is not None else None
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else 0.0
        gathered = _gather([float(loss_sum), step_s, -1.0 if attention_s is None else attention_s, peak], world)
        loss = sum(g[0] for g in gathered)
        tokens = args.context * world * n_micro
        slowest = max(g[1] for g in gathered)
        record = {"step": step, "loss": loss, "step_s": [g[1] for g in gathered],
                  "attention_s": None if attention_s is None else [g[2] for g in gathered],
                  "peak_memory_gib": [g[3] for g in gathered], "tokens_per_s": tokens / slowest,
                  "imbalance": sum(imbalances) / len(imbalances) if imbalances else None}
        records.append(record)
        if rank == 0:
            att = "" if attention_s is None else " attention " + "/".join(f"{g[2]:.3f}" for g in gathered) + " s"
            imb = "" if record["imbalance"] is None else f" imbalance {record['imbalance']:.3f}"
            print(f"[{config_name}] step {step}: loss {loss:.6f} step {slowest:.3f} s (slowest rank) "
                  f"{record['tokens_per_s']:.0f} tokens/s{att}{imb} peak {max(g[3] for g in gathered):.1f} GiB",
                  flush=True)
    timed = records[args.warmup_steps:] or records[-1:]
    summary = {"config": config_name, "ranks": world, "device": str(device), "dtype": args.dtype,
               "model": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")},
               "position_embedding": args.position_embedding, "context": args.context,
               "micro_batches": n_micro,
               "context_parallel_size": args.context_parallel_size, "layout": args.layout,
               "steps": args.steps, "warmup_steps": args.warmup_steps,
               "balancer": args.balancer if "cad" in config_name else None,
               "plans": ("made ahead in the loop (attach_plan)" if plans_in_loop else
                         "made by the first CAD layer" if config_name == "cad+now" else None),
               "mean_step_s_after_first": sum(max(r["step_s"]) for r in timed) / len(timed),
               "mean_tokens_per_s_after_first": sum(r["tokens_per_s"] for r in timed) / len(timed),
               "losses": [r["loss"] for r in records]}
    if rank == 0 and args.json_out:
        path = pathlib.Path(args.json_out.replace("{config}", config_name.replace("+", "_")))
        path.write_text(json.dumps({"summary": summary, "steps": records}, indent=1))
    del module, model, optimizer
    if context is not None:
        cad_megatron.shutdown_cad()
    return summary


def train_one_megatron(args, config_name, state, world, device, dtype, recipe, lengths):
    """--trainer megatron: Megatron-Core's DDP, distributed optimizer and get_forward_backward_func
    (cad_megatron_schedule), micro-batches loaded by the schedule's iterator, 'cad's plans made ahead there."""
    import cad_megatron
    from megatron.core import parallel_state as ps
    from cad_megatron_schedule import MicroBatch, PlannedMicroBatches, megatron_ddp_and_optimizer, train_step
    config = transformer_config(args, dtype)
    uses_cad = config_name.startswith(("cad", "local"))
    context = cad_megatron.init_cad(balancer=args.balancer, timeout_ms=args.timeout_ms) if uses_cad else None
    if context is not None:
        context.timing(sync_cuda=args.sync_attention_timing == "on")
        context.attention_time()
    model = build_model(args, config_name, config, device)
    model.load_state_dict(state)
    if config.bf16:
        from megatron.core.transformer.module import Float16Module
        model = Float16Module(config, model)
    chunks, optimizer = megatron_ddp_and_optimizer(config, model, lr=args.lr)
    replicas = ps.get_data_parallel_world_size(with_context_parallel=True)  # the ranks holding distinct tokens
    replica = ps.get_data_parallel_rank(with_context_parallel=True)
    n = args.micro_batches

    def load(k):  # every stage and TP rank of a replica loads the same micro-batch k
        s, i = divmod(k, n)
        if args.layout == "cad":
            b = cad_layout_micro_batch(args, recipe, lengths, replicas, s, i, device, config, "cad+now", tag=k)
        else:
            b = micro_batch(args, recipe, lengths, replica, replicas, s, i, device,
                            balanced=config_name == "local_balanced")
            b["packed"], b["cu_host"] = cad_megatron.packed_seq_params(b["mine"], device)
        return MicroBatch(b["input_ids"], b["labels"], b["position_ids"], b["loss_mask"], b["packed"], b.get("cu_host"))

    batches = PlannedMicroBatches(load, config, balance=config_name == "cad")
    losses, steps = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        start = time.perf_counter()
        loss = train_step(chunks, optimizer, batches, num_microbatches=n,
                          seq_length=args.context * args.context_parallel_size)
        torch.cuda.synchronize()
        step_s = time.perf_counter() - start
        attention_s = context.attention_time() if context is not None else -1.0
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
        gathered = _gather([-1.0 if loss is None else loss, step_s, attention_s, peak], world)
        losses.append(max(g[0] for g in gathered))  # the last stage's ranks hold the step's mean token loss
        steps.append(max(g[1] for g in gathered))
        if dist.get_rank() == 0:
            print(f"[{config_name}] step {step}: loss {losses[-1]:.6f} step {steps[-1]:.3f} s (slowest rank) "
                  f"{args.context * replicas * n / steps[-1]:.0f} tokens/s peak {max(g[3] for g in gathered):.1f} "
                  f"GiB", flush=True)
    timed = steps[args.warmup_steps:] or steps[-1:]
    summary = {"config": config_name, "trainer": "megatron", "ranks": world,
               "tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
               "context_parallel_size": args.context_parallel_size, "sequence_parallel": args.sequence_parallel,
               "micro_batches": n, "context": args.context, "losses": losses, "step_s": steps,
               "mean_step_s_after_first": sum(timed) / len(timed)}
    if dist.get_rank() == 0 and args.json_out:
        pathlib.Path(args.json_out.replace("{config}", config_name.replace("+", "_"))).write_text(
            json.dumps({"summary": summary}, indent=1))
    del chunks, model, optimizer, batches
    if context is not None:
        cad_megatron.shutdown_cad()
    return summary


def print_realised_share(step_s):
    """With local, local_balanced and cad among the configs: the measured ideal (local / local_balanced), CAD's
    speedup over local and the realised share (speedup - 1) / (ideal - 1) of the attainable gain."""
    if not {"local", "local_balanced", "cad"} <= step_s.keys():
        return
    ideal, speedup = step_s["local"] / step_s["local_balanced"], step_s["local"] / step_s["cad"]
    share = f"{(speedup - 1) / (ideal - 1):.2f}" if ideal > 1 else "- (no gain to realise)"
    print(f"cad: {speedup:.3f}x local; ideal (local / local_balanced) {ideal:.3f}x; realised share {share}",
          flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _gather(values, world):
    return _recipe().all_gather_floats(values, world)


def main(argv=None):
    args = parse_args(argv)
    launched = "WORLD_SIZE" in os.environ
    if not launched:  # one process: a world of one (Megatron's parallel_state needs torch.distributed)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        return _run(args, rank, world, device)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # the launcher ends the job now, instead of the peers waiting for their timeouts


def _run(args, rank, world, device):
    from megatron.core import parallel_state, tensor_parallel
    import megatron.core
    import cad_megatron

    tp, pp, cp = args.tensor_parallel_size, args.pipeline_parallel_size, args.context_parallel_size
    if world % (tp * pp * cp):
        raise SystemExit(f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} x --context-parallel-size {cp} "
                         f"does not divide the {world} ranks")
    parallel_state.initialize_model_parallel(tp, pp, context_parallel_size=cp)
    if device.type == "cpu":
        cad_megatron.megatron_cpu_support()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    recipe = _recipe()
    lengths = json.loads(pathlib.Path(args.data).read_text())
    if rank == 0:
        print(f"megatron-core {megatron.core.__version__}, torch {torch.__version__}, {world} rank(s) on "
              f"{device.type}, {args.dtype}; model {args.model}: layers {args.layers} hidden {args.hidden} heads "
              f"{args.heads}/{args.kv_heads} ffn {args.ffn} vocab {args.vocab}; {args.context} tokens per rank "
              f"and micro-batch, {args.micro_batches} micro-batch(es), {args.steps} steps", flush=True)
    torch.manual_seed(args.seed)
    # The weights every config starts from (the same parameters whatever the core attention).
    first = build_model(args, "local" if args.layout == "rank" else "cad", transformer_config(args, dtype), device)
    state = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in first.state_dict().items()}
    del first
    summaries = []
    for name in args.config_list:
        if name == "te":
            reason = te_unavailable()
            if reason:
                if rank == 0:
                    print(f"[te] skipped: {reason}", flush=True)
                continue
        if args.trainer == "megatron":
            summaries.append(train_one_megatron(args, name, state, world, device, dtype, recipe, lengths))
        else:
            summaries.append(train_one(args, name, state, rank, world, device, dtype, recipe, lengths))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0 and len(summaries) > 1:
        base = summaries[0]
        for s in summaries[1:]:
            worst = max(abs(a - b) / abs(b) for a, b in zip(s["losses"], base["losses"]))
            print(f"{s['config']} vs {base['config']}: losses agree to {worst:.2e} relative; step "
                  f"{s['mean_step_s_after_first']:.3f} s vs {base['mean_step_s_after_first']:.3f} s (mean after "
                  f"the first {args.warmup_steps} step(s))", flush=True)
        print_realised_share({s["config"]: s["mean_step_s_after_first"] for s in summaries})
    parallel_state.destroy_model_parallel()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line of the pipeline trainer (examples/train_pipeline.py) and its --configs."""
import argparse
import os

from .options import MODELS, add_attention_timing_option, apply_model_defaults, default_data, \
    resolve_attention_timing
from . import long_docs
from .pipeline_report import BALANCED, CONFIGS
from .pipeline_stage import parse_fault
from .schedule import check_layout


def configurations(args):
    """(name, args) of every configuration to train: --configs, else the one of --attention/--pool."""
    if not args.configs:
        return [(None, args)]
    runs = []
    for name in args.configs.split(","):
        run = argparse.Namespace(**vars(args))
        run.attention, pool, schedule = CONFIGS[name]
        run.pool = pool or args.pool
        run.schedule = schedule or args.schedule
        run.balanced_batches = args.balanced_batches or name in BALANCED
        run.json_out = args.json_out.replace("{config}", name) if args.json_out else None
        runs.append((name, run))
    return runs


def parse_args(argv=None, description=None):
    """The options (argv: sys.argv's by default); description: --help's text (default: cad.train.pipeline's
    documentation, which says what the trainer does)."""
    if description is None:
        from . import pipeline
        description = pipeline.__doc__
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pp", type=int, default=2, help="pipeline stages; the world must divide by it (DP = world / PP)")
    p.add_argument("--attention", choices=["local", "torch_varlen", "cad"], default="cad")
    p.add_argument("--pool", choices=["tick", "stage", "bubble"], default="tick",
                   help="with --attention cad: tick = one CAD group over every rank, a plan per tick; stage = CAD "
                        "within each stage's data-parallel group only; bubble = CAD over every rank in the ticks "
                        "with an idle stage only (GPipe's fill and drain; an idle stage's free capacity), local "
                        "attention in the steady ticks (there the micro-batches' imbalance costs GPipe nothing, "
                        "measured); with --schedule 1f1b it needs --checkpointing full")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", choices=["host", "nccl"], default=None,
                   help="CAD's: host (torch.distributed's gloo, CPU) or nccl (CUDA); default: host on CPU, nccl on "
                        "CUDA")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny",
                   help="shape preset (train_llama's): tiny or llama3-8b; the options below override it")
    p.add_argument("--context", "--tokens-per-rank", dest="context", type=int, default=2048,
                   help="tokens per micro-batch and replica (one packed buffer)")
    long_docs.add_options(p)  # --max-doc-len: a micro-batch's documents packed over the stage's replicas whole
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe",
                   help="gpipe: all forward ticks, then all backward ticks; 1f1b: one forward, one backward (at most "
                        "PP - stage micro-batches in flight), forwards and backwards at the same tick on different "
                        "stages (CAD over the world: cad.CallOrder)")
    for name in ("layers", "hidden", "heads", "kv-heads", "vocab"):
        p.add_argument(f"--{name}", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--intermediate", type=int, default=None, help="MLP width; 0: 3 x --hidden (tiny's default)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--checkpointing", choices=["none", "full"], default="none",
                   help="full: every decoder layer recomputed in the backward (transformers' own, non-reentrant; "
                        "reentrant under --schedule 1f1b --pool bubble, whose backwards run their own tick's plan)")
    p.add_argument("--keep-forward-tensors", choices=["auto", "on", "off"], default="auto",
                   help="CAD's (cad.init): where a forward's Q/K/V/O wait for its backward -- on the servers (on), the "
                        "owners (off), or on the servers only for a recomputed forward (auto)")
    p.add_argument("--loss-chunk", type=int, default=4096, help="tokens per chunk of the head and cross-entropy")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (default 989: H100 SXM bf16)")
    p.add_argument("--timeout-ms", type=int, default=120000,
                   help="every wait's deadline: send/recv, CAD's collectives, plans made ahead")
    p.add_argument("--data", default=default_data())
    p.add_argument("--plan-ahead", choices=["on", "off"], default="on",
                   help="on: each tick's plan asked for one tick ahead and made on CAD's planning thread; off: made "
                        "at its tick's start")
    add_attention_timing_option(p, "CUDA synchronised around every attention call, so attention times are "
                                        "the GPU's (and the ideal can be computed)")
    p.add_argument("--json-out", default=None,
                   help="every step's record and the summary (rank 0); with --configs it must contain {config}")
    p.add_argument("--configs", default=None,
                   help="train several configurations in turn in this process, same weights and batches: a comma "
                        "list of local, torch_varlen, cad_tick, cad_stage, cad_bubble (--schedule's; cad_bubble: "
                        "CAD in the ticks with an idle stage only, local attention in the steady ones) and "
                        "1f1b_local, 1f1b_torch_varlen, 1f1b_cad_tick, 1f1b_cad_stage, 1f1b_cad_bubble (1F1B; "
                        "1f1b_cad_bubble needs --checkpointing full), and local_balanced, "
                        "1f1b_local_balanced (the measured ideal: --balanced-batches); ends with a comparison table")
    p.add_argument("--balanced-batches", action="store_true",
                   help="the measured ideal: every buffer of a step keeps its tokens but holds equal-length documents "
                        "with its causal attention work nearest the step's mean buffer (the local_balanced "
                        "configurations set it)")
    p.add_argument("--test-fault", default=None,
                   help="for tests: RANK:PHASE:TICK:KIND, PHASE forward|backward, KIND raise (that rank raises at "
                        "the tick's start) or stall (sleeps 3 x --timeout-ms there)")
    args = apply_model_defaults(p.parse_args(argv))
    if args.device == "cuda" and args.communicator == "host":
        p.error("--communicator host on CUDA: the stages' send/recv of CUDA tensors needs NCCL (one process per GPU)")
    if args.device == "cpu" and args.communicator == "nccl":
        p.error("--communicator nccl needs --device cuda")
    args.backend = "nccl" if args.device == "cuda" else "gloo"
    # the shared helpers read these (batches.make_nanos, flops.model_flops): one global causal mask, no ping-pong
    args.window, args.global_every, args.ping_pong = -1, None, False
    if args.pp < 1 or args.layers < 1 or args.micro_batches < 1 or args.steps < 1 or args.context < 1:
        p.error("--pp, --layers, --micro-batches, --steps and --context must be at least 1")
    if args.layers % args.pp:
        p.error(f"--layers {args.layers} is not divisible by --pp {args.pp} (each stage holds layers / pp decoder "
                f"layers)")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if "WORLD_SIZE" in os.environ:
        try:
            check_layout(int(os.environ["WORLD_SIZE"]), args.pp)
        except ValueError as exc:
            p.error(str(exc))
    try:
        parse_fault(args.test_fault)
    except ValueError as exc:
        p.error(str(exc))
    if args.configs is not None:
        bad = [n for n in args.configs.split(",") if n not in CONFIGS]
        if bad:
            p.error(f"--configs: {bad[0]!r} is not one of {', '.join(CONFIGS)}")
        if args.json_out and "{config}" not in args.json_out:
            p.error("--json-out must contain {config} with --configs (one JSON per configuration)")
    # --pool bubble under 1F1B pools only the ticks with an idle stage, where a micro-batch's forward and backward
    # may fall in different kinds of tick: only a backward that recomputes its forward (--checkpointing full)
    # makes all of its attention calls in its own tick, under that tick's kind. GPipe's bubble ticks mirror each
    # other, so it runs with or without checkpointing.
    for name, run in configurations(args):
        if run.attention == "cad" and run.pool == "bubble" and run.schedule == "1f1b":
            which = f" ({name})" if name else ""
            if run.checkpointing != "full":
                p.error(f"--pool bubble{which} with --schedule 1f1b needs --checkpointing full: a micro-batch's "
                        f"forward and backward can fall in different kinds of tick (pooled or local), so the "
                        f"backward's attention calls must all be made in its own tick, its forward's recomputed "
                        f"there")
            if run.keep_forward_tensors == "on":
                # the servers would keep every pooled first forward's tensors for a backward that never comes
                # under that plan (the backward recomputes under its own), until cad.shutdown
                p.error(f"--pool bubble{which} with --schedule 1f1b takes --keep-forward-tensors auto or off, not "
                        f"on: its backwards recompute their forwards under plans of their own, so a forward's kept "
                        f"tensors would never be used")
    long_docs.check_options(p, args, [("--balanced-batches (local_balanced)", args.balanced_batches or any(
        "balanced" in name for name in (args.configs or "").split(",")))])
    resolve_attention_timing(args)
    return args

"""The command line of the Llama trainer (examples/train_llama.py): its options, their checks, and the
--configs grammar (each configuration's name, options and JSON name)."""
import argparse
import pathlib
import re

from . import long_docs
from .options import MODELS, REPO, add_attention_timing_option, apply_model_defaults, default_data, \
    resolve_attention_timing


# The numbered parts of a --configs name: '+tolT' (balancer tolerance), '+resN' (SMs the own tasks leave free),
# '+ctasN' (CAD's NCCL CTAs), '+hgN' (CAD's head groups).
NUMBERED_MODES = {"tol": r"tol(\d+(\.\d*)?|\.\d+)", "res": r"res\d+", "ctas": r"ctas\d+", "hg": r"hg\d+"}


# The --configs bases that are not CAD (no balancer, no CAD modes).
NOT_CAD = ("local", "torch_varlen", "fa4", "local_balanced")


def server_backend_choice(text):
    """--server-backend's value: NAME (both directions) or FORWARD+BACKWARD, each a name of
    cad.server_backend.BACKENDS; kept as that string (what cad.init's server_backend takes)."""
    from .. import server_backend
    from .._errors import CadError
    try:
        return server_backend.name_of(*server_backend.directions(text, "--server-backend"))
    except CadError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def numbered_modes(modes):
    """The modes of a --configs name (its '+' parts) that are numbered, by kind (NUMBERED_MODES): one parse for
    the validation and for what each configuration sets."""
    return {kind: [m for m in modes if re.fullmatch(pattern, m)] for kind, pattern in NUMBERED_MODES.items()}


def configurations(args):
    """What to train, as (name, args): the one configuration of --attention/--balancer/--ping-pong, or each of
    --configs with --json-out's {config} filled in by its name."""
    if not args.configs:
        return [(None, args)]
    runs = []
    for name in args.configs.split(","):
        run = argparse.Namespace(**vars(args))
        base, *modes = name.split("+")
        if base == "local_balanced":  # local attention on the batches made balanced: the measured ideal
            base, run.balanced_batches = "local", True
        run.attention = base if base in ("local", "torch_varlen", "fa4") else "cad"
        run.balancer = base if run.attention == "cad" else args.balancer
        run.ping_pong = "pp" in modes or "ppauto" in modes or "pp1" in modes or "ppmb" in modes
        if "ppmb" in modes:  # the step's micro-batches paired as the nano-batches (--ping-pong-nanos micro-batches)
            run.ping_pong_nanos = "micro-batches"
        if "pp1" in modes:
            run.ping_pong_lanes = 1
        if "ppauto" in modes:
            run.ping_pong_when = "worthwhile"
        if "ovauto" in modes:  # none, head groups or ping-pong, chosen from a measured step (--overlap auto)
            run.overlap = "auto"
        if "now" in modes:
            run.plan_ahead = "off"
        if "blocking" in modes:  # CAD's exchanges launched on the calling thread (--cad-nccl-blocking)
            run.cad_nccl_blocking = True
        if "ce" in modes:  # CAD's all-to-alls by the copy engines (--cad-nccl-copy-engines)
            run.cad_nccl_copy_engines = True
        if "own" in modes:  # a rank runs the tasks on documents it holds whole in place (--cad-own-tasks on)
            run.cad_own_tasks = "on"
        if "dyn" in modes:  # the server's forward walks its units dynamically (--cad-forward-walk dynamic)
            run.cad_forward_walk = "dynamic"
        if "time" in modes:  # prefix_aware balances predicted time (--balance-time)
            run.balance_time = True
        if "fa4srv" in modes:  # CAD's servers through FlashAttention-4, both directions (--server-backend fa4)
            run.server_backend = "fa4"
        if "fa4bwd" in modes:  # our forward, FA4's backward on the servers (--server-backend default+fa4)
            run.server_backend = "default+fa4"
        numbered = numbered_modes(modes)
        ctas, reserve, tolerance, groups = numbered["ctas"], numbered["res"], numbered["tol"], numbered["hg"]
        if groups:  # +hg2: the server batch's heads in 2 pipelined groups (--cad-head-groups)
            run.cad_head_groups = int(groups[0][2:])
        if ctas:  # +ctas8: CTAs per NCCL operation of CAD's communicator at most (--cad-nccl-max-ctas)
            run.cad_nccl_max_ctas = int(ctas[0][4:])
        if reserve:  # +res16: SMs the own tasks' forward leaves to the collective (--cad-own-reserve-sms)
            run.cad_own_reserve_sms = int(reserve[0][3:])
        if tolerance:  # +tol0.005: the balancer's tolerance (--balancer-tolerance)
            run.balancer_tolerance = float(tolerance[0][3:])
        label = ("local_balanced" if run.balanced_batches and base == "local" else base) + ("_plannow" if "now" in modes else "") + ("_pingpong" if "pp" in modes else "") + \
            ("_pingpongmb" if "ppmb" in modes else "") + \
            ("_autopingpong" if "ppauto" in modes else "") + ("_autooverlap" if "ovauto" in modes else "") + ("_pingpong1lane" if "pp1" in modes else "") + \
            ("_ncclblocking" if "blocking" in modes else "") + ("_own" if "own" in modes else "") + \
            ("_dyn" if "dyn" in modes else "") + ("_time" if "time" in modes else "") + \
            ("_ce" if "ce" in modes else "") + ("_fa4srv" if "fa4srv" in modes else "") + \
            ("_fa4bwd" if "fa4bwd" in modes else "") + "".join("_" + m for m in tolerance + reserve + ctas + groups)
        run.json_out = args.json_out.replace("{config}", label) if args.json_out else None
        runs.append((label, run))
    return runs


def balancer_config(args):
    """cad.init's balancer_config from --balancer-tolerance and --balance-time (None: the balancer's defaults)."""
    config = {}
    if args.balancer_tolerance is not None:
        config["tolerance"] = args.balancer_tolerance
    if args.balance_time:
        config["rate_table"] = str(pathlib.Path(args.balancer_rate_table).resolve())
        if args.balancer_min_time_gain is not None:
            config["min_time_gain"] = args.balancer_min_time_gain
    return config or None


def parse_args(argv=None, description=None):
    """The options (argv: sys.argv's by default); description: --help's text (default: cad.train.llama's
    documentation, which says what the trainer does)."""
    if description is None:
        from . import llama
        description = llama.__doc__
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", choices=["local", "torch_varlen", "fa4", "cad"], default="cad",
                   help="cad (CAD plans over the ranks), local (the project's kernels, no CAD: \"cad_local\"), "
                        "torch_varlen (torch.nn.attention.varlen.varlen_attn: CUDA, torch >= 2.9) or fa4 "
                        "(FlashAttention-4 through cad.fa4, local like torch_varlen; refused, with cad.fa4's reason, "
                        "where it cannot run)")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", default=None, help="host, mpi or nccl (default: host on CPU, nccl on CUDA)")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny",
                   help="shape preset: tiny (hidden 128, 4 heads, 2 KV heads, 2 layers, vocab 1024) or llama3-8b "
                        "(hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab 128256, 32 layers); the options "
                        "below override it")
    p.add_argument("--context", "--tokens-per-rank", dest="context", type=int, default=2048,
                   help="tokens per rank and micro-batch (one packed buffer)")
    long_docs.add_options(p)
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per optimizer step (gradient accumulation), each its own batch and CAD plan")
    p.add_argument("--layers", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--hidden", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--intermediate", type=int, default=None,
                   help="MLP width (Llama's intermediate_size; Llama-3 8B: 14336); 0: 3 x --hidden (tiny's default)")
    p.add_argument("--heads", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--kv-heads", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--vocab", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--window", type=int, default=-1,
                   help="sliding window: a windowed layer's query at document position p sees the keys [p - WINDOW, p] "
                        "(window_size=(WINDOW, 0); transformers' sliding_window = WINDOW + 1). Default -1: no "
                        "window, every layer global. Without --global-every every layer is windowed")
    p.add_argument("--global-every", type=int, default=None,
                   help="with --window: every N-th decoder layer (layers N-1, 2N-1, ...) is global (causal), the "
                        "others windowed: 6 = Gemma-3's 5 windowed : 1 global, 2 = gpt-oss's alternation. Default: "
                        "none global")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="compute dtype (default: fp32 on CPU, bf16 on CUDA); FSDP2 keeps fp32 master weights")
    p.add_argument("--parallel", choices=["ddp", "fsdp2"], default=None,
                   help="data parallelism: ddp (DistributedDataParallel) or fsdp2 (fully_shard per decoder layer "
                        "and the root). Default: fsdp2 on CUDA over NCCL, else ddp")
    p.add_argument("--checkpointing", choices=["none", "full", "attention", "mlp"], default="none",
                   help="activation checkpointing: full (transformers' own, every decoder layer recomputed in the "
                        "backward; non-reentrant unless --checkpoint-reentrant), attention / mlp (only each "
                        "layer's self_attn / mlp recomputed, non-reentrant)")
    p.add_argument("--checkpoint-reentrant", action="store_true",
                   help="with --checkpointing full: torch's reentrant checkpoint (use_reentrant=True)")
    p.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    p.add_argument("--loss-chunk", type=int, default=4096,
                   help="tokens per chunk of the head and cross-entropy (each chunk's logits recomputed in the "
                        "backward instead of kept)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="peak dense bf16 TFLOP/s of one device, for MFU (default 989: H100 SXM)")
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--data", default=default_data())
    p.add_argument("--ping-pong", action="store_true",
                   help="two nano-batches per decoder-layer call (see --ping-pong-nanos; by default every rank's "
                        "buffer split at the document boundary nearest half its tokens: whole documents; a document cut across ranks counts as one document of "
                        "each rank and stays whole in its nano-batch), one plan each, decoder layers through "
                        "cad.ping_pong; same loss and gradients as without. A micro-batch where a rank holds one "
                        "document runs unsplit, with a note (its step's record says \"ping_pong\": false)")
    p.add_argument("--ping-pong-when", choices=["always", "worthwhile"], default="always",
                   help="with --ping-pong: always split, or worthwhile: run unsplit until one measured step (after "
                        "the warm-up) says whether CAD's exchanges stall the step long enough to be worth hiding "
                        "(cad.PingPongChoice: at least --ping-pong-min-stall-share of the step), then split or not "
                        "for good from the second step after it (the next one's plans were made ahead, unsplit), "
                        "saying why (the summary's ping_pong_decision)")
    p.add_argument("--overlap", choices=["off", "auto"], default="off",
                   help="CAD only: auto runs unsplit until one measured step (after the warm-up) and then picks, "
                        "from its time, exchange stall, exchange and server compute (the slowest rank's), none, "
                        "head groups 2/4/8 or ping-pong of halves (cad.OverlapChoice, its model and constants from "
                        "docs/multi_gpu.md), from the next step on; the first step under the choice confirms it or, "
                        "if it was slower than the unsplit step, reverts to none. Printed, and in the summary's "
                        "overlap_decision. Not with --ping-pong or --cad-head-groups (it sets them itself). "
                        "off (default): as the other options say")
    p.add_argument("--ping-pong-nanos", choices=["halves", "micro-batches"], default="halves",
                   help="with --ping-pong, what the two nano-batches are: halves (default: every micro-batch "
                        "split in two, each half balanced by a plan of its own) or micro-batches (micro-batches "
                        "2j and 2j+1 of the step run as the two nano-batches of one forward and backward, each "
                        "with its unsplit plan: no document moves that the unsplit step would not move, at the "
                        "cost of holding two micro-batches' activations at once; needs an even --micro-batches)")
    p.add_argument("--ping-pong-min-stall-share", type=float, default=0.07,
                   help="what splitting costs, as a share of the step (default 0.07: on 2 and 4 H200s at 64K-128K "
                        "tokens per GPU ping-pong lost 0.1-3%% of the step where the unsplit stall was 2.5-4.2%%, "
                        "docs/multi_gpu.md); below it ping-pong stays off")
    add_attention_timing_option(p, "CUDA synchronised around every attention call (not under ping-pong), so "
                                   "attention times are the GPU's")
    p.add_argument("--balanced-batches", action="store_true",
                   help="replace every micro-batch by its balanced twin (each rank's tokens as equal-length documents "
                        "whose causal attention work is the mean rank's): with local attention, the measured ideal "
                        "of balance at no communication cost (config 'local_balanced'); causal layers only")
    p.add_argument("--cad-comm-priority", choices=["highest", "normal"], default="highest",
                   help="CAD's CUDA communication stream priority (cad.init's comm_stream_priority)")
    p.add_argument("--cad-nccl-max-ctas", type=int, default=0,
                   help="at most this many CTAs per NCCL operation of CAD's communicator (cad.init's nccl_max_ctas; "
                        "0: NCCL's default)")
    p.add_argument("--balancer-tolerance", type=float, default=None,
                   help="the CAD balancer's tolerance (distca, prefix_aware; cad.init's balancer_config): prefix_aware "
                        "fills servers up to mean x (1 + T), default 0.02; a smaller T balances tighter and moves more "
                        "bytes (docs/balancers.md)")
    p.add_argument("--balance-time", action="store_true",
                   help="prefix_aware balances the servers' predicted attention time (forward + backward, from "
                        "--balancer-rate-table) instead of FLOPs, where that predicts a max/mean lower by more than "
                        "--balancer-min-time-gain (docs/balancers.md)")
    p.add_argument("--balancer-rate-table", default=str(REPO / "configs" / "calibration" / "h200.json"),
                   help="the kernel-rate table --balance-time predicts with (default configs/calibration/h200.json)")
    p.add_argument("--balancer-min-time-gain", type=float, default=None,
                   help="with --balance-time: keep the time-balanced plan only where it predicts a max/mean lower "
                        "than the FLOP plan's by more than this (prefix_aware's min_time_gain, default 0.015; 0: "
                        "always)")
    p.add_argument("--cad-nccl-blocking", action="store_true",
                   help="CAD's NCCL communicator blocking (cad.init's nccl_blocking_comm): exchanges launch on the "
                        "calling thread instead of NCCL's job thread")
    p.add_argument("--cad-nccl-copy-engines", action="store_true",
                   help="CAD's all-to-alls through the GPUs' copy engines and CUDA IPC (cad.init's nccl_copy_engines; "
                        "every rank on one host): no SM, so they can run beside the attention kernels")
    p.add_argument("--cad-own-tasks", choices=["on", "off"], default="off",
                   help="on: a rank runs the tasks on documents it holds whole in place on its own tensors while one "
                        "collective moves the other rows (cad.init's own_tasks_in_place; measured no faster, "
                        "bench/results/trainer_h200x2_2026-11-27_{0a9366b,afdc6f0,c9c0322}); off (default): they go through the exchange to itself")
    p.add_argument("--cad-own-reserve-sms", type=int, default=16,
                   help="SMs the own tasks' forward kernel leaves free for the collective running beside it "
                        "(cad.init's own_tasks_reserve_sms; default 16; 0: every SM)")
    p.add_argument("--cad-forward-walk", choices=["static", "dynamic"], default="static",
                   help="on GPUs, how the server's forward kernel walks its units (cad.init's forward_walk): static "
                        "(default; a fixed share per block) or dynamic (each block takes the next untaken unit)")
    p.add_argument("--cad-head-groups", type=int, default=1,
                   help="on GPUs over NCCL, each CAD call's heads in this many pipelined groups (cad.init's "
                        "head_groups; a divisor of --heads and --kv-heads): the server computes one group while the "
                        "next one's rows arrive and the last one's results leave; 1 (default): unsplit")
    p.add_argument("--server-backend", type=server_backend_choice, default="default", metavar="NAME|FWD+BWD",
                   help="what computes CAD's server batches (cad.init's server_backend): default (the project's "
                        "kernel), fa4 (FlashAttention-4 through cad.fa4, on SM90+ with flash-attn-4 installed) or "
                        "torch (plain torch, fp32 math); FORWARD+BACKWARD chooses per direction, e.g. default+fa4: "
                        "our forward, FA4's backward")
    p.add_argument("--ping-pong-lanes", type=int, choices=[1, 2], default=2,
                   help="with --ping-pong: 2 (default) runs each nano-batch's plans on its own CAD lane (its own "
                        "communicator and communication stream: cad.plan's lane), 1 runs both on one, where "
                        "nano-batch 1's send queues behind nano-batch 0's return")
    p.add_argument("--json-out", default=None, help="write every step's record and the summary here (rank 0); "
                   "with --configs it must contain {config}, replaced by each configuration's name")
    p.add_argument("--configs", default=None,
                   help="train several configurations one after another in this process (one start-up): a comma "
                        "list of 'local' (the project's kernels, no CAD), 'local_balanced' (local on the batches "
                        "made balanced: --balanced-batches), 'torch_varlen' (torch's varlen_attn; "
                        "skipped with a note on CPU or without it), 'fa4' (FlashAttention-4, refused where it "
                        "cannot run) or a balancer name (CAD: per_doc_cp, distca, "
                        "prefix_aware, colocated), each optionally with '+pp' (--ping-pong), '+pp1' (--ping-pong "
                        "--ping-pong-lanes 1), '+ppmb' (--ping-pong --ping-pong-nanos micro-batches), '+ppauto' (--ping-pong --ping-pong-when worthwhile), '+ovauto' (--overlap auto), '+now' "
                        "(--plan-ahead off), '+blocking' (--cad-nccl-blocking), '+own' (--cad-own-tasks on), '+resN' "
                        "(--cad-own-reserve-sms N), '+dyn' (--cad-forward-walk dynamic), '+time' (--balance-time), '+ce' "
                        "(--cad-nccl-copy-engines), '+ctasN' "
                        "(--cad-nccl-max-ctas N), '+hgN' (--cad-head-groups N) and/or '+tolT' (--balancer-tolerance "
                        "T), e.g. "
                        "local,torch_varlen,prefix_aware,prefix_aware+now,distca+pp. Each starts from the same "
                        "weights; its JSON is --json-out with {config} = its name, + '_plannow' with +now, + "
                        "'_pingpong' with +pp, + '_pingpongmb' with +ppmb, + '_pingpong1lane' with +pp1, + '_autopingpong' with +ppauto, + '_autooverlap' with +ovauto, + "
                        "'_ncclblocking' with +blocking, + '_own' with +own, + '_dyn' with +dyn, + '_time' with +time, "
                        "+ '_ce' with +ce, "
                        "+ '_tolT' with +tolT, "
                        "+ '_resN' with +resN, + '_ctasN' with +ctasN, + '_hgN' with +hgN. Overrides --attention, "
                        "--balancer, --ping-pong, --ping-pong-nanos, --plan-ahead, --cad-nccl-blocking, --cad-own-tasks, "
                        "--cad-own-reserve-sms, --cad-forward-walk, --cad-nccl-max-ctas, --cad-head-groups, "
                        "--balancer-tolerance, --balance-time, --cad-nccl-copy-engines")
    p.add_argument("--plan-ahead", choices=["on", "off"], default="on",
                   help="CAD's plans: on (default): a micro-batch's plans are asked for when the micro-batch before "
                        "it starts (the next step's first during this step's last) and made on CAD's planning "
                        "thread, their collectives on a gloo group of their own (cad.plan(ahead=True)); each step "
                        "records how long its forwards still waited for them (plan_wait_ms). off: made at the "
                        "micro-batch's start, on the training thread (collective, waits for every rank)")
    p.add_argument("--gc", choices=["auto", "freeze"], default="auto",
                   help="Python's garbage collector: auto (as is), or freeze: gc.freeze() once the model and "
                        "optimizer exist, so that collections no longer scan them (every step records its "
                        "collector pauses per rank: gc_ms, gc_full_collections)")
    p.add_argument("--profile-step", type=int, default=-1,
                   help="after the timed steps, run this step's batch once more under torch.profiler and write, "
                        "per rank, its GPU kernel time by family (attention, cad data path, nccl, gemm, other) and "
                        "its top kernels to <json-out stem>_profile_rank<R>.json; its record is the JSON's "
                        "\"profiled_step\", outside \"steps\" (default -1: no profiling)")
    p.add_argument("--list-configs", action="store_true",
                   help="with --configs: print each configuration and its name in the JSON files (config<TAB>name, "
                        "one per line) and exit, training nothing")
    p.add_argument("--profile-trace", action="store_true",
                   help="with --profile-step: also write the profiled step's timeline per rank to <json-out stem>"
                        "_trace_rank<R>.json (Chrome trace format: every kernel on its stream, every host call)")
    args = apply_model_defaults(p.parse_args(argv))
    # NCCL for the gradients only where CAD uses NCCL too (one process per GPU); processes sharing a GPU
    # (communicator host or mpi) average their gradients over gloo.
    args.backend = "nccl" if args.device == "cuda" and args.communicator in (None, "nccl") else "gloo"
    if args.parallel is None:
        args.parallel = "fsdp2" if args.backend == "nccl" else "ddp"
    if args.parallel == "fsdp2" and args.device == "cuda" and args.backend != "nccl":
        p.error("--parallel fsdp2 on CUDA needs NCCL (--communicator nccl): gloo has no CUDA reduce-scatter")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.intermediate < 0:
        p.error(f"--intermediate must be positive (or 0 for 3 x --hidden), got {args.intermediate}")
    if args.layers < 1 or args.micro_batches < 1 or args.loss_chunk < 1 or args.steps < 1:
        p.error("--layers, --micro-batches, --loss-chunk and --steps must be at least 1")
    if args.balanced_batches and args.window >= 0:
        p.error("--balanced-batches balances causal attention work; it has no meaning with --window")
    if args.window < -1:
        p.error(f"--window must be -1 (no window) or at least 0 (the keys before the query a windowed layer "
                f"sees), got {args.window}")
    if args.global_every is not None:
        if args.window < 0:
            p.error("--global-every needs --window (without a window every layer is global already)")
        if args.global_every < 2:
            p.error(f"--global-every must be at least 2 (every N-th layer global, the others windowed; 1 would "
                    f"make every layer global: drop --window instead), got {args.global_every}")
    if args.ping_pong_nanos == "micro-batches" and (args.micro_batches % 2 or not (args.ping_pong or args.configs)):
        p.error(f"--ping-pong-nanos micro-batches pairs the step's micro-batches: it needs --ping-pong and an even "
                f"--micro-batches, got --micro-batches {args.micro_batches}"
                + ("" if args.ping_pong or args.configs else " without --ping-pong"))
    if args.overlap == "auto" and (args.ping_pong or args.cad_head_groups != 1 or args.attention != "cad"):
        p.error("--overlap auto chooses ping-pong and head groups itself, for CAD attention: it does not go with "
                "--ping-pong, --cad-head-groups or --attention other than cad")
    if not 0.0 <= args.ping_pong_min_stall_share < 1.0:
        p.error(f"--ping-pong-min-stall-share must be in [0, 1), got {args.ping_pong_min_stall_share}")
    if (args.balance_time or (args.configs and "+time" in args.configs)) and \
            not pathlib.Path(args.balancer_rate_table).is_file():
        p.error(f"--balancer-rate-table: {args.balancer_rate_table} is not a file (the kernel-rate table --balance-time "
                f"and '+time' predict with)")
    if args.balancer_min_time_gain is not None and not 0 <= args.balancer_min_time_gain <= 1:
        p.error(f"--balancer-min-time-gain must be in [0, 1], got {args.balancer_min_time_gain}")
    if args.balancer_tolerance is not None and not 0 <= args.balancer_tolerance <= 10:
        p.error(f"--balancer-tolerance must be in [0, 10], got {args.balancer_tolerance}")
    if not 1 <= args.cad_head_groups <= 64 or args.heads % args.cad_head_groups or args.kv_heads % args.cad_head_groups:
        p.error(f"--cad-head-groups must be in [1, 64] and divide --heads ({args.heads}) and --kv-heads "
                f"({args.kv_heads}), got {args.cad_head_groups}")
    if args.checkpoint_reentrant and args.checkpointing != "full":
        p.error("--checkpoint-reentrant applies to --checkpointing full only (selective checkpointing is "
                "non-reentrant)")
    if args.profile_step >= args.steps:
        p.error(f"--profile-step must name one of the {args.steps} steps (0..{args.steps - 1}), got {args.profile_step}")
    if args.list_configs and args.configs is None:
        p.error("--list-configs lists the configurations of --configs: give --configs")
    if args.configs is not None:
        names = args.configs.split(",")
        def refused(name):
            base, *modes = name.split("+")
            splits = {"pp", "pp1", "ppauto", "ppmb"} & set(modes)
            numbered = numbered_modes(modes)
            tolerances, reserves, ctas, groups = numbered["tol"], numbered["res"], numbered["ctas"], numbered["hg"]
            return (not base or any(m not in ("pp", "pp1", "ppauto", "ppmb", "ovauto", "now", "blocking", "own", "dyn",
                                              "time", "ce", "fa4srv", "fa4bwd")
                                    and m not in tolerances + reserves + ctas + groups for m in modes)
                    or len(groups) > 1 or (groups and not 1 <= int(groups[0][2:]) <= 64)
                    or (groups and (args.heads % int(groups[0][2:]) or args.kv_heads % int(groups[0][2:])))
                    or (groups and base in NOT_CAD)
                    or len(reserves) > 1 or (reserves and (base in NOT_CAD
                                                           or "own" not in modes or int(reserves[0][3:]) > 64))
                    or len(ctas) > 1 or (ctas and int(ctas[0][4:]) > 64)
                    or (base in NOT_CAD and ("dyn" in modes or ctas))
                    or len(set(modes)) != len(modes) or len(splits) > 1 or (base == "local_balanced" and modes)
                    or (base in NOT_CAD and ("blocking" in modes or "own" in modes
                                                                                 or "ce" in modes))
                    or ("time" in modes and base != "prefix_aware")
                    or (base in NOT_CAD and ("fa4srv" in modes or "fa4bwd" in modes))
                    or ("fa4srv" in modes and "fa4bwd" in modes)
                    or ("ovauto" in modes and (base in NOT_CAD or splits or groups))
                    or ("ppmb" in modes and args.micro_batches % 2)
                    or (tolerances and (base not in ("distca", "prefix_aware") or len(tolerances) > 1
                                        or float(tolerances[0][3:]) > 10)))
        bad = [n for n in names if refused(n)]
        if bad:
            p.error(f"--configs: {bad[0]!r} is not 'local', 'local_balanced', 'torch_varlen', 'fa4' or a balancer "
                    f"name, "
                    f"optionally with one of '+pp', '+pp1', '+ppauto', '+ppmb' (even "
                    f"--micro-batches), and/or '+now', and/or (a balancer) "
                    f"'+blocking', '+ovauto' (no '+pp*' or '+hgN' with it), '+own' (with it '+resN', N <= 64), '+dyn', '+ce', '+ctasN' (N <= 64), '+hgN' (N "
                    f"dividing --heads and --kv-heads), one of '+fa4srv' (FA4 servers) or '+fa4bwd' (FA4's backward on the "
                    f"servers), and/or (distca, "
                    f"prefix_aware) one '+tolT' with T in [0, 10], and/or (prefix_aware) '+time' (local_balanced: "
                    f"none)")
        if args.json_out and "{config}" not in args.json_out:
            p.error("--json-out must contain {config} with --configs (one JSON per configuration)")
    modes = [m for name in (args.configs or "").split(",") for m in name.split("+")[1:]]
    long_docs.check_options(p, args, [
        ("--ping-pong", args.ping_pong or any(m.startswith("pp") for m in modes)),
        ("--overlap auto (+ovauto)", args.overlap == "auto" or "ovauto" in modes),
        ("--balanced-batches (local_balanced)", args.balanced_batches or "local_balanced" in (args.configs or ""))])
    resolve_attention_timing(args)
    return args

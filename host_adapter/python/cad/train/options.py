"""What the project's trainers share on their command lines: the --model presets and their defaults, and the
attention clock's --sync-attention-timing option."""
import os
import pathlib

# The checkout's root (host_adapter/python/cad/train/ is four floors down): the default paths of the data and the
# rate tables. From an installed package these do not exist; give --data (or CAD_DATA) and the table there.
REPO = pathlib.Path(__file__).resolve().parents[4]


def default_data():
    """--data's default: $CAD_DATA, else the Pretrain document lengths beside the checkout."""
    return os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" / "doclen_pretrain.json"))


MODELS = {  # --model presets: what --hidden, --heads, ... default to
    "tiny": dict(hidden=128, heads=4, kv_heads=2, intermediate=0, vocab=1024, layers=2),
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, layers=32),
}


def apply_model_defaults(args):
    """Fill what the command line left open from --model's preset (MODELS), --intermediate 0 as 3 x --hidden, and
    --dtype by --device (bf16 on CUDA, fp32 on the CPU). Returns args."""
    for key, value in MODELS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate == 0:
        args.intermediate = args.hidden * 3
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    return args


def add_attention_timing_option(parser, on_means):
    """--sync-attention-timing auto|on|off, as train_llama.py, train_pipeline.py and Megatron's train_gpt_cad.py
    take it; `on_means`: what `on` gives that trainer. resolve_attention_timing(args) turns `auto` into a choice."""
    parser.add_argument("--sync-attention-timing", choices=["auto", "on", "off"], default="auto",
                        help=f"on: {on_means}; off: no CUDA waits around attention calls, step times as a trainer "
                             "without the measurement has them, attention times count only the enqueue; auto "
                             "(default): off on CUDA, on elsewhere. The syncs slow an imbalanced step far more than "
                             "a balanced one (local attention 6-12%% slower on 2 H200s, CAD 1%%, "
                             "measured 2026-11-26), so step times and speedups come from off")


def resolve_attention_timing(args):
    """`auto` -> off on CUDA (step times without the syncs), on elsewhere (nothing to wait for)."""
    if args.sync_attention_timing == "auto":
        args.sync_attention_timing = "off" if args.device == "cuda" else "on"

"""What both TorchTitan recipes share (train_titan_cad.py for torchtitan 0.3, titan_cad_spec.py for 0.2.x): running
TorchTitan on the CPU, stand-ins for the packages it imports but the recipes never use, and the no-download
packed-document data of the Pretrain recipe (per rank; or PackedStream: packed whole over the data x context ranks).
Import this before torchtitan."""
import os
import pathlib
import sys
import types

import torch

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
IGNORE_INDEX = -100


# ---- the tokenizer both recipes use (each subclasses its torchtitan version's BaseTokenizer with it) ----------
class SyntheticIds:
    """No files: ids are their own text; EOS is the last id of the vocabulary. Set vocab_size first, then
    call _set_vocab(vocab_size) from the subclass's __init__ (whose signature is its torchtitan version's)."""

    def _set_vocab(self, vocab_size):
        self.vocab_size = vocab_size
        self.eos_id = vocab_size - 1

    def encode(self, text, *args, **kwargs):
        return [int(t) for t in str(text).split()]

    def decode(self, ids, *args, **kwargs):
        return " ".join(str(int(i)) for i in ids)

    def get_vocab_size(self):
        return self.vocab_size


# ---- environment: CPU device and optional packages ------------------------------------------------------------
def cpu_requested():
    return os.environ.get("CAD_TT_DEVICE", "cuda" if torch.cuda.is_available() else "cpu") == "cpu"


class _CpuDeviceModule(types.ModuleType):
    """torch.cpu plus what torchtitan's DeviceMemoryMonitor and MFU code ask of a device module."""

    def __init__(self):
        super().__init__("cad_tt_cpu_device")
        for name in dir(torch.cpu):
            if not name.startswith("__"):
                setattr(self, name, getattr(torch.cpu, name))
        self.set_device = lambda *a, **k: None
        self.get_device_name = lambda *a, **k: "cpu"
        self.current_device = lambda *a, **k: 0
        self.device_count = lambda *a, **k: 1
        self.get_device_properties = lambda *a, **k: types.SimpleNamespace(total_memory=1 << 40, name="cpu")
        self.reset_peak_memory_stats = lambda *a, **k: None
        self.empty_cache = lambda *a, **k: None
        self.memory_stats = lambda *a, **k: {}
        self.manual_seed = lambda seed: torch.manual_seed(seed)
        self.manual_seed_all = lambda seed: torch.manual_seed(seed)
        self.is_available = lambda: True


def use_cpu():
    import torch._utils as tu
    cpu_module = _CpuDeviceModule()
    tu._get_available_device_type = lambda: "cpu"
    original = tu._get_device_module
    tu._get_device_module = lambda device_type="cuda": cpu_module if device_type == "cpu" else original(device_type)
    # gloo for the cpu device (torchtitan asks Backend.default_device_backend_map[device_type])
    torch.distributed.Backend.default_device_backend_map.setdefault("cpu", "gloo")
    # TorchTitan sets FSDP2's gradient divide factor to 1 (it scales by the global token count itself), which FSDP2
    # turns into ReduceOp.PREMUL_SUM(1.0) -- refused by gloo. Forcing sum reductions gives SUM with a 1.0 factor.
    from torch.distributed.fsdp import FSDPModule
    set_factor = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self, factor):
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)
    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def stub_missing_modules():
    """torchtitan imports torch.utils.tensorboard (metrics) and `datasets` (its HF text datasets, imported by the
    model registries) at module level; this recipe uses neither (tensorboard off, the synthetic dataset). Where
    they are not installed, stand-ins that fail only if used."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except Exception:
        tb = types.ModuleType("torch.utils.tensorboard")

        class SummaryWriter:  # noqa: D401
            def __init__(self, *a, **k):
                raise RuntimeError("tensorboard is not installed: leave metrics.enable_tensorboard off")
        tb.SummaryWriter = SummaryWriter
        sys.modules["torch.utils.tensorboard"] = tb
    try:
        import datasets  # noqa: F401
    except Exception:
        ds = types.ModuleType("datasets")
        dist = types.ModuleType("datasets.distributed")

        def _absent(*a, **k):
            raise RuntimeError("the `datasets` package is not installed (this recipe's data needs none)")
        ds.Dataset = type("Dataset", (), {})
        ds.IterableDataset = type("IterableDataset", (), {})
        ds.load_dataset = _absent
        dist.split_dataset_by_node = _absent
        ds.distributed = dist
        sys.modules["datasets"] = ds
        sys.modules["datasets.distributed"] = dist


def prepare():
    """CPU (CAD_TT_DEVICE=cpu, or no CUDA) and the stand-ins; idempotent."""
    if getattr(prepare, "done", False):
        return
    if cpu_requested():
        use_cpu()
    stub_missing_modules()
    prepare.done = True




# ---- data ---------------------------------------------------------------------------------------------------------
def leave_after_training():
    """End a launcher's process after TorchTitan's main returned (training over, records written, process groups
    destroyed) without the interpreter's finalization, where gloo's worker threads can still drop tensors and
    take the GIL of a dying interpreter: CI saw rank 1 abort (SIGABRT) there after a successful run under torch
    2.15 (cf. PyTorch PR 179291). A failed run raises before this and exits through Python as usual."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _recipe():
    from cad.train import recipe  # the trainers' batch recipe (cached_batch, balanced_documents)
    return recipe


def default_data_path():
    for p in (os.environ.get("CAD_DATA"), REPO.parent / "shared" / "data" / "doclen_pretrain.json",
              REPO / ".bench_data" / "doclen_pretrain.json"):
        if p and pathlib.Path(p).is_file():
            return str(p)
    return None


# training.dataset / dataloader.dataset names -> PackedDocuments' `balanced`; STREAM: PackedStream
DATASETS = {"pretrain_synthetic": False, "pretrain_synthetic_balanced": True}
STREAM = "pretrain_stream"


def packed_documents(dataset, lengths, seq_len, vocab_size, dp_rank, dp_world_size, seed, eos_id=None):
    """The PackedDocuments a dataset name selects; an unknown name is refused, naming the accepted ones."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset {dataset!r}: expected one of {', '.join(DATASETS)} (packed Pretrain-recipe "
                         "documents; _balanced: equal attention work per rank, for the measured ideal) or "
                         f"{STREAM} (PackedStream: documents packed whole over the data x context ranks)")
    return PackedDocuments(lengths, seq_len, vocab_size, dp_rank, dp_world_size, seed, eos_id=eos_id,
                           balanced=DATASETS[dataset])


class PackedDocuments(torch.utils.data.IterableDataset):
    """One packed row per sample: this data-parallel rank's documents of the Pretrain recipe's batch number i
    (the same batches on every rank, each rank its own share), random tokens, positions restarting per document."""

    def __init__(self, lengths, seq_len, vocab_size, dp_rank, dp_world_size, seed, eos_id=None, balanced=False):
        """eos_id: where TorchTitan finds documents by their EOS token (0.2.x), every document's last token is
        eos_id and no other token is (tokens drawn below it); None: tokens from the whole vocabulary (0.3 reads
        `positions`). balanced: every rank's row cut into equal-length documents whose causal attention work is the
        mean rank's (the example trainer's --balanced-batches): local attention on these rows measures the ideal
        that perfect balance would give, everything else as in the real batch."""
        self.eos_id, self.balanced = eos_id, balanced
        self.lengths, self.seq_len, self.vocab_size = lengths, seq_len, vocab_size
        self.dp_rank, self.dp_world_size, self.seed = dp_rank, dp_world_size, seed
        self.recipe = _recipe()
        self.index = 0

    def documents(self, index):
        docs = self.recipe.cached_batch(self.lengths, self.seq_len, self.dp_world_size, self.seed + index)
        # the recipe may run short: one more document fills each row
        docs = [d + [self.seq_len - sum(d)] if sum(d) < self.seq_len else list(d) for d in docs]
        if self.balanced:
            docs = self.recipe.balanced_documents(docs)
        return docs[self.dp_rank]

    def __iter__(self):
        while True:
            docs = self.documents(self.index)
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.index * 131 + self.dp_rank)
            high = self.vocab_size if self.eos_id is None else self.eos_id
            tokens = torch.randint(0, high, (self.seq_len + 1,), generator=g)
            positions = torch.cat([torch.arange(n) for n in docs])
            ends = torch.tensor(docs).cumsum(0) - 1
            if self.eos_id is not None:
                tokens[ends] = self.eos_id
            labels = tokens[1:].clone()
            labels[ends] = IGNORE_INDEX  # a document's last token predicts nothing
            self.index += 1
            yield {"input": tokens[:-1], "positions": positions}, labels

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


# ---- documents packed whole over the data x context ranks (context parallelism) ------------------------------------
CAD_KEYS = ("cad_doc", "cad_doc_len")  # PackedStream's per-token document ids and lengths (input_dict keys)
_STREAMS = {}


def stream_documents(lengths, max_doc_len, tokens, seed):
    """The step's document lengths, in order, at least `tokens` of them: the Pretrain recipe's documents (cut at
    64K, then scaled so that 64K becomes max_doc_len: the longest document is its own setting, apart from the
    tokens per rank), more of its passes until they hold `tokens`. Remembered (the recipe walks the whole file)."""
    key = (id(lengths), max_doc_len, tokens, seed)
    if key not in _STREAMS:
        recipe, docs, extra = _recipe(), [], 0
        while sum(docs) < tokens:
            docs += recipe.recipe_documents(lengths, max_doc_len, seed * 1024 + extra)
            extra += 1
        _STREAMS[key] = (lengths, docs)
    return list(_STREAMS[key][1])


def stream_tokens(capacity, vocab_size, seed, index, eos_id=None, layouts=()):
    """The step's token stream: capacity + 1 tokens drawn from (seed, index) alone -- the same whatever the ranks'
    layout, so that one process running the documents unsplit sees the same tokens -- with eos_id (when given) at
    every document's last token and nowhere else."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index * 131)
    high = vocab_size if eos_id is None else eos_id
    tokens = torch.randint(0, high, (capacity + 1,), generator=g)
    if eos_id is not None:
        for layout in layouts:
            at = layout.start
            for _, doc_len, offset, n in layout.pieces:
                at += n
                if offset + n == doc_len:
                    tokens[at - 1] = eos_id
    return tokens


def stream_rows(layouts, tokens, doc_base=0):
    """(input_dict, labels) of the consecutive ranks `layouts` (RankLayouts of one stream) as one row: their tokens,
    positions continuous across every cut, labels with the next rank's first token after a piece's last one (-100 at
    a document's end), and per token its document's id (doc_base + its index in the stream) and length, from
    which any slice of the row gives its pieces (pieces_of)."""
    ids = tokens[layouts[0].start:layouts[-1].stop]
    labels = torch.cat([layout.targets(tokens) for layout in layouts])
    positions = torch.cat([layout.position_ids() for layout in layouts])
    doc = torch.cat([torch.full((n,), doc_base + d, dtype=torch.int64)
                     for layout in layouts for d, _, _, n in layout.pieces])
    doc_len = torch.cat([torch.full((n,), length, dtype=torch.int64)
                         for layout in layouts for _, length, _, n in layout.pieces])
    return {"input": ids, "positions": positions, "cad_doc": doc, "cad_doc_len": doc_len}, labels


def pieces_of(doc, doc_len, positions):
    """The pieces (doc_id, doc_len, offset_in_doc, len) of a row's tokens (1-D or [B, L], rows in order) from their
    document ids, lengths and positions: a new piece wherever the document changes."""
    doc, doc_len, positions = (t.reshape(-1).tolist() for t in (doc, doc_len, positions))
    pieces = []
    for i, (d, n, p) in enumerate(zip(doc, doc_len, positions)):
        if pieces and pieces[-1][0] == d and i > 0 and positions[i - 1] + 1 == p:
            last = pieces[-1]
            pieces[-1] = (d, n, last[2], last[3] + 1)
        else:
            pieces.append((d, n, p, 1))
    return pieces


class PackedStream(torch.utils.data.IterableDataset):
    """dataset "pretrain_stream": per sample, the step's documents (stream_documents) packed whole over the
    batch_world x cp ranks by cad.pack_documents, seq_len // cp tokens each, in the order of TorchTitan's loss
    mesh (batch index, then cp index). The row of batch rank b is its cp ranks' tokens, one after the other (what
    TorchTitan's dataloader gives the ranks of one CP group); each rank then takes its own cp share of it
    (titan_parallel.context_share). A document cut at a rank boundary stays one document: positions continuous,
    its label across the cut kept, and its pieces named by the same document id on every rank."""

    def __init__(self, lengths, seq_len, vocab_size, batch_rank, batch_world, cp, seed, max_doc_len=None,
                 eos_id=None):
        import cad
        if seq_len % cp:
            raise ValueError(f"PackedStream: seq_len {seq_len} is not divisible by context_parallel_degree {cp}")
        self.cad = cad
        self.lengths, self.seq_len, self.vocab_size = lengths, seq_len, vocab_size
        self.batch_rank, self.batch_world, self.cp, self.seed = batch_rank, batch_world, cp, seed
        self.max_doc_len = max_doc_len or seq_len
        self.eos_id = eos_id
        self.index = 0

    def layouts(self, index):
        ranks = self.batch_world * self.cp
        docs = stream_documents(self.lengths, self.max_doc_len, ranks * (self.seq_len // self.cp),
                                self.seed + index)
        return self.cad.pack_documents(docs, self.seq_len // self.cp, ranks, max_doc_len=self.max_doc_len)

    def sample(self, index):
        layouts = self.layouts(index)
        tokens = stream_tokens(layouts[-1].stop, self.vocab_size, self.seed, index, self.eos_id, layouts)
        mine = layouts[self.batch_rank * self.cp:(self.batch_rank + 1) * self.cp]
        return stream_rows(mine, tokens, doc_base=index << 32)

    def __iter__(self):
        while True:
            sample = self.sample(self.index)
            self.index += 1
            yield sample

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]

#!/usr/bin/env python3
"""TorchTitan's own trainer (PyPI torchtitan 0.3.0, `torchtitan.train`) on packed documents with CAD attention.

This module is both a TorchTitan config registry (`--module` takes a fully qualified module path) and a thin
launcher around `torchtitan.train.main`:

    PYTHONPATH=host_adapter/python:integrations/torchtitan \
    torchrun --nproc-per-node 2 integrations/torchtitan/train_titan_cad.py \
        --module train_titan_cad --config llama3_8b_cad \
        --training.seq_len 65536 --training.steps 6 --compile.enable

(`python -m torchtitan.train --module train_titan_cad --config ...` works too where tensorboard and `datasets`
import; the launcher puts stubs in for them when they do not, see _stub_missing_modules.)

Config functions (the recipe: `--config` picks the attention; TorchTitan 0.3 has no `model.attn_type` key, the
backend is part of the model registry's config):
  llama3_8b_cad          Llama 3 8B shape, every layer's inner attention CadVarlenAttention, a cad.plan per
                         micro-batch made ahead (cad_torchtitan.cad_trainer: post_dataloading_process);
  llama3_8b_local        the same layers without plans (the project's varlen kernels on each rank's documents);
  llama3_8b_torch_varlen torch's varlen_attn with K/V heads repeated (TorchTitan 0.3's own VarlenAttention passes
                         enable_gqa/num_splits, which torch 2.11 lacks; this keeps the same call otherwise);
  llama3_8b_varlen       TorchTitan's own VarlenAttention, unchanged (needs a torch whose varlen_attn takes
                         enable_gqa, i.e. newer than 2.11);
  llama3_8b_flex         TorchTitan's FlexAttention with its document mask (attn_backend="flex");
  llama3_debug_*         the same five on TorchTitan's debugmodel shape (CPU tests).
Environment knobs read by the config functions (CLI keys of TorchTitan override the rest): CAD_TT_AC
(selective -- TorchTitan's default, SelectiveAC --, full, none), CAD_TT_LAYERS (8B: 4),
CAD_TT_VOCAB (8B: 32768; the embedding, the output layer and the loss shrink with it), CAD_TT_BALANCER
(prefix_aware), CAD_TT_JSON (rank 0 writes every step's record there), CAD_DATA (the Pretrain recipe's
document lengths, doclen_pretrain.json).

Training as TorchTitan configures it: FSDP2 over the data-parallel ranks (parallelize_llama, `--parallelism.*`),
selective activation checkpointing (`--activation_checkpoint.*`; SelectiveAC by default, as llama3_8b),
torch.compile per TransformerBlock with `--compile.enable`, AdamW, TorchTitan's chunked cross entropy.

Data: PackedDocumentDataLoader, no download: per step and rank one packed row of seq_len tokens whose document
lengths are examples/train_llama.py's Pretrain recipe (sample_batch over doclen_pretrain.json, documents cut at
64K and scaled by seq_len/64K, dealt over the data-parallel ranks), random tokens (seeded), `positions`
restarting at 0 at every document (TorchTitan turns them into the varlen metadata / the flex document mask), labels
the next token of the same document (-100 at a document's last token). Tokenizer: SyntheticTokenizer (no files).

CPU: torchtitan picks CUDA whenever no accelerator is found; with CAD_TT_DEVICE=cpu (or no CUDA) the launcher makes
it see the CPU (torch._utils' device lookup and a small device module for its memory monitor) and the process
group gloo. See docs/integrations.md.
"""
import dataclasses
import json
import os
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
IGNORE_INDEX = -100


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import titan_common  # noqa: E402
from titan_common import default_data_path, packed_documents  # noqa: E402

titan_common.prepare()
_cpu_requested = titan_common.cpu_requested

from torchtitan.components.dataloader import ParallelAwareDataloader  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: E402
from torchtitan.models.common.attention import VarlenAttention  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402
from torchtitan.models.llama3 import config_registry as _llama3_configs  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

import cad  # noqa: E402
import cad_torchtitan  # noqa: E402
from cad_torchtitan import cad_trainer, use_cad  # noqa: E402


# ---- tokenizer and data ------------------------------------------------------------------------------------------
class SyntheticTokenizer(titan_common.SyntheticIds, BaseTokenizer):
    """Token ids are their own text (titan_common.SyntheticIds): no files. The data is synthetic, so only get_vocab_size matters."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 32768

    def __init__(self, config: Config, **kwargs):
        super().__init__()
        self._set_vocab(config.vocab_size)


class PackedDocumentDataLoader(ParallelAwareDataloader):
    """dataset "pretrain_synthetic" (or "pretrain_synthetic_balanced": the measured ideal, titan_common.DATASETS):
    PackedDocuments over dataset_path (doclen_pretrain.json; default CAD_DATA, ../shared/data, .bench_data)."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "pretrain_synthetic"
        seed: int = 1

    def __init__(self, config: Config, *, dp_world_size, dp_rank, tokenizer, seq_len, local_batch_size,
                 snapshot_every_n_steps=None, **kwargs):
        path = config.dataset_path or default_data_path()
        if path is None:
            raise FileNotFoundError("PackedDocumentDataLoader: no doclen_pretrain.json (set dataloader.dataset_path "
                                    "or CAD_DATA)")
        lengths = json.loads(pathlib.Path(path).read_text())
        dataset = packed_documents(config.dataset, lengths, seq_len, tokenizer.get_vocab_size(), dp_rank,
                                   dp_world_size, config.seed)
        super().__init__(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local_batch_size,
                         num_workers=0)


# ---- a baseline TorchTitan 0.3 cannot run on torch 2.11 ------------------------------------------------------------
class TorchVarlenAttention(VarlenAttention):
    """TorchTitan's VarlenAttention call of torch.nn.attention.varlen.varlen_attn without enable_gqa/num_splits
    (absent in torch 2.11): K/V heads are repeated to the query heads instead. No flash-implementation switch."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config: Config) -> None:
        torch.nn.Module.__init__(self)
        self.window_size = tuple(config.window_size)

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, out_transform=None, **kwargs):
        from torch.nn.attention.varlen import varlen_attn
        if out_transform is not None:
            raise NotImplementedError("TorchVarlenAttention: out_transform (the LSE) is not supported")
        B, L, Hq, D = q_BLNH.shape
        T = B * L
        q, k, v = (t.reshape(T, -1, t.shape[-1]).to(torch.bfloat16) for t in (q_BLNH, k_BLNH, v_BLNH))
        if k.shape[1] != Hq:
            r = Hq // k.shape[1]
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        m = attention_masks
        out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), m.cu_seq_q, m.cu_seq_k, m.max_q, m.max_k,
                          scale=scale, window_size=self.window_size)
        return out.view(B, L, -1, v_BLNH.shape[-1]).to(q_BLNH.dtype)


def use_torch_varlen(model_config):
    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        if getattr(attention, "inner_attention", None) is not None:
            attention.inner_attention = TorchVarlenAttention.Config(window_size=attention.inner_attention.window_size)
    return model_config


# ---- the trainer: step times, losses, CAD's init ------------------------------------------------------------------
class CadSelectiveAC(SelectiveAC):
    """TorchTitan 0.3's per-op selective AC with CAD's forward op among the ops whose outputs it saves.

    SelectiveAC saves the outputs of the ops get_save_ops() names -- TorchTitan's own attention ops among them
    (SDPA, FlexAttention, torch's varlen_attn) -- and recomputes the rest in the backward. Without CAD's op there,
    every layer's backward ran CAD's forward again, its exchanges included, which TorchTitan's own attention does
    not pay. get_save_ops is the documented place to change that set (TorchTitan 0.2.x: titan_cad_spec.py)."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(SelectiveAC.Config):
        pass

    def get_save_ops(self):
        return set(super().get_save_ops()) | {torch.ops.cad.varlen_fwd.default}


class RecordingTrainer(Trainer):
    """TorchTitan's Trainer, plus: every step's wall time (device-synchronized) and loss, printed by rank 0 and
    written to $CAD_TT_JSON at the end; cad.init(balancer=$CAD_TT_BALANCER) before the first plan."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def __init__(self, config):
        super().__init__(config)
        self.records = []
        self._last_loss = self._peak_gib = None
        log = self.metrics_processor.log

        def capture(step, global_avg_loss, global_max_loss, grad_norm, *a, **k):
            self._last_loss = float(global_avg_loss)
            if self.device.type == "cuda":  # read before TorchTitan's log resets the peak statistics
                self._peak_gib = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
            return log(step, global_avg_loss, global_max_loss, grad_norm, *a, **k)
        self.metrics_processor.log = capture
        if any(isinstance(getattr(getattr(layer, "attention", None), "inner_attention", None),
                          cad_torchtitan.CadVarlenAttention.Config) for layer in self.model_config.layers):
            # keep_forward_tensors="auto" keeps a recomputed layer's forward state on the servers, a different op
            # sequence from the first forward's (t.new_empty stand-ins), which per-op selective AC refuses
            # ("new_empty encountered during backward but not found in storage"): with SelectiveAC, the owners keep it.
            keep = False if isinstance(self.config.activation_checkpoint, SelectiveAC.Config) else "auto"
            cad.init(balancer=os.environ.get("CAD_TT_BALANCER", "prefix_aware"), keep_forward_tensors=keep)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train_step(self, data_iterator):
        self._sync()
        cad.attention_time(reset=True)  # and the call count
        start = time.perf_counter()
        super().train_step(data_iterator)
        self._sync()
        seconds = time.perf_counter() - start
        calls = cad.attention_calls()
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        # attention_calls: this rank's CAD attention calls whose work ran (forwards, recomputed ones included, and
        # backwards): 2 per layer and micro-batch where selective AC saves the forward, 3 where it recomputes it.
        record = {"step": self.step, "step_s": float(t.item()), "loss": self._last_loss,
                  "tokens_per_rank": self.config.training.seq_len * self.config.training.local_batch_size,
                  "attention_calls": calls}
        if self._peak_gib is not None:  # the step's peak, as capture() read it before log() reset it
            record["peak_gib"], self._peak_gib = self._peak_gib, None
        self.records.append(record)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"CAD_TT step {self.step} step_s {record['step_s']:.4f} loss {record['loss']}", flush=True)

    def close(self):
        path = os.environ.get("CAD_TT_JSON")
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        if path and rank0 and getattr(self, "records", None):
            steady = [r["step_s"] for r in self.records[1:]] or [self.records[0]["step_s"]]
            inner = type(self.model_config.layers[0].attention.inner_attention).__qualname__
            summary = {"attention": inner, "balancer": os.environ.get("CAD_TT_BALANCER", "prefix_aware"),
                       "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
                       "layers": len(self.model_config.layers), "seq_len": self.config.training.seq_len,
                       "compile": self.config.compile.enable,
                       "activation_checkpoint": type(self.config.activation_checkpoint).__qualname__,
                       "mean_step_s_after_first": sum(steady) / len(steady), "steps": self.records}
            pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(path).write_text(json.dumps(summary, indent=1))
        cad.shutdown()  # CAD's stacks (their gloo groups) before TorchTitan's main destroys the process groups
        super().close()


# ---- config functions ----------------------------------------------------------------------------------------------
def _shrink(config, layers, vocab):
    model = config.model_spec.model
    model.layers = model.layers[:layers]
    if vocab:
        model.vocab_size = vocab
        model.tok_embeddings.num_embeddings = vocab
        model.lm_head.out_features = vocab
        config.loss.loss_fn.global_vocab_size = vocab
    return config


def _common(config, vocab):
    config.tokenizer = SyntheticTokenizer.Config(vocab_size=vocab or config.model_spec.model.vocab_size)
    config.dataloader = PackedDocumentDataLoader.Config()
    config.hf_assets_path = str(HERE)  # unused: the tokenizer reads no files
    config.validator.enable = False
    config.checkpoint.enable = False
    config.metrics.enable_tensorboard = False
    config.metrics.log_freq = 1
    config.profiler.enable_profiling = False
    config.training.disable_cuda_graphs = True
    return config


def _as(config, trainer_class):
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return trainer_class.Config(**values)


_CadRecordingTrainer = cad_trainer(RecordingTrainer)


def _make(base, attention, layers, vocab, **training):
    backend = "flex" if attention == "flex" else "varlen"
    config = base()
    flavor = config.model_spec.flavor
    config.model_spec = model_registry(flavor, attn_backend=backend)
    config = _shrink(config, layers, vocab)
    config = _common(config, vocab)
    for k, v in training.items():
        setattr(config.training, k, v)
    ac = os.environ.get("CAD_TT_AC", "selective")  # TorchTitan's CLI spells it as a tyro subcommand
    selective = CadSelectiveAC.Config if attention in ("cad", "local") else SelectiveAC.Config
    config.activation_checkpoint = {"selective": selective, "full": FullAC.Config, "none": lambda: None}[ac]()
    if _cpu_requested():
        config.training.mixed_precision_param = "float32"  # CAD's CPU (reference) backend computes in fp32
    if attention in ("cad", "local"):
        use_cad(config.model_spec.model, **({"compute_dtype": None} if _cpu_requested() else {}))
    elif attention == "torch_varlen":
        use_torch_varlen(config.model_spec.model)
    return _as(config, _CadRecordingTrainer if attention == "cad" else RecordingTrainer)


def _8b(attention):
    layers = int(os.environ.get("CAD_TT_LAYERS", 4))
    vocab = int(os.environ.get("CAD_TT_VOCAB", 32768))
    return _make(_llama3_configs.llama3_8b, attention, layers, vocab, local_batch_size=1, seq_len=65536, steps=6)


def _debug(attention):
    layers = int(os.environ.get("CAD_TT_LAYERS", 2))
    return _make(_llama3_configs.llama3_debugmodel, attention, layers, None, local_batch_size=1, seq_len=1024,
                 steps=3)


def llama3_8b_cad():
    return _8b("cad")


def llama3_8b_local():
    return _8b("local")


def llama3_8b_torch_varlen():
    return _8b("torch_varlen")


def llama3_8b_varlen():
    return _8b("varlen")


def llama3_8b_flex():
    return _8b("flex")


def llama3_debug_cad():
    return _debug("cad")


def llama3_debug_local():
    return _debug("local")


def llama3_debug_torch_varlen():
    return _debug("torch_varlen")


def llama3_debug_varlen():
    return _debug("varlen")


def llama3_debug_flex():
    return _debug("flex")


if __name__ == "__main__":
    sys.modules.setdefault("train_titan_cad", sys.modules["__main__"])
    from torchtitan.train import main
    main()
    titan_common.leave_after_training()

"""CAD as TorchTitan's inner attention (torchtitan 0.3, Llama 3 and every model built on
torchtitan.models.common's GQAttention). See docs/integrations.md.

TorchTitan picks a layer's core attention by the type of `GQAttention.Config.inner_attention` (the model
registry's `attn_backend` string: "flex", "flex_flash", "varlen"); with "varlen" the trainer turns the batch's
`positions` (restarting at 0 at every document) into a `VarlenMetadata` (cu_seq_q = cu_seq_k, max_q, max_k)
once per micro-batch, and every layer's `VarlenAttention` calls torch.nn.attention.varlen.varlen_attn with it.

`CadVarlenAttention` is a `VarlenAttention` (its Config subclasses VarlenAttention.Config, so the trainer and
`Decoder.get_attention_masks` treat it as the varlen backend and build the same metadata) whose forward calls
`cad.varlen.varlen_attn` -- the same signature -- with the micro-batch's plan:

    model_spec = model_registry("8B", attn_backend="varlen")
    use_cad(model_spec.model)                   # every layer's inner attention -> CadVarlenAttention

and, for CAD across the data-parallel ranks, a plan per micro-batch: a trainer made with `cad_trainer(Trainer)`
(post_dataloading_process attaches `cad.plan(cu_seq_q, ahead=True, ...)` to the metadata). Without a plan the
layers run CAD's local varlen attention (the project's kernels; on the CPU its reference backend).
"""
import dataclasses
from typing import NamedTuple, Optional

import torch

import cad
import cad.varlen
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata

__all__ = ["CadVarlenAttention", "CadVarlenMetadata", "attach_plan", "cad_trainer", "cad_trainer_config", "use_cad"]


class CadVarlenMetadata(NamedTuple):
    """TorchTitan's VarlenMetadata plus the micro-batch's cad.Plan (a NamedTuple, so it crosses
    torch.compile'd blocks and activation checkpointing as VarlenMetadata does)."""
    cu_seq_q: torch.Tensor
    cu_seq_k: torch.Tensor
    max_q: int
    max_k: int
    cu_seq_q_host: Optional[tuple] = None
    plan: Optional[cad.Plan] = None


class CadVarlenAttention(VarlenAttention):
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        compute_dtype: Optional[str] = "bfloat16"
        """ the dtype attention runs in: "bfloat16" as TorchTitan's VarlenAttention (CAD's CUDA kernels take
            bf16), or None for the inputs' own (fp32 on the CPU) """

    def __init__(self, config: Config) -> None:
        torch.nn.Module.__init__(self)  # VarlenAttention's __init__ only picks a flash-attention implementation
        self.window_size = tuple(config.window_size)
        self.compute_dtype = None if config.compute_dtype is None else getattr(torch, config.compute_dtype)

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, out_transform=None, **kwargs):
        if not isinstance(attention_masks, (VarlenMetadata, CadVarlenMetadata)):
            raise TypeError(f"CadVarlenAttention: attention_masks must be VarlenMetadata or CadVarlenMetadata, got "
                            f"{type(attention_masks).__name__}")
        plan = getattr(attention_masks, "plan", None)
        B, L, _, qk_head_dim = q_BLNH.shape
        value_head_dim = v_BLNH.shape[-1]
        T = B * L
        q, k, v = (t.reshape(T, -1, t.shape[-1]) for t in (q_BLNH, k_BLNH, v_BLNH))
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        want_lse = out_transform is not None
        result = cad.varlen.varlen_attn(
            q.contiguous(), k.contiguous(), v.contiguous(), attention_masks.cu_seq_q, attention_masks.cu_seq_k,
            attention_masks.max_q, attention_masks.max_k, scale=scale, window_size=self.window_size,
            return_aux=cad.varlen.AuxRequest(lse=True) if want_lse else None, plan=plan)
        if not want_lse:
            return result.view(B, L, -1, value_head_dim).to(q_BLNH.dtype)
        out, lse_NT = result
        out_BLNH = out.view(B, L, -1, value_head_dim).to(q_BLNH.dtype)
        return out_transform(out_BLNH, lse_NT.transpose(0, 1).reshape(B, L, -1))


def use_cad(model_config, **config_fields):
    """Make every layer of a TorchTitan Decoder.Config (e.g. model_registry(...).model) run CAD: each
    GQAttention's inner_attention becomes CadVarlenAttention.Config, keeping its window_size. Returns the config."""
    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        inner = getattr(attention, "inner_attention", None)
        if inner is None:
            continue
        window = getattr(inner, "window_size", (-1, 0))
        attention.inner_attention = CadVarlenAttention.Config(window_size=window, **config_fields)
    return model_config


def attach_plan(masks, *, ahead=False, num_heads=None, num_kv_heads=None, head_dim=None, dtype=None, device=None,
                tag=None, causal=True):
    """masks (a micro-batch's VarlenMetadata) with a cad.plan for its documents: every rank, once per
    micro-batch, in the same order. ahead=True (with the shapes) makes the plan on CAD's planning thread."""
    plan = cad.plan(masks.cu_seq_q, causal=causal, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    dtype=dtype, device=device, ahead=ahead, tag=tag)
    return CadVarlenMetadata(masks.cu_seq_q, masks.cu_seq_k, masks.max_q, masks.max_k,
                             getattr(masks, "cu_seq_q_host", None), plan)


def _attention_shape(model_config):
    """(num_heads, num_kv_heads, head_dim, dtype, causal) of the first layer with a CadVarlenAttention."""
    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        if isinstance(getattr(attention, "inner_attention", None), CadVarlenAttention.Config):
            heads = attention.n_heads
            kv_heads = getattr(attention, "n_kv_heads", None) or heads
            head_dim = getattr(attention, "head_dim", None) or attention.dim // heads
            inner = attention.inner_attention
            dtype = getattr(torch, inner.compute_dtype) if inner.compute_dtype else torch.float32
            return heads, kv_heads, head_dim, dtype, tuple(inner.window_size) == (-1, 0)
    return None


def cad_trainer(trainer_class):
    """A subclass of TorchTitan's Trainer (or of a subclass of it) whose micro-batches carry a CAD plan: its
    post_dataloading_process -- called once per micro-batch, before the forward -- attaches
    cad.plan(cu_seq_q, ahead=True, ...) to the VarlenMetadata it built."""

    class CadTrainer(trainer_class):
        _cad_micro_batch = 0

        def post_dataloading_process(self, input_dict, labels):
            inputs, labels, extra_kwargs = super().post_dataloading_process(input_dict, labels)
            masks = extra_kwargs.get("attention_masks")
            shape = _attention_shape(self.model_config)
            if isinstance(masks, VarlenMetadata) and shape is not None:
                heads, kv_heads, head_dim, dtype, causal = shape
                extra_kwargs["attention_masks"] = attach_plan(
                    masks, ahead=True, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                    device=inputs.device, tag=self._cad_micro_batch, causal=causal)
                self._cad_micro_batch += 1
            return inputs, labels, extra_kwargs

    CadTrainer.__name__ = CadTrainer.__qualname__ = f"Cad{trainer_class.__name__}"
    base_config = getattr(trainer_class, "Config", None)
    if base_config is not None and dataclasses.is_dataclass(base_config):
        # TorchTitan builds the trainer from its config (config.build() -> Config._owner): a Config of its own
        # makes CadTrainer the owner without touching trainer_class.Config.
        CadTrainer.Config = dataclasses.dataclass(kw_only=True, slots=True)(
            type("Config", (base_config,), {"__qualname__": f"{CadTrainer.__name__}.Config"}))
        CadTrainer.Config._owner = CadTrainer
    return CadTrainer


def cad_trainer_config(trainer_config, trainer_class=None):
    """A Trainer.Config (e.g. from a TorchTitan config_registry function) as the CAD trainer's config, with every
    layer of its model running CadVarlenAttention: a config_registry function of one's own returns this, and
    `--module <that module> --config <that function>` trains with CAD."""
    trainer_class = trainer_class or _trainer_class()
    cad_class = cad_trainer(trainer_class)
    values = {f.name: getattr(trainer_config, f.name) for f in dataclasses.fields(trainer_config) if f.init}
    config = cad_class.Config(**values)
    use_cad(config.model_spec.model)
    return config


def _trainer_class():
    from torchtitan.trainer import Trainer
    return Trainer

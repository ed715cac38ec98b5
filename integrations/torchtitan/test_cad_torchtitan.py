"""CAD as TorchTitan's inner attention, one process on the CPU: a TorchTitan Llama 3 (debugmodel, 2 layers) whose
attention is CadVarlenAttention gives the logits and gradients of the same model with sdpa per document; with
a plan (CAD over a world of one), under TorchTitan's per-block torch.compile(fullgraph=True), and through the
trainer mixin's post_dataloading_process. Skipped where torchtitan cannot be imported."""
import dataclasses
import os
import sys

import pytest
import torch
import torch.nn.functional as F

torchtitan = pytest.importorskip("torchtitan.models.llama3", reason="torchtitan is not installed (pip install torchtitan)")
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata  # noqa: E402
from torchtitan.models.llama3 import llama3_configs  # noqa: E402

import cad  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from cad_torchtitan import CadVarlenAttention, CadVarlenMetadata, attach_plan, cad_trainer, use_cad  # noqa: E402


class SdpaPerDocument(VarlenAttention):
    """The reference: torch sdpa one document at a time (TorchTitan's own varlen needs CUDA)."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.window_size = tuple(config.window_size)

    def forward(self, q, k, v, *, attention_masks, scale=None, **kwargs):
        B, L, Hq, D = q.shape
        q, k, v = (t.reshape(B * L, -1, D) for t in (q, k, v))
        groups = Hq // k.shape[1]
        cu = attention_masks.cu_seq_q.tolist()
        out = []
        for a, b in zip(cu, cu[1:]):
            qd, kd, vd = (t[a:b].transpose(0, 1) for t in (q, k.repeat_interleave(groups, 1),
                                                          v.repeat_interleave(groups, 1)))
            out.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=self.window_size == (-1, 0),
                                                      scale=scale).transpose(0, 1))
        return torch.cat(out).view(B, L, Hq, D)


def _model_config(layers=2):
    config = llama3_configs["debugmodel"](attn_backend="varlen")
    config.layers = config.layers[:layers]
    return config


def _build(config, seed=0):
    torch.manual_seed(seed)
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    return model


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 2048, (2, 48), generator=g)
    positions = torch.stack([torch.cat([torch.arange(n) for n in (13, 35)]),
                             torch.cat([torch.arange(n) for n in (1, 30, 17)])])
    return tokens, positions


def _run(model, tokens, masks, positions):
    logits = model(tokens, positions=positions, attention_masks=masks)
    loss = logits.float().square().mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def reference():
    config = _model_config()
    for layer in config.layers:
        layer.attention.inner_attention = SdpaPerDocument.Config(window_size=(-1, 0))
    model = _build(config)
    tokens, positions = _batch()
    masks = model.get_attention_masks(positions)
    return model.state_dict(), _run(model, tokens, masks, positions)


def _cad_model(state):
    config = use_cad(_model_config(), compute_dtype=None)
    assert all(isinstance(layer.attention.inner_attention, CadVarlenAttention.Config) for layer in config.layers)
    model = _build(config, seed=1)
    model.load_state_dict(state)
    assert isinstance(model.layers["0"].attention.inner_attention, CadVarlenAttention)
    return model, config


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_local_cad_attention_matches_sdpa(reference):
    model, _ = _cad_model(reference[0])
    tokens, positions = _batch()
    masks = model.get_attention_masks(positions)
    assert isinstance(masks, VarlenMetadata)  # TorchTitan builds its varlen metadata for CAD's layers
    _assert_same(_run(model, tokens, masks, positions), reference[1])


def test_planned_cad_attention_matches_sdpa(reference):
    model, _ = _cad_model(reference[0])
    tokens, positions = _batch()
    masks = attach_plan(model.get_attention_masks(positions), ahead=True, num_heads=16, num_kv_heads=16,
                        head_dim=16, dtype=torch.float32, device="cpu", tag=0)
    assert isinstance(masks, CadVarlenMetadata) and masks.plan is not None
    _assert_same(_run(model, tokens, masks, positions), reference[1])


def test_compiled_blocks_with_a_plan_per_micro_batch(reference):
    # As TorchTitan's apply_compile: each TransformerBlock compiled with fullgraph=True.
    model, _ = _cad_model(reference[0])
    for block in model.layers.values():
        block.compile(backend="aot_eager", fullgraph=True)
    tokens, positions = _batch()
    for _ in range(2):  # a new plan per micro-batch
        model.zero_grad(set_to_none=True)
        masks = attach_plan(model.get_attention_masks(positions))
        _assert_same(_run(model, tokens, masks, positions), reference[1])


def test_trainer_mixin_attaches_a_plan_per_micro_batch(reference):
    model, config = _cad_model(reference[0])

    class FakeTrainer:  # what TorchTitan's Trainer.post_dataloading_process returns for a varlen model
        model_config = config

        def post_dataloading_process(self, input_dict, labels):
            return input_dict["input"], labels, {"positions": input_dict["positions"],
                                                 "attention_masks": model.get_attention_masks(input_dict["positions"])}

    trainer = cad_trainer(FakeTrainer)()
    assert type(trainer).__name__ == "CadFakeTrainer"
    tokens, positions = _batch()
    plans = []
    for _ in range(2):
        inputs, labels, extra = trainer.post_dataloading_process({"input": tokens, "positions": positions}, tokens)
        masks = extra["attention_masks"]
        assert isinstance(masks, CadVarlenMetadata)
        plans.append(masks.plan)
        model.zero_grad(set_to_none=True)
        _assert_same(_run(model, inputs, masks, positions), reference[1])
    assert plans[0] is not plans[1] and [p.tag for p in plans] == [0, 1]


def test_trainer_config_builds_the_cad_trainer():
    from torchtitan.config import Configurable

    class Base(Configurable):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(Configurable.Config):
            steps: int = 1

        def __init__(self, config):
            self.config = config

    cad_class = cad_trainer(Base)
    built = cad_class.Config(steps=3).build()
    assert type(built) is cad_class and built.config.steps == 3
    assert type(Base.Config(steps=2).build()) is Base  # the base class's config is left alone

"""cad: core attention disaggregation for PyTorch.

    plan = cad.plan(cu_seqlens, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, dtype=dtype)  # once per micro-batch
    o = cad.varlen_attn(q, k, v, cu_seqlens, plan=plan)   # in every layer: THD tensors, autograd, torch.compile

A plan fixes the micro-batch's documents, mask (causal, window_size), shapes, dtype and group; with its shapes
given it is made there, never inside the first layer. `cad.varlen_attn(..., plan=None)` is plain local varlen
attention on the same backends. CAD's state lives in a `cad.Context` (settings, stacks, plans, the active
call order) over one group; `cad.init` / `cad.plan` / `cad.shutdown` act on the default one (`cad.context()`), and
`cad.Context(group, ...)` makes another (several groups in one process). `cad.hf.register()` makes "cad" a
transformers attention implementation; `cad.varlen.varlen_attn` takes torch.nn.attention.varlen.varlen_attn's
arguments (plus `plan`). See the repository's README.
"""
from ._errors import CadError
from ._ops import varlen_attn
from ._call_order import CallOrder
from ._context import Context, Lane
from ._plans import Plan
from ._api import (attention_calls, attention_time, call_times, context, exchange_times, init, plan, plan_pieces,
                   shutdown, stack_config, timing)
from .packing import RankLayout, pack_documents
from .overlap import OverlapChoice
from .ping_pong import PingPongChoice, PingPongLayer, ping_pong, ping_pong_layers
from . import mesh  # noqa: E402,F401 -- cad.mesh: CAD's group and heads in a dp/cp/tp/pp layout
from . import varlen  # noqa: E402 -- cad.varlen.varlen_attn: torch.nn.attention.varlen's signature
from . import _plan, _runtime  # noqa: F401 -- older names (cad._plan.makes_so_far, cad._runtime.existing)

__all__ = ["CadError", "CallOrder", "Context", "Lane", "OverlapChoice", "PingPongChoice", "PingPongLayer", "Plan", "RankLayout",
           "attention_calls", "attention_time", "call_times", "context", "exchange_times", "init", "pack_documents",
           "ping_pong", "ping_pong_layers", "plan", "plan_pieces", "shutdown", "stack_config", "timing", "varlen",
           "varlen_attn"]
__version__ = "0.1.0"

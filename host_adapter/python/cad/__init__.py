"""cad: core attention disaggregation for PyTorch.

    plan = cad.plan(cu_seqlens)                          # once per micro-batch, on every rank
    o = cad.varlen_attn(q, k, v, cu_seqlens, plan=plan)  # in every layer: THD tensors, autograd, torch.compile

`cad.varlen_attn(..., plan=None)` is plain local varlen attention on the same backends. `cad.init(...)` picks
the balancer, communicator and other knobs; `cad.hf.register()` makes "cad" a transformers attention
implementation; `cad.varlen.varlen_attn` takes torch.nn.attention.varlen.varlen_attn's arguments (plus
`plan`). See the repository's README.
"""
from . import _runtime
from ._errors import CadError
from ._ops import varlen_attn
from ._call_order import CallOrder
from ._plan import Plan, plan, plan_pieces
from .packing import RankLayout, pack_documents
from ._runtime import attention_calls, attention_time, call_times, exchange_times, init, shutdown, stack_config, timing
from .ping_pong import PingPongChoice, PingPongLayer, ping_pong, ping_pong_layers
from . import varlen  # noqa: E402 -- cad.varlen.varlen_attn: torch.nn.attention.varlen's signature

__all__ = ["CadError", "CallOrder", "PingPongChoice", "PingPongLayer", "Plan", "RankLayout", "attention_calls", "attention_time",
           "call_times", "exchange_times", "init", "pack_documents", "ping_pong", "ping_pong_layers", "plan", "plan_pieces", "shutdown",
           "stack_config", "timing", "varlen", "varlen_attn"]
__version__ = "0.1.0"

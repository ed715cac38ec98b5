"""cad.fa4: FlashAttention-4 (the `flash-attn-4` package, module `flash_attn.cute`) as a local attention kernel.

    ok, reason = cad.fa4.available()                                         # installed, and an SM90+ GPU?
    o = cad.fa4.varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True)    # as cad.varlen_attn, local
    o, lse = cad.fa4.segments_attn(q, k, v, segments)                        # a server batch (segment table)

The arguments mean what they mean for `cad.varlen_attn` (no plan): THD tensors q [T, Hq, D], k and v
[T, Hkv, D] (GQA: Hq % Hkv == 0, K/V never expanded), cu_seqlens int32 [num_docs + 1], window_size (left,
right) with -1 = no limit, softmax_scale None = 1/sqrt(D). Autograd is FA4's own. FA4 runs bf16/fp16 on CUDA;
here it is offered on SM90 or newer (Hopper, Blackwell), where it is one of the fastest kernels a user can
install.

`segments_attn` runs a CAD server batch: segments (q_offset, q_len, kv_offset, kv_len) over packed Q rows and
K/V rows, causal masks aligned bottom-right, segments that may share K/V rows (a document's KV prefix, seen by
several of its query shards). FA4's varlen call takes one K/V range per sequence, packed in sequence order, so
K/V rows are gathered into that order when the segments do not already lie that way: the gathered copy costs
sum(kv_len) x Hkv x D x 2 tensors (K, V) x the element size, and as much again for their gradients in the
backward, where the gather's own backward sums dK/dV of shared rows back onto the original rows. Rows of Q
that no segment covers get O = 0 and LSE = -inf (the reference backend's convention).

FA4's API moved between its 4.0.0 beta releases; this module calls `flash_attn.cute.flash_attn_varlen_func`
with keywords only and takes what it returns as out or (out, lse). An installed version whose function lacks
one of those keywords, or returns anything else, is refused with its version named (see `available`).
Everything refused raises cad.CadError naming the argument and what was expected.
"""
import importlib
import importlib.metadata
import inspect
import math
import operator

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._checks import integer
from ._documents import fingerprint
from ._errors import CadError

__all__ = ["available", "backward_available", "segments_attn", "segments_attn_backward", "varlen_attn", "version"]

# The keywords of flash_attn_varlen_func this module passes: an installed FA4 must take every one.
REQUIRED_KEYWORDS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal",
                     "window_size", "return_lse")
MIN_CAPABILITY = (9, 0)
_DTYPES = (torch.bfloat16, torch.float16)

# The keywords of FA4's backward function (flash_attn.cute.interface._flash_attn_bwd, private in 4.0.0b36) that
# segments_attn_backward passes; the window's only for a windowed call, max_seqlen_* where the function has them.
BACKWARD_KEYWORDS = ("q", "k", "v", "out", "dout", "lse", "softmax_scale", "causal", "cu_seqlens_q", "cu_seqlens_k")
BACKWARD_WINDOW_KEYWORDS = ("window_size_left", "window_size_right")

# (function, None) once flash_attn.cute loaded and its function has the keywords above, else (None, reason).
_loaded = []
_loaded_backward = []  # ((function, its parameter names), None) or (None, reason)


def version():
    """The installed flash-attn-4 distribution's version, or None."""
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None


def _load():
    """(flash_attn_varlen_func, None) or (None, why it cannot be used); imported once per process."""
    if _loaded:
        return _loaded[0]
    try:
        module = importlib.import_module("flash_attn.cute")
    except Exception as e:  # noqa: BLE001 -- any failure to import is a reason, reported as it is
        result = (None, f"flash_attn.cute is not importable ({type(e).__name__}: {e}); FlashAttention-4 installs "
                        f"with `pip install flash-attn-4`")
    else:
        result = _check_function(getattr(module, "flash_attn_varlen_func", None))
    _loaded.append(result)
    return result


def _check_function(fn):
    """(fn, None) when fn takes every keyword this module passes, else (None, reason naming the version)."""
    installed = f"flash-attn-4 {version() or '(version unknown)'}"
    if fn is None:
        return None, f"{installed}: flash_attn.cute has no flash_attn_varlen_func"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None, f"{installed}: the signature of flash_attn.cute.flash_attn_varlen_func cannot be read"
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        missing = [name for name in REQUIRED_KEYWORDS if name not in params]
        if missing:
            return None, (f"{installed}: flash_attn.cute.flash_attn_varlen_func takes no {', '.join(missing)} "
                          f"(cad.fa4 supports the 4.0.0b releases whose function takes "
                          f"{', '.join(REQUIRED_KEYWORDS)})")
    return fn, None


def _load_backward():
    """((_flash_attn_bwd, its keyword names), None) or (None, why it cannot be used); checked once per process."""
    if _loaded_backward:
        return _loaded_backward[0]
    installed = f"flash-attn-4 {version() or '(version unknown)'}"
    try:
        fn = getattr(importlib.import_module("flash_attn.cute.interface"), "_flash_attn_bwd", None)
    except Exception as e:  # noqa: BLE001 -- any failure to import is a reason, reported as it is
        fn, why = None, f"flash_attn.cute.interface is not importable ({type(e).__name__}: {e})"
    else:
        why = f"{installed}: flash_attn.cute.interface has no _flash_attn_bwd"
    result = (None, why)
    if fn is not None:
        try:
            names = set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = None
        missing = [n for n in BACKWARD_KEYWORDS if names is None or n not in names]
        if missing:
            result = (None, f"{installed}: flash_attn.cute.interface._flash_attn_bwd takes no {', '.join(missing)} "
                            f"(cad.fa4's server backward supports the 4.0.0b releases whose function takes "
                            f"{', '.join(BACKWARD_KEYWORDS)})")
        else:
            result = ((fn, names), None)
    _loaded_backward.append(result)
    return result


def backward_available(device=None):
    """(True, what runs) where segments_attn_backward can run on `device`: available() and FA4's backward function
    with the keywords it passes; else (False, why)."""
    ok, why = available(device)
    if not ok:
        return ok, why
    loaded, why_not = _load_backward()
    return (True, f"{why}, backward through its _flash_attn_bwd") if loaded else (False, why_not)


def _device_reason(device):
    """Why FA4 is not offered on `device` (None: it is)."""
    if device.type != "cuda":
        return f"the device is {device}, not a CUDA GPU (FlashAttention-4 runs on CUDA)"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(device)} is SM{major}{minor}; cad.fa4 needs SM"
                f"{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]} or newer (Hopper, Blackwell)")
    return None


def available(device=None):
    """(True, what runs) where FlashAttention-4 can run on `device` (default: the current CUDA device), else
    (False, a sentence saying why: no CUDA GPU, a GPU older than SM90, flash_attn.cute not importable, or an
    installed version whose API this module does not know)."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    reasons = []
    why = _device_reason(dev)
    if why:
        reasons.append(why)
    _, why = _load()
    if why:
        reasons.append(why)
    if reasons:
        return False, "; ".join(reasons)
    return True, f"flash-attn-4 {version() or '(version unknown)'} on {torch.cuda.get_device_name(dev)}"


def _require(device, what):
    """The FA4 function for a call on `device`; CadError (UNAVAILABLE) with the reason otherwise."""
    why = _device_reason(device)
    fn, load_why = _load()
    why = "; ".join(r for r in (why, load_why) if r)
    if why:
        raise CadError(f"{what}: FlashAttention-4 cannot run: {why}", "UNAVAILABLE")
    return fn


def _outputs(result, what):
    """(out, lse or None) from what flash_attn_varlen_func returned: out, or (out, lse)."""
    if isinstance(result, torch.Tensor):
        return result, None
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor):
        return result[0], result[1]
    shape = f"a {type(result).__name__} of {len(result)}" if isinstance(result, (tuple, list)) else \
        type(result).__name__
    raise CadError(f"{what}: flash-attn-4 {version() or '(version unknown)'}'s flash_attn_varlen_func returned "
                   f"{shape}; cad.fa4 takes out or (out, lse)", "UNIMPLEMENTED")


# ---- argument checks (cad.varlen_attn's meaning) --------------------------------------------------------------
def _check_tensors(q, k, v, what, same_tokens):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise CadError(f"{what}: {name} must be a [T, H, D] tensor (THD), got {shape}", "INVALID_ARGUMENT")
    if k.shape != v.shape:
        raise CadError(f"{what}: k {list(k.shape)} and v {list(v.shape)} must have one shape", "INVALID_ARGUMENT")
    if same_tokens and k.shape[0] != q.shape[0]:
        raise CadError(f"{what}: q has {q.shape[0]} tokens, k and v {k.shape[0]} (self-attention over one packed "
                       f"batch: the same T)", "INVALID_ARGUMENT")
    if k.shape[2] != q.shape[2]:
        raise CadError(f"{what}: head dims differ: q {q.shape[2]}, k/v {k.shape[2]}", "INVALID_ARGUMENT")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise CadError(f"{what}: q's {q.shape[1]} heads must be a multiple of k/v's {k.shape[1]} (GQA)",
                       "INVALID_ARGUMENT")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise CadError(f"{what}: {name} is {t.dtype}; FlashAttention-4 takes bfloat16 or float16",
                           "INVALID_ARGUMENT")
        if t.dtype != q.dtype:
            raise CadError(f"{what}: {name} is {t.dtype}, q {q.dtype}: one dtype", "INVALID_ARGUMENT")
        if t.device != q.device:
            raise CadError(f"{what}: {name} is on {t.device}, q on {q.device}: the tensors must be on one device",
                           "INVALID_ARGUMENT")


def _window(window_size, causal, what):
    """(left, right) for FA4: None = no limit; causal windows have right 0. cad.varlen_attn's checks."""
    try:
        left, right = (operator.index(x) for x in window_size)
    except (TypeError, ValueError):
        raise CadError(f"{what}: window_size must be a pair (left, right) of ints, got {window_size!r}",
                       "INVALID_ARGUMENT") from None
    for name, value in (("window_size[0] (left)", left), ("window_size[1] (right)", right)):
        if value < -1:
            raise CadError(f"{what}: {name} must be -1 (no limit) or >= 0, got {value}", "INVALID_ARGUMENT")
        integer(value, name, what, -1)  # and within int64, as every window the package takes
    if causal and right > 0:
        raise CadError(f"{what}: window_size[1] (right) is {right}, but causal=True sees no key after the query: "
                       f"use -1 or 0, or causal=False", "INVALID_ARGUMENT")
    return (None if left < 0 else left), (0 if causal else (None if right < 0 else right))


def _scale(softmax_scale, head_dim, what):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        raise CadError(f"{what}: softmax_scale must be a number or None, got {type(softmax_scale).__name__}",
                       "INVALID_ARGUMENT") from None
    if not (scale > 0 and math.isfinite(scale)):
        raise CadError(f"{what}: softmax_scale must be finite and > 0, got {softmax_scale}", "INVALID_ARGUMENT")
    return scale


# cu_seqlens tensor -> ((its version, its values where readable), tokens, longest document, its copy on the device of the call): every layer of
# a step passes the same tensor, read back and checked once.
_documents = WeakIdKeyDictionary()


def _cu_seqlens(cu_seqlens, tokens, device, what):
    """(cu_seqlens on `device`, longest document), checked: 1-D int32, starts at 0, never decreases, ends at T."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32:
        got = f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}" if isinstance(cu_seqlens, torch.Tensor) else \
            type(cu_seqlens).__name__
        raise CadError(f"{what}: cu_seqlens must be a 1-D int32 tensor [num_docs + 1], got {got}", "INVALID_ARGUMENT")
    if cu_seqlens.device != device and cu_seqlens.device.type != "cpu":
        raise CadError(f"{what}: cu_seqlens is on {cu_seqlens.device}, q on {device} (cu_seqlens may also be on the "
                       f"CPU)", "INVALID_ARGUMENT")
    # The version counter alone misses a refill through .data or .numpy(): host tensors are also compared by their
    # values (the package's one rule, _documents.fingerprint; a device tensor's would need a synchronisation).
    values = fingerprint(cu_seqlens)
    cached = _documents.get(cu_seqlens)
    if (cached is not None and cached[0] == (cu_seqlens._version, values) and cached[1] == tokens and
            cached[3].device == device):
        return cached[3], cached[2]
    offsets = cu_seqlens.tolist()
    if not offsets or offsets[0] != 0 or offsets[-1] != tokens:
        raise CadError(f"{what}: cu_seqlens must start at 0 and end at the {tokens} tokens of q, got "
                       f"{_shown(offsets)}", "INVALID_ARGUMENT")
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    bad = next((i for i, n in enumerate(lengths) if n < 0), None)
    if bad is not None:
        raise CadError(f"{what}: cu_seqlens decreases at document {bad} ({offsets[bad]} -> {offsets[bad + 1]})",
                       "INVALID_ARGUMENT")
    on_device = cu_seqlens.to(device, non_blocking=False)
    longest = max(lengths, default=0)
    _documents[cu_seqlens] = ((cu_seqlens._version, values), tokens, longest, on_device)
    return on_device, longest


def _shown(values, most=8):
    return str(values) if len(values) <= most else f"[{', '.join(map(str, values[:most]))}, ... ({len(values)})]"


def _max_seqlen(max_seqlen, longest, what):
    if max_seqlen is None:
        return longest
    try:
        value = operator.index(max_seqlen)
    except TypeError:
        raise CadError(f"{what}: max_seqlen must be an int (the longest document's length) or None, got "
                       f"{type(max_seqlen).__name__}", "INVALID_ARGUMENT") from None
    if value < longest:
        # FA4 sizes its grid by it: a smaller value would leave query rows uncomputed.
        raise CadError(f"{what}: max_seqlen={value} is below the longest document ({longest} tokens)",
                       "INVALID_ARGUMENT")
    return value


def _call(fn, q, k, v, cu_q, cu_k, max_q, max_k, causal, window, scale, want_lse, what):
    result = fn(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                softmax_scale=scale, causal=causal, window_size=window, return_lse=want_lse)
    o, lse = _outputs(result, what)
    if o.shape != q.shape:
        raise CadError(f"{what}: flash_attn_varlen_func returned out {list(o.shape)} for q {list(q.shape)}",
                       "INTERNAL")
    if want_lse and (lse is None or tuple(lse.shape) != (q.shape[1], q.shape[0])):
        got = "none" if lse is None else list(lse.shape)
        raise CadError(f"{what}: flash_attn_varlen_func returned lse {got}, expected [Hq, T] = "
                       f"{[q.shape[1], q.shape[0]]}", "UNIMPLEMENTED")
    return o, lse


def varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True, window_size=(-1, -1), softmax_scale=None):
    """Local varlen attention through FlashAttention-4: cad.varlen_attn's arguments (no plan), differentiable.

    q [T, Hq, D], k and v [T, Hkv, D], bf16 or fp16 on an SM90+ GPU; cu_seqlens int32 [num_docs + 1] (on the GPU,
    or on the CPU: copied once per tensor); max_seqlen the longest document (None: read from cu_seqlens; never
    below it). window_size (left, right), -1 = no limit; causal windows are (left, 0) or (left, -1). Returns
    O [T, Hq, D]. Raises CadError (UNAVAILABLE where `available()` says no, INVALID_ARGUMENT naming a bad argument).
    """
    what = "cad.fa4.varlen_attn"
    _check_tensors(q, k, v, what, same_tokens=True)
    window = _window(window_size, bool(causal), what)
    scale = _scale(softmax_scale, q.shape[2], what)
    cu, longest = _cu_seqlens(cu_seqlens, q.shape[0], q.device, what)
    longest = _max_seqlen(max_seqlen, longest, what)
    fn = _require(q.device, what)
    if q.shape[0] == 0:
        return _empty_output(q, k, v)
    o, _ = _call(fn, q, k, v, cu, cu, longest, longest, bool(causal), window, scale, False, what)
    return o


def _empty_output(q, k, v):
    """O of a batch with no token: zeros that stay in the graph (zero gradients for q, k, v)."""
    return torch.zeros_like(q) + 0 * (q.sum() + k.sum() + v.sum())


# ---- server batches: a segment table ----------------------------------------------------------------------------
def _segment_rows(segments, tq, tk, causal, what):
    """The segment table as a list of 4-int tuples, checked against the batch: Q ranges inside [0, tq) and
    disjoint, K/V ranges inside [0, tk), q_len <= kv_len when causal."""
    if isinstance(segments, torch.Tensor):
        if segments.device.type != "cpu":
            raise CadError(f"{what}: segments is on {segments.device}; pass the table on the CPU (it is read on the "
                           f"host to build FA4's sequence offsets)", "INVALID_ARGUMENT")
        if segments.dim() != 2 or segments.shape[1] != 4 or segments.is_floating_point():
            raise CadError(f"{what}: segments must be an integer [n, 4] table (q_offset, q_len, kv_offset, kv_len), "
                           f"got {segments.dtype} {list(segments.shape)}", "INVALID_ARGUMENT")
        segments = segments.tolist()
    rows = []
    for i, seg in enumerate(segments):
        try:
            row = tuple(operator.index(x) for x in seg)
        except TypeError:
            row = ()
        if len(row) != 4:
            raise CadError(f"{what}: segments[{i}] must be 4 ints (q_offset, q_len, kv_offset, kv_len), got {seg!r}",
                           "INVALID_ARGUMENT")
        q_off, q_len, kv_off, kv_len = row
        if min(row) < 0 or q_off + q_len > tq or kv_off + kv_len > tk:
            raise CadError(f"{what}: segments[{i}] = {row} lies outside the batch ({tq} query rows, {tk} key/value "
                           f"rows) or has a negative entry", "INVALID_ARGUMENT")
        if causal and q_len > kv_len:
            raise CadError(f"{what}: segments[{i}] = {row} has q_len > kv_len, which a causal mask aligned "
                           f"bottom-right does not allow", "INVALID_ARGUMENT")
        rows.append(row)
    by_q = sorted((r for r in rows if r[1] > 0), key=lambda r: r[0])
    for a, b in zip(by_q, by_q[1:]):
        if a[0] + a[1] > b[0]:
            raise CadError(f"{what}: segments {a} and {b} overlap in Q (a query row belongs to one segment)",
                           "INVALID_ARGUMENT")
    return rows


def _rows_index(ranges, device):
    """int64 index of the rows of `ranges` [(offset, length)], in order, on `device`."""
    parts = [torch.arange(off, off + n, dtype=torch.int64) for off, n in ranges]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.int64, device=device)


def _packed_in_order(ranges, total):
    """Whether the ranges, in order, tile [0, total) with no gap and no overlap."""
    at = 0
    for off, n in ranges:
        if off != at:
            return False
        at += n
    return at == total


def segments_attn(q, k, v, segments, causal=True, window_size=(-1, -1), softmax_scale=None):
    """One CAD server batch through FlashAttention-4: (O [Tq, Hq, D], LSE [Hq, Tq] fp32, natural log).

    q [Tq, Hq, D]; k, v [Tk, Hkv, D]; segments an integer table [n, 4] (a CPU tensor or a sequence of rows):
    (q_offset, q_len, kv_offset, kv_len), Q ranges disjoint, K/V ranges free to overlap (shared prefixes). Causal
    masks are aligned bottom-right (query i of a segment sees keys j <= i + kv_len - q_len), as CAD's ABI and
    FA4 both define them; window_size counts from the same diagonal. Differentiable in q, k, v (LSE is not):
    dK/dV of K/V rows that several segments read are summed. Rows no segment covers: O = 0, LSE = -inf.
    Memory: see the module doc (the K/V gather when the segments do not already lie in FA4's packed order).
    """
    what = "cad.fa4.segments_attn"
    _check_tensors(q, k, v, what, same_tokens=False)
    causal = bool(causal)
    window = _window(window_size, causal, what)
    scale = _scale(softmax_scale, q.shape[2], what)
    rows = [r for r in _segment_rows(segments, q.shape[0], k.shape[0], causal, what) if r[1] > 0 and r[3] > 0]
    fn = _require(q.device, what)
    tq, hq = q.shape[0], q.shape[1]
    if not rows:
        o = _empty_output(q, k, v)
        return o, torch.full((hq, tq), -math.inf, dtype=torch.float32, device=q.device)
    lay = _Layout(rows, tq, k.shape[0], q.device)
    qp, kp, vp = lay.gather_q(q), lay.gather_kv(k), lay.gather_kv(v)
    o, lse = _call(fn, qp.contiguous(), kp.contiguous(), vp.contiguous(), lay.cu_q, lay.cu_k, lay.max_q, lay.max_k,
                   causal, window, scale, True, what)
    lse = lse.detach().float()
    if lay.q_index is None:
        return o, lse
    full_o = torch.zeros_like(q).index_copy(0, lay.q_index, o)  # uncovered rows stay 0; differentiable in o
    full_lse = torch.full((hq, tq), -math.inf, dtype=torch.float32, device=q.device).index_copy_(1, lay.q_index, lse)
    return full_o, full_lse


class _Layout:
    """A server batch in FA4's packed sequence order: the segments (non-empty, sorted by q_offset), FA4's offsets,
    and the gather indices of Q rows (None when they already tile Q in order) and K/V rows (None likewise).
    Gathering K/V costs sum(kv_len) rows of each; index_select's backward sums dK/dV of shared rows back."""

    def __init__(self, rows, tq, tk, device):
        rows = sorted(rows, key=lambda r: r[0])
        q_ranges, kv_ranges = [(r[0], r[1]) for r in rows], [(r[2], r[3]) for r in rows]
        self.q_index = None if _packed_in_order(q_ranges, tq) else _rows_index(q_ranges, device)
        self.kv_index = None if _packed_in_order(kv_ranges, tk) else _rows_index(kv_ranges, device)
        self.cu_q = _offsets([r[1] for r in rows], device)
        self.cu_k = _offsets([r[3] for r in rows], device)
        self.max_q, self.max_k = max(r[1] for r in rows), max(r[3] for r in rows)

    def gather_q(self, t, dim=0):
        return t if self.q_index is None else t.index_select(dim, self.q_index)

    def gather_kv(self, t):
        return t if self.kv_index is None else t.index_select(0, self.kv_index)


def segments_attn_backward(q, k, v, o, lse, d_o, segments, causal=True, window_size=(-1, -1), softmax_scale=None):
    """The backward of segments_attn without autograd, through FA4's backward function: (dQ, dK, dV) for the batch
    whose forward gave O [Tq, Hq, D] and LSE [Hq, Tq] (fp32), given dO. K/V rows are gathered into FA4's sequence
    order as in the forward and the gradients of shared rows summed back with index_add (fp32 accumulation); rows no
    segment covers get dQ = 0, K/V rows no segment reads dK = dV = 0. Raises CadError (UNAVAILABLE where
    backward_available() says no)."""
    what = "cad.fa4.segments_attn_backward"
    _check_tensors(q, k, v, what, same_tokens=False)
    causal = bool(causal)
    left, right = _window(window_size, causal, what)
    scale = _scale(softmax_scale, q.shape[2], what)
    rows = [r for r in _segment_rows(segments, q.shape[0], k.shape[0], causal, what) if r[1] > 0 and r[3] > 0]
    _require(q.device, what)
    loaded, why = _load_backward()
    if loaded is None:
        raise CadError(f"{what}: FlashAttention-4's backward cannot run: {why}", "UNAVAILABLE")
    fn, names = loaded
    d_q = torch.zeros_like(q)
    if not rows:
        return d_q, torch.zeros_like(k), torch.zeros_like(v)
    lay = _Layout(rows, q.shape[0], k.shape[0], q.device)
    kwargs = dict(q=lay.gather_q(q).contiguous(), k=lay.gather_kv(k).contiguous(), v=lay.gather_kv(v).contiguous(),
                  out=lay.gather_q(o).contiguous(), dout=lay.gather_q(d_o).contiguous(),
                  lse=lay.gather_q(lse, dim=1).contiguous(), softmax_scale=scale, causal=causal,
                  cu_seqlens_q=lay.cu_q, cu_seqlens_k=lay.cu_k)
    if left is not None or (right is not None and not causal):
        missing = [n for n in BACKWARD_WINDOW_KEYWORDS if n not in names]
        if missing:
            raise CadError(f"{what}: flash-attn-4 {version() or '(version unknown)'}'s _flash_attn_bwd takes no "
                           f"{', '.join(missing)}, so it cannot run a sliding window", "UNAVAILABLE")
        kwargs.update(window_size_left=left, window_size_right=right)
    for name, value in (("max_seqlen_q", lay.max_q), ("max_seqlen_k", lay.max_k)):
        if name in names:
            kwargs[name] = value
    result = fn(**kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) >= 3 and
            all(isinstance(t, torch.Tensor) for t in result[:3])):
        raise CadError(f"{what}: flash-attn-4 {version() or '(version unknown)'}'s _flash_attn_bwd returned "
                       f"{type(result).__name__}; cad.fa4 takes (dq, dk, dv, ...)", "UNIMPLEMENTED")
    dq_p, dk_p, dv_p = result[:3]
    if dq_p.shape != kwargs["q"].shape or dk_p.shape != kwargs["k"].shape or dv_p.shape != kwargs["v"].shape:
        raise CadError(f"{what}: _flash_attn_bwd returned dq {list(dq_p.shape)}, dk {list(dk_p.shape)}, dv "
                       f"{list(dv_p.shape)} for q {list(kwargs['q'].shape)}, k/v {list(kwargs['k'].shape)}", "INTERNAL")
    if lay.q_index is None:
        d_q = dq_p.to(q.dtype)
    else:
        d_q.index_copy_(0, lay.q_index, dq_p.to(q.dtype))
    if lay.kv_index is None:
        return d_q, dk_p.to(k.dtype), dv_p.to(v.dtype)
    acc = torch.promote_types(k.dtype, torch.float32)  # shared rows summed in fp32 at least
    d_k = torch.zeros(k.shape, dtype=acc, device=k.device).index_add_(0, lay.kv_index, dk_p.to(acc))
    d_v = torch.zeros(v.shape, dtype=acc, device=v.device).index_add_(0, lay.kv_index, dv_p.to(acc))
    return d_q, d_k.to(k.dtype), d_v.to(v.dtype)


def _offsets(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32).to(device)

"""CAD's server batches through Python implementations: the `callback_attention` plugin calls back into this process.

    cad.Context(server_backend="fa4")    # CAD's servers run their batches through cad.fa4 (FlashAttention-4)
    cad.Context(server_backend="torch")  # ... through plain torch (fp32 math; CPU or CUDA): the testable path
    cad.Context()                        # server_backend="default": the project's kernel (cuda) / reference (CPU)
    cad.Context(server_backend={"forward": "default", "backward": "fa4"})  # one backend per direction
    cad.Context(server_backend="default+fa4")                             # the same, as FORWARD+BACKWARD

A choice per direction: a dict with exactly the keys "forward" and "backward", or the string "FORWARD+BACKWARD"
(what the trainer's --server-backend takes), each a name of BACKENDS; one name means both directions. The
backward takes the forward's O and LSE whoever computed them: both cross as the ABI defines them (O [Tq, Hq, D] in
the batch's dtype, LSE [Hq, Tq] fp32 natural log, -inf on rows no segment covers); cad.fa4 hands FA4 exactly that
LSE, which is FA4's own convention too (natural log, [Hq, total_q]), gathered into its row order like O.

How: `instance_config(name, device)` registers the implementation's forward and backward with the plugin
(plugins/callback_attention/cad_callback_attention_v1.h) under a key such as "torch_cpu", once per process, and
returns the stack config's "server" instance naming the plugin by its path and the key (`instances` for a choice
per direction: where one direction is "default", the project's instance is listed as "server_inner" and the
callback instance hands that direction to it, its config {"key": ..., "inner": "server_inner", "inner_runs":
"forward" or "backward"}; so CAD sees one server backend, makes one plan of each batch, checked against what both
directions accept; two Python backends register one key with one's forward and the other's backward). The plugin
validates each call as every backend does; the callbacks here rebuild the call's tensors zero-copy from its
descriptors (DLPack capsules: CPU and CUDA memory, bf16 included), run on the call's stream
(torch.cuda.ExternalStream), write the outputs in place and return a status: every exception is caught and
returned with its message (nothing crosses the C boundary).

Lifetime: the registrations, the ctypes functions they point to and the plugin object (opened once through the
host's loader, so the host's stack loads the same object) live until the process ends; the plugin's release
callback is never needed and not set.

Choice: `available(name, device[, direction])` says where a backend may be chosen: "fa4" needs
cad.fa4.backward_available (FA4 installed, an SM90+ GPU, its forward and backward functions of a known API; for the
forward alone cad.fa4.available) and bf16 on CUDA; "torch" runs anywhere. The default stays the project's kernel: on one H200 FA4's kernels are faster than ours
(docs/kernels_fa4.md), but the gather of shared K/V prefixes costs time and memory on real server batches, which
bench/cad measures (tests/gpu_python/server_backend_fa4.py).
"""
import ctypes as C
import math
import threading

import torch

from . import _abi, fa4
from ._errors import CadError
from ._lib import lib

__all__ = ["BACKENDS", "DIRECTIONS", "available", "directions", "instance_config", "instances", "name_of",
           "segment_attention", "segment_attention_backward"]

BACKENDS = ("default", "torch", "fa4")
DIRECTIONS = ("forward", "backward")

_CAUSAL, _NONCAUSAL, _GQA, _SHARED_KV, _BACKWARD, _WINDOW = (1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 6)
_FP32, _BF16 = 1 << 0, 1 << 1
_STATUS = {name: code for code, name in _abi.STATUS_NAMES.items()}
_STATUS.update({"UNAVAILABLE": 2, "UNIMPLEMENTED": 2})  # cad.fa4's refusals: UNSUPPORTED through the ABI


# ---- the registration table (cad_callback_attention_v1_t) --------------------------------------------------
ForwardFn = C.CFUNCTYPE(_abi.c_status, C.c_void_p, C.POINTER(_abi.ForwardArgs), C.c_void_p, C.c_size_t)
BackwardFn = C.CFUNCTYPE(_abi.c_status, C.c_void_p, C.POINTER(_abi.BackwardArgs), C.c_void_p, C.c_size_t)
ReleaseFn = C.CFUNCTYPE(None, C.c_void_p)


class CallbackTable(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("version", C.c_uint32), ("reserved", C.c_uint32),
                ("capabilities", _abi.Capabilities), ("user_data", C.c_void_p), ("forward", ForwardFn),
                ("backward", BackwardFn), ("release", ReleaseFn)]


if C.sizeof(CallbackTable) != 80:
    raise ImportError(f"cad.server_backend: CallbackTable is {C.sizeof(CallbackTable)} bytes, the plugin's header 80")


# ---- tensors from descriptors, zero-copy -------------------------------------------------------------------
class _DLManaged(C.Structure):  # DLManagedTensor: a DLTensor (== cad_tensor_v1_t), manager_ctx, deleter
    pass


_Deleter = C.CFUNCTYPE(None, C.POINTER(_DLManaged))
_DLManaged._fields_ = [("dl_tensor", _abi.Tensor), ("manager_ctx", C.c_void_p), ("deleter", _Deleter)]

_capsule_new = C.pythonapi.PyCapsule_New
_capsule_new.restype = C.py_object
_capsule_new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_DTYPES = {(_abi.DTYPE_CODE_FLOAT, 32): torch.float32, (_abi.DTYPE_CODE_BFLOAT, 16): torch.bfloat16,
           (_abi.DTYPE_CODE_FLOAT, 16): torch.float16}
_alive = {}  # address of a _DLManaged -> (it, its shape and strides): kept until torch's deleter runs
_alive_lock = threading.Lock()


@_Deleter
def _delete(managed):
    with _alive_lock:
        _alive.pop(C.addressof(managed.contents), None)


def tensor_of(desc_ptr):
    """A torch tensor over a cad_tensor_v1_t's memory (no copy). The plugin checked it: compact, a dtype of
    _DTYPES, on the CPU or a CUDA device."""
    d = desc_ptr.contents
    shape = [d.shape[i] for i in range(d.ndim)]
    device = torch.device("cpu") if d.device.device_type == _abi.DEVICE_CPU else \
        torch.device("cuda", d.device.device_id)
    dtype = _DTYPES[(d.dtype.code, d.dtype.bits)]
    if math.prod(shape) == 0 or not d.data:
        return torch.empty(shape, dtype=dtype, device=device)
    strides, step = [0] * d.ndim, 1
    for i in reversed(range(d.ndim)):
        strides[i], step = step, step * shape[i]
    shape_arr, strides_arr = (C.c_int64 * d.ndim)(*shape), (C.c_int64 * d.ndim)(*strides)
    managed = _DLManaged()
    managed.dl_tensor = _abi.Tensor(C.c_void_p(d.data + d.byte_offset), d.device, d.ndim, d.dtype,
                                    shape_arr, strides_arr, 0)
    managed.deleter = _delete
    with _alive_lock:
        _alive[C.addressof(managed)] = (managed, shape_arr, strides_arr)
    return torch.utils.dlpack.from_dlpack(_capsule_new(C.addressof(managed), b"dltensor", None))


def _segments(args):
    n = args.num_segments
    return [(s.q_offset, s.q_len, s.kv_offset, s.kv_len) for s in (args.segments[i] for i in range(n))]


def _window(args):
    """(left, right) as window_size takes it (-1 = no limit): the plugin passes the normalised window."""
    return int(args.window_left), int(args.window_right)


class _on_stream:
    """The call's stream as torch's current stream (CUDA), nothing for the CPU."""

    def __init__(self, device, stream):
        self.ctx = None
        if device.type == "cuda":
            s = torch.cuda.ExternalStream(stream, device=device) if stream else torch.cuda.default_stream(device)
            self.ctx = torch.cuda.stream(s)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False


# ---- the torch implementation: fp32 math, any device ----------------------------------------------------------
# Explicit forward and backward formulas, no autograd: the callbacks run inside CAD's custom op, below autograd.
def _scores(q, k, v, segment, causal, window_size, scale):
    """One segment's (Q, K, V) [H, rows, D] in fp32 with K/V heads repeated (GQA), and its masked scaled scores
    [Hq, q_len, kv_len] (-inf where a query does not see a key)."""
    q_off, q_len, kv_off, kv_len = segment
    group = q.shape[1] // k.shape[1]
    qs = q[q_off:q_off + q_len].float().transpose(0, 1)
    ks = k[kv_off:kv_off + kv_len].float().transpose(0, 1).repeat_interleave(group, 0)
    vs = v[kv_off:kv_off + kv_len].float().transpose(0, 1).repeat_interleave(group, 0)
    left, right = window_size
    pos = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)  # each query's key position
    j = torch.arange(kv_len, device=q.device)[None, :]
    seen = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
    if causal:
        seen &= j <= pos
    if left >= 0:
        seen &= j >= pos - left
    if right >= 0 and not causal:
        seen &= j <= pos + right
    return qs, ks, vs, (torch.matmul(qs, ks.transpose(1, 2)) * scale).masked_fill(~seen, -math.inf)


def _probabilities(scores, lse):
    """exp(scores - lse), 0 for rows that see no key (lse = -inf)."""
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(scores - finite[..., None])


def segment_attention(q, k, v, segments, causal, window_size, scale):
    """(O [Tq, Hq, D] fp32, LSE [Hq, Tq] fp32) of a segment batch by plain torch: the ABI's meaning (bottom-right
    causal mask, window around the diagonal, GQA, segments free to share K/V, uncovered rows O = 0, LSE = -inf)."""
    tq, hq, d = q.shape
    o = torch.zeros(tq, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((hq, tq), -math.inf, dtype=torch.float32, device=q.device)
    for seg in segments:
        q_off, q_len = seg[0], seg[1]
        if q_len == 0:
            continue
        _, _, vs, scores = _scores(q, k, v, seg, causal, window_size, scale)
        seg_lse = torch.logsumexp(scores, dim=-1)  # [Hq, q_len]
        o[q_off:q_off + q_len] = torch.matmul(_probabilities(scores, seg_lse), vs).transpose(0, 1)
        lse[:, q_off:q_off + q_len] = seg_lse
    return o, lse


def segment_attention_backward(q, k, v, o, lse, d_o, segments, causal, window_size, scale):
    """(dQ, dK, dV) in fp32 of segment_attention given its O, LSE and dO: P recomputed from the scores and LSE,
    dS = P * (dO V^T - rowsum(dO * O)); dK/dV summed over the query heads of a K/V head and over segments that share
    K/V rows; zero where nothing reads a row."""
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    d_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    d_k = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    d_v = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for seg in segments:
        q_off, q_len, kv_off, kv_len = seg
        if q_len == 0 or kv_len == 0:
            continue
        qs, ks, vs, scores = _scores(q, k, v, seg, causal, window_size, scale)
        p = _probabilities(scores, lse[:, q_off:q_off + q_len].float())
        dos = d_o[q_off:q_off + q_len].float().transpose(0, 1)              # [Hq, q_len, D]
        os_ = o[q_off:q_off + q_len].float().transpose(0, 1)
        dp = torch.matmul(dos, vs.transpose(1, 2))
        ds = p * (dp - (dos * os_).sum(-1, keepdim=True)) * scale
        d_q[q_off:q_off + q_len] += torch.matmul(ds, ks).transpose(0, 1)
        dk = torch.matmul(ds.transpose(1, 2), qs).view(hkv, group, kv_len, -1).sum(1)
        dv = torch.matmul(p.transpose(1, 2), dos).view(hkv, group, kv_len, -1).sum(1)
        d_k[kv_off:kv_off + kv_len] += dk.transpose(0, 1)
        d_v[kv_off:kv_off + kv_len] += dv.transpose(0, 1)
    return d_q, d_k, d_v


class _TorchBackend:
    dtype_mask = _FP32 | _BF16

    @staticmethod
    def forward(args, q, k, v, o, lse):
        out, l = segment_attention(q, k, v, _segments(args), bool(args.causal), _window(args), args.softmax_scale)
        o.copy_(out)
        lse.copy_(l)

    @staticmethod
    def backward(args, q, k, v, o, lse, d_o, d_q, d_k, d_v):
        grads = segment_attention_backward(q, k, v, o, lse, d_o, _segments(args), bool(args.causal), _window(args),
                                           args.softmax_scale)
        for dst, g in zip((d_q, d_k, d_v), grads):
            dst.copy_(g)


class _FA4Backend:
    dtype_mask = _BF16

    @staticmethod
    def forward(args, q, k, v, o, lse):
        with torch.no_grad():
            out, l = fa4.segments_attn(q, k, v, _segments(args), bool(args.causal), _window(args), args.softmax_scale)
        o.copy_(out)
        lse.copy_(l)

    @staticmethod
    def backward(args, q, k, v, o, lse, d_o, d_q, d_k, d_v):
        grads = fa4.segments_attn_backward(q, k, v, o, lse, d_o, _segments(args), bool(args.causal), _window(args),
                                           args.softmax_scale)
        for dst, g in zip((d_q, d_k, d_v), grads):
            dst.copy_(g)


_IMPLEMENTATIONS = {"torch": _TorchBackend, "fa4": _FA4Backend}


def directions(choice, what="server_backend"):
    """(forward, backward) of a server_backend choice: a name of BACKENDS (both directions), "FORWARD+BACKWARD", or
    {"forward": NAME, "backward": NAME}. Raises CadError naming what is wrong and what is expected."""
    expected = (f"a name of {', '.join(map(repr, BACKENDS))}, \"FORWARD+BACKWARD\" (e.g. \"default+fa4\") or "
                f"{{'forward': NAME, 'backward': NAME}}")
    if isinstance(choice, str):
        parts = choice.split("+")
        if len(parts) not in (1, 2):
            raise CadError(f"{what}: {choice!r} has {len(parts)} parts; expected {expected}", "INVALID_ARGUMENT")
        pair = (parts[0], parts[-1])
        named = [(f"{what} {choice!r}: the {d}" if len(parts) == 2 else f"{what}", n) for d, n in zip(DIRECTIONS, pair)]
    elif isinstance(choice, dict):
        keys = set(choice)
        if keys != set(DIRECTIONS):
            missing, unknown = sorted(set(DIRECTIONS) - keys), sorted(map(repr, keys - set(DIRECTIONS)))
            raise CadError(f"{what}: a per-direction choice takes exactly the keys 'forward' and 'backward'"
                           f"{'; missing ' + ', '.join(map(repr, missing)) if missing else ''}"
                           f"{'; unknown ' + ', '.join(unknown) if unknown else ''}", "INVALID_ARGUMENT")
        pair = (choice["forward"], choice["backward"])
        named = [(f"{what}['{d}']", n) for d, n in zip(DIRECTIONS, pair)]
    else:
        raise CadError(f"{what}: got {type(choice).__name__} {choice!r}; expected {expected}", "INVALID_ARGUMENT")
    for where, name in named:
        if name not in BACKENDS:
            raise CadError(f"{where} must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}", "INVALID_ARGUMENT")
    return pair


def name_of(forward, backward):
    """The choice (forward, backward) as one string: "fa4", or "default+fa4" where the directions differ."""
    return forward if forward == backward else f"{forward}+{backward}"


def _status_of(exc):
    if isinstance(exc, CadError):
        return _STATUS.get(getattr(exc, "status", None), 10)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or isinstance(exc, MemoryError):
        return _abi.OUT_OF_MEMORY
    if isinstance(exc, RuntimeError) and "CUDA" in str(exc):
        return _abi.DEVICE_ERROR
    return 10  # INTERNAL


calls = {}  # key -> {"forward": n, "backward": n}: the callbacks' successful calls in this process


def _guarded(name, direction, call, args, error, capacity, tensors):
    """Run one callback: every exception becomes a status and its message in the plugin's error buffer."""
    try:
        a = args.contents
        ts = [tensor_of(getattr(a, t)) for t in tensors]
        with _on_stream(ts[0].device, a.stream):
            call(a, *ts)
        counts = calls.setdefault(name, {"forward": 0, "backward": 0})
        counts[direction] += 1
        return _abi.OK
    except BaseException as exc:  # noqa: BLE001 -- nothing may cross the C boundary
        _abi.write_message(error, capacity, f"server backend '{name}': {type(exc).__name__}: {exc}")
        return _status_of(exc)


# ---- registration ----------------------------------------------------------------------------------------------
_registered = {}  # key -> (plugin path, table, ctypes functions): alive until the process ends
_plugin = []      # [(cad_library_t handle, path, ctypes.CDLL)] once opened
_lock = threading.Lock()


def _open_plugin():
    if _plugin:
        return _plugin[0]
    host = lib()
    host.cad_library_open.argtypes = [C.c_char_p, C.c_char_p, C.POINTER(C.c_void_p), C.c_char_p, C.c_size_t]
    host.cad_library_open.restype = _abi.c_status
    host.cad_library_path.argtypes = [C.c_void_p]
    host.cad_library_path.restype = C.c_char_p
    handle, error = C.c_void_p(), C.create_string_buffer(2048)
    status = host.cad_library_open(b"callback_attention", None, C.byref(handle), error, len(error))
    if status != _abi.OK:
        raise CadError(f"cad: server_backend needs the callback_attention plugin, which did not load "
                       f"({_abi.STATUS_NAMES.get(status, status)}): {error.value.decode(errors='replace')}",
                       _abi.STATUS_NAMES.get(status, "NOT_FOUND"))
    path = host.cad_library_path(handle).decode()
    # The same object again (the loader maps a file once): its registration functions.
    plugin = C.CDLL(path, mode=C.RTLD_LOCAL)
    plugin.cad_callback_attention_register_v1.argtypes = [C.c_char_p, C.POINTER(CallbackTable), C.c_char_p,
                                                          C.c_size_t]
    plugin.cad_callback_attention_register_v1.restype = _abi.c_status
    _plugin.append((handle, path, plugin))
    return _plugin[0]


def _register(name, device_type, backward_name=None):
    """Register backend `name`'s forward and `backward_name`'s backward (default: its own) under a key."""
    backward_name = backward_name or name
    key = f"{name}_{device_type}" if backward_name == name else f"{name}-{backward_name}_{device_type}"
    with _lock:
        if key in _registered:
            return _registered[key][0], key
        _, path, plugin = _open_plugin()
        impl, back = _IMPLEMENTATIONS[name], _IMPLEMENTATIONS[backward_name]
        fwd = ForwardFn(lambda user, args, error, capacity: _guarded(
            key, "forward", impl.forward, args, error, capacity, ("q", "k", "v", "o", "lse")))
        bwd = BackwardFn(lambda user, args, error, capacity: _guarded(
            key, "backward", back.backward, args, error, capacity, ("q", "k", "v", "o", "lse", "d_o", "d_q", "d_k", "d_v")))
        table = CallbackTable()
        table.struct_size = C.sizeof(table)
        table.version = 1
        caps = table.capabilities
        caps.struct_size = C.sizeof(caps)
        caps.device_type = _abi.DEVICE_CUDA if device_type == "cuda" else _abi.DEVICE_CPU
        caps.dtype_mask = impl.dtype_mask & back.dtype_mask
        caps.flags = _CAUSAL | _NONCAUSAL | _GQA | _SHARED_KV | _BACKWARD | _WINDOW
        if "fa4" in (name, backward_name):  # what cad.fa4 is checked for: D 64 and 128
            caps.head_dim_mask, caps.max_head_dim, caps.min_compute_capability = (1 << 3) | (1 << 7), 128, 90
        else:
            caps.head_dim_mask, caps.max_head_dim = 0xFFFF, 256
        table.forward, table.backward = fwd, bwd
        error = C.create_string_buffer(2048)
        status = plugin.cad_callback_attention_register_v1(key.encode(), C.byref(table), error, len(error))
        if status != _abi.OK:
            raise CadError(f"cad: registering server backend '{key}' failed: {error.value.decode(errors='replace')}",
                           _abi.STATUS_NAMES.get(status, "INTERNAL"))
        _registered[key] = (path, table, (fwd, bwd))
        return path, key


def available(name, device, direction=None):
    """(True, what runs) where server backend `name` may serve CAD on `device` (in `direction`, "forward" or
    "backward"; None: both), else (False, why)."""
    device = torch.device(device)
    if name == "default":
        return True, "the project's kernel (cuda) on CUDA, the reference backend on the CPU"
    if name == "torch":
        return True, f"plain torch (fp32 math) on {device.type}"
    if name == "fa4":
        return fa4.available(device) if direction == "forward" else fa4.backward_available(device)
    return False, f"'{name}' is not a server backend; the backends are {', '.join(BACKENDS)}"


def instance_config(name, device):
    """The stack config's "server" instance for backend `name` (not "default") on `device`: the callback plugin,
    by its path, with the key its callbacks are registered under (registered on first use)."""
    device = torch.device(device)
    ok, why = available(name, device)
    if not ok:
        raise CadError(f"cad: server_backend='{name}' cannot serve on {device}: {why}", "UNAVAILABLE")
    path, key = _register(name, "cuda" if device.type == "cuda" else "cpu")
    return {"name": "server", "plugin": path, "config": {"key": key}}


def instances(choice, device, default_instance):
    """The stack config's instances that serve CAD's batches for `choice` (see `directions`), the last one named
    "server": `default_instance` (the project's "server" instance for `device`) alone for "default"; the callback
    plugin's instance for one Python backend; for "default" in one direction, `default_instance` renamed
    "server_inner" and, after it, the callback instance that hands it that direction (its keys "inner" and
    "inner_runs"); for two Python backends one key with one's forward and the other's backward."""
    device = torch.device(device)
    forward, backward = directions(choice)
    if forward == backward:
        return [dict(default_instance)] if forward == "default" else [instance_config(forward, device)]
    for direction, name in zip(DIRECTIONS, (forward, backward)):
        ok, why = available(name, device, direction)
        if not ok:
            raise CadError(f"cad: server_backend={name_of(forward, backward)!r}: '{name}' cannot run the {direction} "
                           f"on {device}: {why}", "UNAVAILABLE")
    device_type = "cuda" if device.type == "cuda" else "cpu"
    if "default" not in (forward, backward):
        path, key = _register(forward, device_type, backward)
        return [{"name": "server", "plugin": path, "config": {"key": key}}]
    python, inner_runs = (backward, "forward") if forward == "default" else (forward, "backward")
    path, key = _register(python, device_type)
    inner = dict(default_instance, name="server_inner")
    return [inner, {"name": "server", "plugin": path,
                    "config": {"key": key, "inner": "server_inner", "inner_runs": inner_runs}}]

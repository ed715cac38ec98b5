"""ctypes mirrors of the C ABI structs the package passes (plugin_api/*.h, host_adapter/include/cad/cad_host.h).

Only what the package uses is declared. Every struct matches its C layout field by field (LP64); the sizes
are checked at import against the frozen values of plugin_api/cad_abi_v1_layout.h, so a drift fails loudly
instead of corrupting memory.
"""
import ctypes as C

c_status = C.c_int32

STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "UNSUPPORTED", 3: "OUT_OF_MEMORY", 4: "INVALID_CONFIG",
    5: "NOT_FOUND", 6: "COMMUNICATION", 7: "TIMEOUT", 8: "ABI_MISMATCH", 9: "DEVICE_ERROR", 10: "INTERNAL",
}
OK, INVALID_ARGUMENT, TIMEOUT, COMMUNICATION = 0, 1, 7, 6
OUT_OF_MEMORY, DEVICE_ERROR = 3, 9
DEVICE_CPU, DEVICE_CUDA = 1, 2
DTYPE_CODE_INT, DTYPE_CODE_FLOAT, DTYPE_CODE_BFLOAT = 0, 2, 4
KIND_ATTENTION = 1
CAP_PIECES = 1 << 5
CAP_WINDOW = 1 << 6  # ABI v1.2: the backend computes finite sliding windows
NO_WINDOW = -1  # window_left/window_right: no limit (read only with WINDOW_GIVEN in window_flags)
WINDOW_GIVEN = 1 << 0  # window_flags: window_left/right hold the window; 0 (a zeroed struct): no window


class Device(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class Tensor(C.Structure):  # cad_tensor_v1_t == DLTensor
    _fields_ = [("data", C.c_void_p), ("device", Device), ("ndim", C.c_int32), ("dtype", DType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class Piece(C.Structure):
    _fields_ = [("doc_id", C.c_int64), ("doc_len", C.c_int64), ("offset_in_doc", C.c_int64), ("len", C.c_int64)]


class Segment(C.Structure):
    _fields_ = [("q_offset", C.c_int64), ("q_len", C.c_int64), ("kv_offset", C.c_int64), ("kv_len", C.c_int64)]


class Capabilities(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("device_type", C.c_int32), ("dtype_mask", C.c_uint32),
                ("flags", C.c_uint32), ("head_dim_mask", C.c_uint32), ("max_head_dim", C.c_int32),
                ("min_compute_capability", C.c_int32)]


_TP = C.POINTER(Tensor)


class ForwardArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("segments", C.POINTER(Segment)), ("num_segments", C.c_int64),
                ("pieces", C.POINTER(Piece)), ("num_pieces", C.c_int64), ("softmax_scale", C.c_float),
                ("causal", C.c_int32), ("stream", C.c_void_p), ("q", _TP), ("k", _TP), ("v", _TP), ("o", _TP),
                ("lse", _TP), ("plan", C.c_void_p), ("saved", C.POINTER(C.c_void_p)),
                ("window_flags", C.c_uint32), ("reserved_v1_2", C.c_uint32),  # ABI v1.2
                ("window_left", C.c_int64), ("window_right", C.c_int64)]


class BackwardArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("segments", C.POINTER(Segment)), ("num_segments", C.c_int64),
                ("pieces", C.POINTER(Piece)), ("num_pieces", C.c_int64), ("softmax_scale", C.c_float),
                ("causal", C.c_int32), ("stream", C.c_void_p), ("q", _TP), ("k", _TP), ("v", _TP), ("o", _TP),
                ("lse", _TP), ("d_o", _TP), ("d_q", _TP), ("d_k", _TP), ("d_v", _TP), ("plan", C.c_void_p),
                ("saved", C.c_void_p), ("window_flags", C.c_uint32), ("reserved_v1_2", C.c_uint32),  # ABI v1.2
                ("window_left", C.c_int64), ("window_right", C.c_int64)]


class PlanArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("segments", C.POINTER(Segment)), ("num_segments", C.c_int64),
                ("pieces", C.POINTER(Piece)), ("num_pieces", C.c_int64), ("num_q_rows", C.c_int64),
                ("num_kv_rows", C.c_int64), ("num_q_heads", C.c_int32), ("num_kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("dtype", DType), ("causal", C.c_int32), ("device", Device),
                ("stream", C.c_void_p), ("window_flags", C.c_uint32), ("reserved_v1_2", C.c_uint32),  # ABI v1.2
                ("window_left", C.c_int64), ("window_right", C.c_int64)]


class AttentionTable(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("create", C.c_void_p), ("destroy", C.c_void_p),
        ("last_error", C.CFUNCTYPE(C.c_char_p, C.c_void_p)),
        ("get_capabilities", C.CFUNCTYPE(c_status, C.c_void_p, C.POINTER(Capabilities))),
        ("forward", C.CFUNCTYPE(c_status, C.c_void_p, C.POINTER(ForwardArgs))),
        ("backward", C.CFUNCTYPE(c_status, C.c_void_p, C.POINTER(BackwardArgs))),
        ("get_stats_json", C.CFUNCTYPE(c_status, C.c_void_p, C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t))),
        ("make_plan", C.CFUNCTYPE(c_status, C.c_void_p, C.POINTER(PlanArgs), C.POINTER(C.c_void_p))),
        ("release_plan", C.CFUNCTYPE(None, C.c_void_p, C.c_void_p)),
        ("release_saved", C.CFUNCTYPE(None, C.c_void_p, C.c_void_p)),
    ]


# Host callbacks (cad_host.h).
BootstrapFn = C.CFUNCTYPE(c_status, C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p)
LogFn = C.CFUNCTYPE(None, C.c_void_p, C.c_int32, C.c_char_p, C.c_char_p)
_U64P = C.POINTER(C.c_uint64)
AllToAllVFn = C.CFUNCTYPE(c_status, C.c_void_p, C.c_void_p, _U64P, _U64P, C.c_void_p, _U64P, _U64P, C.c_int64,
                          C.c_void_p, C.c_size_t)
AllGatherFn = C.CFUNCTYPE(c_status, C.c_void_p, C.c_void_p, C.c_uint64, C.c_void_p, C.c_int64, C.c_void_p,
                          C.c_size_t)
BarrierFn = C.CFUNCTYPE(c_status, C.c_void_p, C.c_int64, C.c_void_p, C.c_size_t)
DeviceAllocateFn = C.CFUNCTYPE(c_status, C.c_void_p, C.c_int32, C.c_size_t, C.c_void_p, C.POINTER(C.c_void_p))
DeviceFreeFn = C.CFUNCTYPE(None, C.c_void_p, C.c_int32, C.c_void_p, C.c_size_t, C.c_void_p)


class HostOptions(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("config_json", C.c_char_p), ("config_path", C.c_char_p),
                ("search_path", C.c_char_p), ("bootstrap_all_gather", BootstrapFn), ("bootstrap_user", C.c_void_p),
                ("bootstrap_rank", C.c_int32), ("bootstrap_world_size", C.c_int32), ("log_callback", LogFn),
                ("log_user", C.c_void_p), ("host_all_to_all_v", AllToAllVFn), ("host_all_gather", AllGatherFn),
                ("host_barrier", BarrierFn), ("collectives_user", C.c_void_p), ("device_allocate", DeviceAllocateFn),
                ("device_free", DeviceFreeFn), ("allocator_user", C.c_void_p)]


# The frozen sizes (cad_abi_v1_layout.h) of what crosses by pointer.
for _struct, _size in ((Tensor, 48), (Piece, 32), (Segment, 32), (Capabilities, 32), (ForwardArgs, 136),
                       (BackwardArgs, 168), (PlanArgs, 120), (AttentionTable, 88)):
    if C.sizeof(_struct) != _size:
        raise ImportError(f"cad._abi: {_struct.__name__} is {C.sizeof(_struct)} bytes, the ABI says {_size}")


def write_message(buffer, capacity, text):
    """Copy `text` (NUL-terminated, truncated) into a C error buffer given as (void*, size_t)."""
    if not buffer or capacity == 0:
        return
    data = text.encode("utf-8", "replace")[: capacity - 1] + b"\0"
    C.memmove(buffer, data, len(data))

"""torch tensors as borrowed cad_tensor_v1_t descriptors (DLPack layout), with no copy and no compiled code.

A descriptor keeps its shape/stride arrays alive; the tensor itself must outlive the call it is passed to.
Whatever the tensor is (dtype, strides, device) is described as it is: the plugin judges it and its refusal
names the tensor, so that a bad input fails alike on every rank of a distributed call (what a plan fixed for
every rank -- heads, head dim, dtype -- is checked before, by Plan.check_tensors).
"""
import ctypes as C

import torch

from . import _abi

_DTYPES = {
    torch.float32: (_abi.DTYPE_CODE_FLOAT, 32), torch.bfloat16: (_abi.DTYPE_CODE_BFLOAT, 16),
    torch.float16: (_abi.DTYPE_CODE_FLOAT, 16), torch.float64: (_abi.DTYPE_CODE_FLOAT, 64),
    torch.int32: (_abi.DTYPE_CODE_INT, 32), torch.int64: (_abi.DTYPE_CODE_INT, 64),
}


def dtype_of(dtype):
    code, bits = _DTYPES.get(dtype, (_abi.DTYPE_CODE_INT, 8))  # anything else: a dtype no plugin accepts
    return _abi.DType(code, bits, 1)


def device_of(device):
    if device.type == "cuda":
        return _abi.Device(_abi.DEVICE_CUDA, device.index if device.index is not None else torch.cuda.current_device())
    return _abi.Device(_abi.DEVICE_CPU, 0)


class Described:
    """One tensor's descriptor; `.ptr` is what goes into an args struct."""

    __slots__ = ("tensor", "shape", "strides", "desc", "ptr")

    def __init__(self, tensor):
        self.tensor = tensor
        n = tensor.dim()
        self.shape = (C.c_int64 * n)(*tensor.shape)
        self.strides = (C.c_int64 * n)(*tensor.stride())
        self.desc = _abi.Tensor(C.c_void_p(tensor.data_ptr() or None), device_of(tensor.device), n,
                                dtype_of(tensor.dtype), self.shape, self.strides, 0)
        self.ptr = C.pointer(self.desc)


def current_stream(device):
    """The current CUDA stream's handle for a CUDA device, NULL (None) for CPU."""
    if device.type == "cuda":
        return C.c_void_p(torch.cuda.current_stream(device).cuda_stream or None)
    return None

"""cu_seqlens, checked once for every path: the local segment table and CAD's pieces read the same validated
list, so a tensor one path refuses is refused by the other too (the CAD path used to accept a float or 2-D
cu_seqlens, or one not starting at 0, and compute on whatever it made of it).

Reading back, and what a cache may trust. Every layer of a micro-batch passes the same tensor, so what it holds
is kept per tensor -- but decided from its values, never from its version counter alone: `cu.data.copy_(...)`
or a write through `cu.numpy()` refills a tensor without moving `_version`, and a cache keyed on the version
then served the old documents (OK with wrong numbers). A host tensor's bytes are compared with those read last
(a few hundred bytes: cheaper than the call) at every call. A device tensor is read back once per version: its
values cannot be seen without synchronising the host with its stream, and at every layer that left ping-pong's
two streams no time to overlap (measured on 2 H200s, docs/multi_gpu.md) -- FSDP2's root module moves a plan's
host cu_seqlens to the GPU, so the calls see such a copy. Keep CAD's cu_seqlens on the host (the plan reads
them there) to have them checked at every call.
"""
import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._errors import CadError


def fingerprint(cu_seqlens):
    """The tensor's values as bytes where they can be read without a device synchronisation (None elsewhere)."""
    if cu_seqlens.device.type != "cpu" or torch.compiler.is_compiling():  # (while tracing: no values to read)
        return None
    return cu_seqlens.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


class ReadBack:
    """What each cu_seqlens tensor held when it was last read. One per cad.Context (its `documents`), so that it
    lives as long as its owner and no module holds state; an entry lives as long as its tensor (weakly keyed, by
    identity: tensors do not compare with ==) and holds (its _version, its bytes (host tensors) or None, offsets)."""

    def __init__(self):
        self._by_tensor = WeakIdKeyDictionary()

    def offsets(self, cu_seqlens, what, tokens=None):
        """cu_seqlens as a tuple of ints: a 1-D int32/int64 tensor rising from 0 (to `tokens`, the rows of q, when
        given). Checked when its values are new; the same tuple object is returned while they are unchanged
        (callers may compare by identity first)."""
        if not isinstance(cu_seqlens, torch.Tensor):
            raise CadError(f"{what}: cu_seqlens must be a torch.Tensor (int32 [num_docs + 1]), got "
                           f"{type(cu_seqlens).__name__}")
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise CadError(f"{what}: cu_seqlens must be a 1-D int32 tensor [num_docs + 1], got "
                           f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.device.type == "meta":
            raise CadError(f"{what}: cu_seqlens is on the meta device (it has no values)")
        fingerprint_ = fingerprint(cu_seqlens)
        cached = self._by_tensor.get(cu_seqlens)
        if cached is not None and cached[0] == cu_seqlens._version and cached[1] == fingerprint_:
            cu = cached[2]
        else:
            cu = _checked(cu_seqlens, what)
            if cached is not None and cached[2] == cu:
                cu = cached[2]  # the same documents (rewritten with equal values): the same object
            self._by_tensor[cu_seqlens] = (cu_seqlens._version, fingerprint_, cu)
        if tokens is not None and cu[-1] != tokens:
            raise CadError(f"{what}: cu_seqlens must rise from 0 to T = {tokens} (q's rows), got {shown(cu)} ending "
                           f"at {cu[-1]}")
        return cu


def shown(cu):
    """The first offsets of a read-back cu_seqlens, for error messages."""
    return f"{list(cu[:4])}{'...' if len(cu) > 4 else ''}"


def _checked(cu_seqlens, what):
    cu = tuple(cu_seqlens.detach().to("cpu", torch.int64).tolist())
    if not cu or cu[0] != 0:
        raise CadError(f"{what}: cu_seqlens must start at 0, got {shown(cu)}")
    drop = next((i for i, (a, b) in enumerate(zip(cu, cu[1:])) if b < a), None)
    if drop is not None:
        raise CadError(f"{what}: cu_seqlens must not decrease, but entry {drop + 1} ({cu[drop + 1]}) is below "
                       f"entry {drop} ({cu[drop]})")
    return cu

"""cu_seqlens, checked once for every path: the local segment table and CAD's pieces read the same validated
list, so a tensor one path refuses is refused by the other too (the CAD path used to accept a float or 2-D
cu_seqlens, or one not starting at 0, and compute on whatever it made of it)."""
import torch

from ._errors import CadError


def offsets(cu_seqlens, what, tokens=None):
    """cu_seqlens as a list of ints: a 1-D int32/int64 tensor rising from 0 (to `tokens`, the rows of q, when
    given). Reads it back to the host (one copy; callers cache what they derive from it)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise CadError(f"{what}: cu_seqlens must be a torch.Tensor (int32 [num_docs + 1]), got "
                       f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise CadError(f"{what}: cu_seqlens must be a 1-D int32 tensor [num_docs + 1], got "
                       f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type == "meta":
        raise CadError(f"{what}: cu_seqlens is on the meta device (it has no values)")
    cu = cu_seqlens.detach().to("cpu", torch.int64).tolist()
    shown = f"{cu[:4]}{'...' if len(cu) > 4 else ''}"
    if not cu or cu[0] != 0:
        raise CadError(f"{what}: cu_seqlens must start at 0, got {shown}")
    drop = next((i for i, (a, b) in enumerate(zip(cu, cu[1:])) if b < a), None)
    if drop is not None:
        raise CadError(f"{what}: cu_seqlens must not decrease, but entry {drop + 1} ({cu[drop + 1]}) is below "
                       f"entry {drop} ({cu[drop]})")
    if tokens is not None and cu[-1] != tokens:
        raise CadError(f"{what}: cu_seqlens must rise from 0 to T = {tokens} (q's rows), got {shown} ending at "
                       f"{cu[-1]}")
    return cu

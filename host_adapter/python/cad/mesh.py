"""cad.mesh: which ranks form CAD's group, and which heads a rank holds, in a trainer's parallel layout.

A trainer lays its world out as a mesh of named dimensions, outermost first, the last varying fastest:
TorchTitan's ("pp", "batch", "cp", "tp"), Megatron-Core's order "tp-cp-ep-dp-pp" read from the right
({"pp": .., "dp": .., "cp": .., "tp": ..}). CAD's pool spans the dimensions whose ranks hold different tokens --
data and context (and, for a pipeline-tick plan, pipeline) --, and a rank's group is the ranks that share its index
on every other dimension. Under tensor parallelism the ranks of one TP group hold the same tokens and different
heads: each TP index has its own CAD group over data (x context), with the same plan on every TP index (the same
pieces, the same deterministic balancer), so the exchange moves a head slice and no collective spans TP.

    layout = {"pp": 1, "dp": 2, "cp": 2, "tp": 2}
    cad.mesh.cad_ranks(layout, rank=5, over=("dp", "cp"))     # (1, 3, 5, 7): rank 5's CAD group
    group = cad.mesh.cad_group(layout, over=("dp", "cp"))     # its torch.distributed group (collective)
    ctx = cad.Context(group)                                  # or cad.init(group=group)
    hq, hkv = cad.mesh.heads_per_rank(32, 8, tp=2)            # (16, 4): the shapes each TP index plans with

Pure data except cad_group, which makes the groups.
"""
from ._checks import integer
from ._errors import CadError

__all__ = ["cad_group", "cad_ranks", "coordinates", "groups", "heads_per_rank"]


def _layout(layout, what):
    try:
        items = list(layout.items())
    except AttributeError:
        raise CadError(f"{what}: layout must be a mapping of dimension name to size, outermost first, got "
                       f"{type(layout).__name__}") from None
    if not items:
        raise CadError(f"{what}: layout has no dimensions")
    out = []
    for name, size in items:
        size = integer(size, f"layout[{name!r}]", what)
        if size < 1:
            raise CadError(f"{what}: layout[{name!r}] must be at least 1, got {size}")
        out.append((name, size))
    return out


def _over(layout, over, what):
    names = [name for name, _ in layout]
    over = (over,) if isinstance(over, str) else tuple(over)
    unknown = [d for d in over if d not in names]
    if unknown:
        raise CadError(f"{what}: over names {unknown}, not dimensions of the layout {names}")
    return set(over)


def _world(layout):
    world = 1
    for _, size in layout:
        world *= size
    return world


def coordinates(layout, rank):
    """{dimension: index} of world rank `rank` in `layout` (row-major: the last dimension varies fastest)."""
    what = "cad.mesh.coordinates"
    dims = _layout(layout, what)
    rank = integer(rank, "rank", what, 0, _world(dims) - 1)
    out = {}
    for name, size in reversed(dims):
        out[name] = rank % size
        rank //= size
    return {name: out[name] for name, _ in dims}


def _rank_of(dims, coords):
    rank = 0
    for name, size in dims:
        rank = rank * size + coords[name]
    return rank


def cad_ranks(layout, rank, over):
    """The world ranks of `rank`'s CAD group: those sharing its index on every dimension not in `over`, in
    increasing order, which is the order of `over`'s dimensions flattened (a rank's index in the group is its
    row-major index over them)."""
    what = "cad.mesh.cad_ranks"
    dims = _layout(layout, what)
    spans = _over(dims, over, what)
    mine = coordinates(layout, rank)
    ranks = [r for r in range(_world(dims))
             if all(c == mine[n] for n, c in coordinates(layout, r).items() if n not in spans)]
    return tuple(ranks)


def groups(layout, over):
    """Every CAD group of the layout (tuples of world ranks), in increasing order of their first rank: what each
    rank must create, in this order, since torch.distributed.new_group is collective over the world."""
    what = "cad.mesh.groups"
    dims = _layout(layout, what)
    _over(dims, over, what)
    seen, out = set(), []
    for r in range(_world(dims)):
        if r not in seen:
            ranks = cad_ranks(layout, r, over)
            seen.update(ranks)
            out.append(ranks)
    return out


def cad_group(layout, over, *, rank=None, backend=None):
    """This rank's CAD group as a torch.distributed ProcessGroup: the default (world) group where it spans every
    rank, else a new group (every group of the layout is created on every rank, in `groups`' order: call it on all
    ranks, the same way). layout's sizes must multiply to the world size. rank: this rank (default:
    torch.distributed's)."""
    import torch.distributed as dist
    what = "cad.mesh.cad_group"
    dims = _layout(layout, what)
    if not dist.is_available() or not dist.is_initialized():
        raise CadError(f"{what}: torch.distributed is not initialized")
    world = dist.get_world_size()
    if _world(dims) != world:
        raise CadError(f"{what}: the layout {dict(dims)} holds {_world(dims)} ranks, the world has {world}")
    rank = dist.get_rank() if rank is None else rank
    all_groups = groups(layout, over)
    if len(all_groups) == 1:
        return dist.group.WORLD
    mine = None
    for ranks in all_groups:
        group = dist.new_group(list(ranks), backend=backend)
        if rank in ranks:
            mine = group
    return mine


def heads_per_rank(num_heads, num_kv_heads, tp, what="cad.mesh.heads_per_rank"):
    """(Hq / tp, Hkv / tp): the query and key/value heads each rank of a TP group holds and plans with. Refuses a
    split that does not divide: Hq % tp, and Hkv % tp (each TP rank must hold whole K/V heads of its own query
    heads; where tp > Hkv, replicate K/V heads to a multiple of tp before the split, as Megatron-Core does)."""
    num_heads = integer(num_heads, "num_heads", what)
    num_kv_heads = integer(num_kv_heads, "num_kv_heads", what)
    tp = integer(tp, "tp", what)
    if tp < 1 or num_heads < 1 or num_kv_heads < 1:
        raise CadError(f"{what}: num_heads, num_kv_heads and tp must be positive, got {num_heads}, {num_kv_heads} "
                       f"and {tp}")
    if num_heads % num_kv_heads:
        raise CadError(f"{what}: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads} (GQA)")
    if num_heads % tp:
        raise CadError(f"{what}: num_heads {num_heads} is not divisible by the tensor-parallel size {tp}")
    if num_kv_heads % tp:
        raise CadError(f"{what}: num_kv_heads {num_kv_heads} is not divisible by the tensor-parallel size {tp}: "
                       f"each TP rank must hold whole K/V heads (replicate the K/V heads to a multiple of {tp} "
                       f"first, or use a tensor-parallel size that divides {num_kv_heads})")
    return num_heads // tp, num_kv_heads // tp

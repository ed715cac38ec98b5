"""One order of collective CAD calls on every rank, when ranks run different plans in different directions.

Every CAD call is collective over the stack's group: all ranks make the same call, with the same plan, in the same
direction, in the same order. A data-parallel trainer gets that for free; a 1F1B pipeline does not: at one tick a
stage runs a forward of micro-batch i (its layers' forward calls, plan P(i, s)) while the next stage runs the
backward of micro-batch j (backward calls, plan P(j, s + 1), each after its layer's recomputed forward under
activation checkpointing). Each plan spreads its own micro-batch's attention over every rank, so every rank must
take part in every one of those calls -- in the calls of micro-batches it does not hold, over zero tokens of its
own, as a server.

cad.CallOrder(slot, repeats) says which calls a tick makes: `slot` lists one layer's calls in the order every rank
makes them, as (direction, plan, mine) with direction "forward" or "backward" and mine whether this rank holds the
plan's tokens (its own layers make that call); the tick repeats the slot `repeats` times (the layers per stage).
Inside `with order:`, this rank's own calls (cad.varlen_attn, forwards and their backwards, recomputations
included) come from its layers as usual; before each of them the order makes, over zero tokens, every call of the
slot that comes first and is not this rank's, and after this rank's last call of a slot the rest of it. A rank
with no call of its own in the tick (idle) makes them all with order.serve_rest(). Leaving the block without an
error makes what is left; a call of this rank that does not come where the order expects it fails with a
CadError naming both (never a hang on the other ranks' side: their calls fail by the stack's timeout).

A call made for another rank keeps the servers' state exactly as that rank's own call does (cad.init's
keep_forward_tensors, with the owner's recomputation counted as inside a backward), and hands it to the backward
call of the same plan and layer, in this tick or a later one (the last kept to the first backward: backwards run
the layers in reverse). A plan's backward calls all run in one tick; what is still kept for the plan when that
tick ends (a first forward that its owner recomputed) is given back then; cad.shutdown gives back the rest.

A backward call runs with the plan of the forward whose autograd node it differentiates. Under non-reentrant
activation checkpointing that is the layer's first forward (only its saved tensors are recomputed), so the plan of
a backward is its first forward's; a trainer whose backward must run under a plan of its own tick recomputes with
reentrant checkpointing, which differentiates the recomputed forward (examples/train_pipeline.py, 1F1B with
--pool bubble).
"""
import torch

from . import _checks, _context, _ops
from ._errors import CadError
from ._plans import Plan


def current(context=None):
    """The CallOrder of the tick now running on `context` (default: the default context), or None. Per context,
    not per thread: on CUDA the autograd engine runs the backwards (and their calls) on a device thread of its
    own."""
    return (context or _context.default()).call_order


class CallOrder:
    """The collective calls of one tick, in the order every rank makes them (see the module doc)."""

    def __init__(self, slot, repeats):
        """slot: the calls of one layer, each (direction, plan, mine); repeats: how often the slot repeats (an int
        >= 0). Each entry is checked here: a CadError names the entry (its index) and the argument."""
        try:
            entries = list(slot)
        except TypeError:
            raise CadError(f"cad.CallOrder: slot must be a list of (direction, plan, mine) entries, got "
                           f"{type(slot).__name__}", "INVALID_ARGUMENT") from None
        self.slot = []
        for i, entry in enumerate(entries):
            try:
                fields = tuple(entry)
            except TypeError:
                fields = None
            if fields is None or len(fields) != 3:
                raise CadError(f"cad.CallOrder: slot[{i}] must be (direction, plan, mine), got {entry!r}",
                               "INVALID_ARGUMENT")
            direction, plan, mine = fields
            if direction not in ("forward", "backward"):
                raise CadError(f"cad.CallOrder: slot[{i}]: a call's direction must be 'forward' or 'backward', got "
                               f"{direction!r}", "INVALID_ARGUMENT")
            if not isinstance(plan, Plan):
                raise CadError(f"cad.CallOrder: slot[{i}]: plan must be a cad.Plan, got {type(plan).__name__} "
                               f"{plan!r}", "INVALID_ARGUMENT")
            if not isinstance(mine, bool) and mine not in (0, 1):
                raise CadError(f"cad.CallOrder: slot[{i}]: mine must be True or False, got {mine!r}",
                               "INVALID_ARGUMENT")
            self.slot.append((direction, plan, bool(mine)))
        contexts = {id(p.context): p.context for _, p, _ in self.slot}
        if len(contexts) > 1:
            raise CadError(f"cad.CallOrder: the slot's plans belong to {len(contexts)} contexts (#"
                           f"{', #'.join(str(c.id) for c in contexts.values())}); one tick's calls are one group's",
                           "INVALID_ARGUMENT")
        self.context = next(iter(contexts.values())) if contexts else _context.default()
        self.repeats = _checks.integer(repeats, "repeats", "cad.CallOrder", 0)
        self._position = 0  # calls made so far in this tick (all repeats), own and served
        self._total = len(self.slot) * self.repeats

    @classmethod
    def for_tick(cls, operations, stage, plans, layers, recomputes):
        """The order of a pipeline tick: `operations` per stage, ("forward" | "backward", micro-batch) or None
        (idle); `stage` this rank's; `plans[(micro-batch, stage)]` the plan of that stage's micro-batch (its
        forward's and its backward's); `layers` per stage; `recomputes`: a backward first recomputes its forward
        (activation checkpointing). Per layer the stages' calls in stage order: a forward's forward call, a
        backward's (recomputed forward and) backward call."""
        slot = []
        for s, op in enumerate(operations):
            if op is None:
                continue
            direction, micro_batch = op
            plan, mine = plans.get((micro_batch, s)), s == stage
            if plan is None:
                raise CadError(f"cad.CallOrder.for_tick: stage {s} runs the {direction} of micro-batch {micro_batch} "
                               f"but `plans` has no plan for (micro-batch {micro_batch}, stage {s}); it has "
                               f"{sorted(plans)}", "INVALID_ARGUMENT")
            if direction == "forward" or recomputes:
                slot.append(("forward", plan, mine))
            if direction == "backward":
                slot.append(("backward", plan, mine))
        return cls(slot, layers)

    # ---- what the tick has made so far -------------------------------------------------------------------------
    def _entry(self, position):
        return self.slot[position % len(self.slot)]

    def _describe(self, direction, plan):
        tag = f" (tag {plan.tag})" if plan.tag is not None else ""
        return f"the {direction} call of plan #{plan.id}{tag}"

    def _serve_until(self, end):
        """Make the other ranks' calls from here up to position `end`, stopping at this rank's own next call."""
        while self._position < end and not self._entry(self._position)[2]:
            direction, plan, _ = self._entry(self._position)
            self._serve(direction, plan)
            self._position += 1

    # ---- hooks of cad::varlen_fwd / cad::varlen_bwd -----------------------------------------------------------
    def before_own_call(self, direction, plan):
        self._serve_until(self._total)
        if self._position >= self._total:
            raise CadError(f"cad.CallOrder: rank {self.context.rank}: {self._describe(direction, plan)} came after "
                           f"every call of this tick's order ({self.repeats} x {len(self.slot)} calls) was made",
                           "INVALID_ARGUMENT")
        want_direction, want_plan, _ = self._entry(self._position)
        if (want_direction, want_plan) != (direction, plan):
            raise CadError(f"cad.CallOrder: rank {self.context.rank}: call {self._position} of this tick is "
                           f"{self._describe(want_direction, want_plan)} by the order every rank follows, but this "
                           f"rank's layers made {self._describe(direction, plan)}", "INVALID_ARGUMENT")

    def after_own_call(self):
        # The rest of this call's slot, if none of it is this rank's (else its next own call makes them).
        end = (self._position // len(self.slot) + 1) * len(self.slot)
        self._position += 1
        if not any(self._entry(p)[2] for p in range(self._position, end)):
            self._serve_until(end)

    # ---- the calls made for other ranks ----------------------------------------------------------------------
    def _serve(self, direction, plan):
        plan.wait()
        if plan.shape is None:
            raise CadError(f"cad.CallOrder: rank {self.context.rank}: plan #{plan.id} has no shapes yet; make it ahead "
                           f"(cad.plan(..., ahead=True) with its shapes) or give its owner's shapes to cad.plan",
                           "INVALID_ARGUMENT")
        heads, kv_heads, head_dim, dtype, device = plan.shape
        q = torch.empty(0, heads, head_dim, dtype=dtype, device=device)
        kv = torch.empty(0, kv_heads, head_dim, dtype=dtype, device=device)
        scale = head_dim ** -0.5  # (no token of this rank's: the scale only has to be a number)
        if direction == "forward":
            # The owner's forward keeps the servers' state as its own context decides: a recomputation (the slot
            # has this plan's backward after it) counts as inside a backward.
            in_backward = any(d == "backward" and p is plan for d, p, _ in self.slot)
            _ops.serve_forward(q, kv, plan, scale, in_backward)
        else:
            _ops.serve_backward(q, kv, plan, scale)

    def serve_rest(self):
        """Make every call of the tick not yet made (a rank with no call of its own in this tick)."""
        self._serve_until(self._total)
        if self._position < self._total:  # stopped at a call of this rank's own
            direction, plan, _ = self._entry(self._position)
            raise CadError(f"cad.CallOrder: rank {self.context.rank}: call {self._position} of this tick is this "
                           f"rank's own ({self._describe(direction, plan)}) and its layers never made it",
                           "INVALID_ARGUMENT")

    def __enter__(self):
        if self.context.call_order is not None:
            raise CadError(f"cad.CallOrder: another tick's call order is active on context #{self.context.id}",
                           "INVALID_ARGUMENT")
        self.context.call_order = self
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.serve_rest()
                # A plan's backward calls all run in one tick: what is still kept for them now is a first forward's
                # whose owner recomputed it (activation checkpointing dropped the owner's own copy long ago).
                for plan_id in {p.id for d, p, _ in self.slot if d == "backward"}:
                    self.context.release_served(plan_id)
        finally:
            self.context.call_order = None
        return False

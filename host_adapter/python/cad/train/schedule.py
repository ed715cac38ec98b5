"""The pipeline's tick schedule, beside cad.CallOrder (which orders one tick's CAD calls): the layout of
ranks (rank = stage * dp + replica), GPipe's forward and mirrored backward ticks, the 1F1B timetable in lockstep
ticks, which ticks have an idle stage (the bubble), and the tags of 1F1B bubble plans."""


class Layout:
    """Where this rank sits: rank = stage * dp + replica."""

    def __init__(self, rank, world, pp):
        check_layout(world, pp)
        self.rank, self.world, self.pp, self.dp = rank, world, pp, world // pp
        self.stage, self.replica = divmod(rank, self.dp)
        self.first, self.last = self.stage == 0, self.stage == pp - 1

    def rank_of(self, stage, replica):
        return stage * self.dp + replica

    def stage_ranks(self, stage):
        return [self.rank_of(stage, r) for r in range(self.dp)]

    def describe(self):
        return f"rank {self.rank} (stage {self.stage}, replica {self.replica})"


def check_layout(world, pp):
    if pp < 1:
        raise ValueError(f"--pp must be at least 1, got {pp}")
    if world % pp:
        raise ValueError(f"the world of {world} ranks is not divisible by --pp {pp} (world = PP x DP ranks)")


def ticks(micro_batches, stages):
    """Forward ticks per step (backward ticks are as many)."""
    return micro_batches + stages - 1


def forward_micro_batch(stage, tick, micro_batches):
    """The micro-batch stage `stage` runs at forward tick `tick`, or None (idle)."""
    m = tick - stage
    return m if 0 <= m < micro_batches else None


def bubble_tick(tick, micro_batches, stages):
    """Whether some stage is idle at GPipe forward tick `tick` (the fill and drain bubbles): the ticks --pool bubble
    runs CAD in."""
    return any(forward_micro_batch(s, tick, micro_batches) is None for s in range(stages))


def mirrored_tick(backward_tick, micro_batches, stages):
    """The forward tick whose micro-batches backward tick `backward_tick` runs (on every stage)."""
    return ticks(micro_batches, stages) - 1 - backward_tick


def one_f_one_b(micro_batches, stages):
    """The 1F1B timetable in ticks: per tick, per stage ("forward" | "backward", micro-batch) or None (idle).

    Stage s runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward, then the
    remaining backwards (PipeDream-flush's order); each operation takes the first tick at which what it needs
    was done at an earlier tick (the activation from stage s - 1, the gradient from stage s + 1, or on the last
    stage its own forward), since a tick's outputs travel at its end. So at most S - s micro-batches are in
    flight on stage s (GPipe: all M), and at a tick some stages run forwards while others run backwards."""
    order = []
    for s in range(stages):
        warm = min(stages - s - 1, micro_batches)
        ops = [("forward", m) for m in range(warm)]
        for i in range(micro_batches - warm):
            ops += [("forward", warm + i), ("backward", i)]
        ops += [("backward", m) for m in range(micro_batches - warm, micro_batches)]
        order.append(ops)
    done = {}  # (stage, phase, micro-batch) -> tick
    table, nxt = [], [0] * stages
    while any(nxt[s] < len(order[s]) for s in range(stages)):
        tick = len(table)
        row = [None] * stages
        for s in range(stages):
            if nxt[s] == len(order[s]):
                continue
            phase, m = order[s][nxt[s]]
            if phase == "forward":
                need = (s - 1, "forward", m) if s > 0 else None
            else:
                need = (s + 1, "backward", m) if s < stages - 1 else (s, "forward", m)
            if need is None or done.get(need, tick) < tick:
                row[s] = (phase, m)
        for s, op in enumerate(row):
            if op is not None:
                done[(s, op[0], op[1])] = tick
                nxt[s] += 1
        table.append(row)
    return table


def one_f_one_b_bubble_tick(table, tick):
    """Whether some stage is idle at tick `tick` of a 1F1B timetable (one_f_one_b's): the ticks --pool bubble runs
    CAD in under --schedule 1f1b."""
    return any(op is None for op in table[tick])


# 1F1B --pool bubble's plan tags start here: above every other scheme's (GPipe's step x T + tick, a stage's
# step x M + m, 1F1B tick pool's (step x M + m) x S + s), so that no two plans of this process share a tag.
BUBBLE_1F1B_TAGS = 1 << 40


def bubble_1f1b_tag(step, direction, micro_batch, stage, micro_batches, stages):
    """The tag of the plan of one operation (the forward or the backward of (micro_batch, stage)) in a 1F1B bubble
    tick: the same on every rank, a different one per operation."""
    operation = (step * micro_batches + micro_batch) * stages + stage
    return BUBBLE_1F1B_TAGS + 2 * operation + (1 if direction == "backward" else 0)

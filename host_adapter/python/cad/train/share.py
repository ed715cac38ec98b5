"""The realised share, DESIGN's headline measure of a configuration: of the speedup that perfect balance at no
communication cost would give over local attention (the ideal), the part it got.

    speedup = baseline step / step            (the baseline: local attention, the same schedule and batches)
    ideal   = baseline step / ideal step      (measured: local attention on balanced batches; or computed: the
                                               baseline's step with every rank's attention at the mean)
    share   = (speedup - 1) / (ideal - 1)     (none where the ideal gains nothing: ideal - 1 below least_gain)

Used by the pipeline trainer's comparison table and tests/multi_gpu/table.py (one rule for both)."""


def speedup(baseline_step, step):
    """How many times faster than the baseline a step is; None where either time is unknown or not positive."""
    if baseline_step is None or step is None or step <= 0 or baseline_step <= 0:
        return None
    return baseline_step / step


def realised_share(speedup_value, ideal, least_gain=1e-9):
    """(speedup - 1) / (ideal - 1); None where either is unknown or the ideal gains less than least_gain (nothing
    to gain: the share would divide by about zero)."""
    if speedup_value is None or ideal is None or ideal - 1 < least_gain:
        return None
    return (speedup_value - 1) / (ideal - 1)


def report(baseline_step, step, ideal_step, least_gain=1e-9):
    """{"speedup", "ideal", "share"} of a step against the baseline's step and the ideal step (any one unit)."""
    got, ideal = speedup(baseline_step, step), speedup(baseline_step, ideal_step)
    return {"speedup": got, "ideal": ideal, "share": realised_share(got, ideal, least_gain)}

"""cad.train.schedule: the pipeline's tick schedule -- the rank layout, GPipe's forward ticks and their mirrored
backward ticks, its bubble, the 1F1B timetable (every operation once, after what it needs, at most S - s
micro-batches in flight on stage s) and the 1F1B bubble plans' tags."""
import itertools

import pytest

from cad.train.schedule import BUBBLE_1F1B_TAGS, Layout, bubble_1f1b_tag, bubble_tick, check_layout, \
    forward_micro_batch, mirrored_tick, one_f_one_b, one_f_one_b_bubble_tick, ticks


def test_layout_is_stage_major():
    at = Layout(rank=5, world=6, pp=3)
    assert (at.dp, at.stage, at.replica, at.first, at.last) == (2, 2, 1, False, True)
    assert at.stage_ranks(1) == [2, 3] and at.rank_of(0, 1) == 1
    with pytest.raises(ValueError, match="not divisible by --pp 4"):
        check_layout(6, 4)
    with pytest.raises(ValueError, match="at least 1"):
        check_layout(6, 0)


@pytest.mark.parametrize("m,s", [(1, 1), (4, 2), (3, 3), (2, 4), (8, 4)])
def test_gpipe_ticks_run_every_micro_batch_once_per_stage_in_order(m, s):
    assert ticks(m, s) == m + s - 1
    for stage in range(s):
        run = [forward_micro_batch(stage, t, m) for t in range(ticks(m, s))]
        assert [x for x in run if x is not None] == list(range(m))
        assert run[:stage] == [None] * stage  # the fill bubble
    # a backward tick runs the micro-batches of its mirrored forward tick, the last micro-batch first
    for b in range(ticks(m, s)):
        assert mirrored_tick(b, m, s) == ticks(m, s) - 1 - b
    assert [forward_micro_batch(s - 1, mirrored_tick(b, m, s), m) for b in range(m)] == list(range(m - 1, -1, -1))
    bubble = [t for t in range(ticks(m, s)) if bubble_tick(t, m, s)]
    assert bubble == [t for t in range(ticks(m, s)) if t < s - 1 or t >= m]


@pytest.mark.parametrize("m,s", [(1, 1), (4, 2), (2, 3), (3, 3), (6, 4), (2, 5)])
def test_one_f_one_b_timetable(m, s):
    table = one_f_one_b(m, s)
    assert len(table) == 2 * (m + s - 1) and all(len(row) == s for row in table)
    done = {}
    for t, row in enumerate(table):
        for stage, op in enumerate(row):
            if op is not None:
                assert (stage, *op) not in done, "an operation runs once"
                done[(stage, *op)] = t
    assert set(done) == {(stage, phase, mb) for stage in range(s) for phase in ("forward", "backward")
                         for mb in range(m)}
    for (stage, phase, mb), t in done.items():  # what an operation needs was done at an earlier tick
        if phase == "forward" and stage > 0:
            assert done[(stage - 1, "forward", mb)] < t
        if phase == "backward":
            assert done[(stage + 1, "backward", mb) if stage < s - 1 else (stage, "forward", mb)] < t
    for stage in range(s):  # in flight: forwards begun, backwards not yet done
        for t in range(len(table)):
            started = sum(1 for mb in range(m) if done[(stage, "forward", mb)] <= t)
            finished = sum(1 for mb in range(m) if done[(stage, "backward", mb)] <= t)
            assert started - finished <= max(1, min(s - stage, m))
    bubble = [t for t in range(len(table)) if one_f_one_b_bubble_tick(table, t)]
    assert bubble == [t for t, row in enumerate(table) if None in row]


def test_one_f_one_b_mixes_directions_in_a_tick():
    table = one_f_one_b(4, 2)
    assert any({op[0] for op in row if op} == {"forward", "backward"} for row in table)


def test_bubble_1f1b_tags_are_unique_and_above_the_others():
    m, s = 3, 2
    tags = [bubble_1f1b_tag(step, d, mb, stage, m, s) for step, d, mb, stage in
            itertools.product(range(2), ("forward", "backward"), range(m), range(s))]
    assert len(set(tags)) == len(tags) and min(tags) >= BUBBLE_1F1B_TAGS

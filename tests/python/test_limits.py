"""Every Python integer that crosses into C (a ctypes field) or into a tensor is checked first: one outside int64
or outside its field's own range is refused with a CadError naming it, at the call or plan that got it, and the
stack stays usable (ctypes used to truncate 2**64 - 1 to -1, a plan then had no window; torch raised its own
error for 2**63; a tag of 2**70 failed every later plan ahead of its stack)."""
import pytest
import torch

import cad
from cad.varlen import varlen_attn as torch_style_varlen_attn
from reference import random_batch, sdpa_varlen, sdpa_varlen_window

SHAPE = dict(num_heads=2, num_kv_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
INT64_MAX = 2 ** 63 - 1


@pytest.fixture(autouse=True)
def fresh_stacks():
    cad.init(timeout_ms=20000)
    yield
    cad.shutdown()


def _batch():
    return random_batch([5, 9], 2, 1, 8, seed=1)


def _still_works(q, k, v, cu):
    plan = cad.plan(cu, window_size=(3, 0), **SHAPE)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plan), sdpa_varlen_window(q, k, v, cu, True, (3, 0)),
                               rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu), sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("window, name", [
    ((2 ** 63, 0), r"window_size\[0\] \(left\)"), ((2 ** 64 - 1, 0), r"window_size\[0\] \(left\)"),
    ((-1, 2 ** 63), r"window_size\[1\] \(right\)"), ((-(2 ** 63) - 1, 0), r"window_size\[0\] \(left\)"),
])
def test_windows_past_int64_are_refused_naming_window_size(window, name):
    q, k, v, cu = _batch()
    expected = name + r" must be an int in \[-1, 9223372036854775807\]"
    with pytest.raises(cad.CadError, match=r"cad.varlen_attn: " + expected):
        cad.varlen_attn(q, k, v, cu, causal=False, window_size=window)
    with pytest.raises(cad.CadError, match=r"cad.plan: " + expected):
        cad.plan(cu, causal=False, window_size=window, **SHAPE)
    with pytest.raises(cad.CadError, match=r"cad.plan_pieces: " + expected):
        cad.plan_pieces([(7, 14, 0, 14)], causal=False, window_size=window)
    with pytest.raises(cad.CadError, match=expected):
        torch_style_varlen_attn(q, k, v, cu, cu, 9, 9, window_size=window)
    _still_works(q, k, v, cu)


def test_the_largest_int64_window_is_no_limit_in_effect():
    q, k, v, cu = _batch()
    got = cad.varlen_attn(q, k, v, cu, causal=True, window_size=(INT64_MAX, 0))
    torch.testing.assert_close(got, sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("tag", [2 ** 70, 2 ** 63, -(2 ** 63) - 1, "3", 1.0, True])
def test_tags_outside_int64_or_not_ints_are_refused_at_the_plan(tag):
    q, k, v, cu = _batch()
    with pytest.raises(cad.CadError, match=r"cad.plan: tag must be an int"):
        cad.plan(cu, ahead=True, tag=tag, **SHAPE)
    # The stack and its planning thread are untouched: plans ahead after it are made, with the largest tag too.
    for good in (INT64_MAX, -(2 ** 63), 0):
        plan = cad.plan(cu, ahead=True, tag=good, **SHAPE)
        torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plan), sdpa_varlen(q, k, v, cu, True),
                                   rtol=1e-5, atol=2e-5)
        assert plan.tag == good


@pytest.mark.parametrize("field, value, expected", [
    ("num_heads", 2 ** 31, r"num_heads must be an int in \[1, 2147483647\], got 2147483648"),
    ("num_heads", 0, r"num_heads must be an int in \[1, 2147483647\], got 0"),
    ("num_kv_heads", 2 ** 64, r"num_kv_heads must be an int in \[1, 2147483647\]"),
    ("head_dim", 8.0, r"head_dim must be an int, got float 8.0"),
    ("head_dim", -8, r"head_dim must be an int in \[1, 2147483647\]"),
    ("dtype", "float32", r"dtype must be a torch.dtype, got 'float32'"),
    ("lane", 2 ** 64, r"lane must be an int in \[0, 3\], got 18446744073709551616"),
    ("lane", 4, r"lane must be an int in \[0, 3\], got 4"),
    ("lane", "1", r"lane must be an int, got str '1'"),
])
def test_shapes_and_lanes_outside_their_fields_are_refused_naming_them(field, value, expected):
    q, k, v, cu = _batch()
    with pytest.raises(cad.CadError, match=expected):
        cad.plan(cu, **dict(SHAPE, **{field: value}))
    _still_works(q, k, v, cu)


@pytest.mark.parametrize("pieces, expected", [
    ([(7, 2 ** 63, 0, 14)], r"pieces\[0\].doc_len must be an int in \[0, 9223372036854775807\]"),
    ([(7, 14, 0, 14), (2 ** 64, 3, 0, 3)], r"pieces\[1\].doc_id must be an int in \[-9223372036854775808, "),
    ([(7, 14, 0.5, 14)], r"pieces\[0\].offset_in_doc must be an int, got float 0.5"),
    ([(7, 14, 0, -1)], r"pieces\[0\].len must be an int in \[0, "),
    ([(7, 14, 0)], r"pieces\[0\] must be \(doc_id, doc_len, offset_in_doc, len\), got \(7, 14, 0\)"),
])
def test_pieces_outside_int64_are_refused_naming_the_piece_and_field(pieces, expected):
    with pytest.raises(cad.CadError, match=expected):
        cad.plan_pieces(pieces)


@pytest.mark.parametrize("setting, value, expected", [
    ("timeout_ms", 2 ** 63, r"timeout_ms must be an int in \[1, 2147483647\]"),
    ("timeout_ms", 0, r"timeout_ms must be an int in \[1, 2147483647\]"),
    ("min_shard_tokens", 2 ** 64, r"min_shard_tokens must be an int in \[0, 9223372036854775807\]"),
    ("min_shard_tokens", 1.5, r"min_shard_tokens must be an int, got float"),
])
def test_settings_outside_their_range_are_refused_naming_them(setting, value, expected):
    with pytest.raises(cad.CadError, match=expected):
        cad.init(**{setting: value})
    with pytest.raises(cad.CadError, match=expected):
        cad.Context(**{setting: value})
    cad.init(timeout_ms=20000)
    _still_works(*_batch())

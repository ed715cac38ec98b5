"""Checks of the Python values that cross into C (ctypes fields) or into a tensor, in one place.

ctypes truncates an int that does not fit its field without a word (2**64 - 1 becomes -1 in an int64_t) and torch
raises its own RuntimeError for one outside int64, naming nothing. Every integer the package hands on is checked
here first against int64 and against its field's own range, and refused with a CadError naming it.
"""
import operator

from ._errors import CadError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MAX = (1 << 31) - 1


def integer(value, name, what, low=INT64_MIN, high=INT64_MAX):
    """`value` as a Python int in [low, high] (both within int64): an int or an int-like (operator.index: a
    numpy or 0-d tensor integer), never a bool, a float or a string."""
    if isinstance(value, bool):
        raise CadError(f"{what}: {name} must be an int, got the bool {value!r}", "INVALID_ARGUMENT")
    try:
        value = operator.index(value)
    except TypeError:
        raise CadError(f"{what}: {name} must be an int, got {type(value).__name__} {value!r}",
                       "INVALID_ARGUMENT") from None
    low, high = max(low, INT64_MIN), min(high, INT64_MAX)
    if not low <= value <= high:
        raise CadError(f"{what}: {name} must be an int in [{low}, {high}], got {value}", "INVALID_ARGUMENT")
    return value


def window_of(window_size, causal, what="cad.varlen_attn"):
    """window_size as PyTorch's (left, right), -1 = no limit, checked so the error names the argument. Returns what
    the ABI takes: causal windows with right = -1 (a causal query sees nothing after itself)."""
    try:  # operator.index: ints (and int-like tensors' items), never a float silently truncated
        left, right = (operator.index(x) for x in window_size)
    except (TypeError, ValueError):
        raise CadError(f"{what}: window_size must be a pair (left, right) of ints, got {window_size!r}",
                       "INVALID_ARGUMENT") from None
    left = integer(left, "window_size[0] (left)", what, -1)  # -1: no limit; below it, or past int64: refused
    right = integer(right, "window_size[1] (right)", what, -1)
    if causal and right > 0:
        raise CadError(f"{what}: window_size[1] (right) is {right}, but causal=True sees no key after the "
                       f"query: use -1 or 0, or causal=False", "INVALID_ARGUMENT")
    if causal:
        right = -1
    return left, right

"""Older names for plans, kept for code written before cad.Context: `makes_so_far()` counts the default context's
collective plan makes (new code reads cad.context().makes or Context.makes)."""
from . import _context
from ._plans import Plan, piece_array, pieces_from_cu_seqlens  # noqa: F401 -- older names
from ._api import plan, plan_pieces  # noqa: F401


def makes_so_far():
    return _context.default().makes

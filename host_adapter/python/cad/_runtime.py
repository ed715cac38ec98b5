"""Older names of the default context's state, kept for code written before cad.Context (bench/ and programs
that read them). New code uses cad.context() (the default cad.Context) and its methods; these names are views of
it: `_settings` is its settings dict, `_locals` its local backends, `existing`/`runtime` its stacks by lane."""
from . import _api, _context, _settings as _settings_module
from ._context import MAX_LANES, device_key as _key  # noqa: F401 -- older names

init, shutdown, stack_config = _api.init, _api.shutdown, _api.stack_config
_DEFAULTS = dict(_settings_module.DEFAULTS)


def existing(device, lane=0):
    """The default context's CAD stack for `device` and `lane` if one is up (None otherwise); makes nothing."""
    return _context.default().lane(lane).existing(device)


def runtime(device, lane=0):
    """The default context's CAD stack for `device` and `lane`, made on first use (collective)."""
    return _context.default().lane(lane).stack(device)


def local_backend(device):
    return _context.default().local_backend(device)


def __getattr__(name):
    if name == "_settings":
        return _context.default()._settings
    if name == "_locals":
        return _context.default()._locals
    raise AttributeError(f"module 'cad._runtime' has no attribute {name!r}")

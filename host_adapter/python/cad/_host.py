"""One libcad_host stack (cad_host_create with a JSON config) and calls into its attention instance.

Every call that fails raises CadError with the plugin's own message (its last_error), the ABI status name,
and, when a lent collective failed, what torch.distributed said.
"""
import ctypes as C
import json
import os
import sys
import threading

from . import _abi
from ._collectives import Collectives
from ._errors import CadError
from ._lib import lib, status_name

_LEVELS = {0: "trace", 1: "debug", 2: "info", 3: "warn", 4: "error"}


def _log_line(user, level, source, message):
    try:
        print(f"[cad {_LEVELS.get(level, level)}] {source.decode(errors='replace')}: "
              f"{message.decode(errors='replace')}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 -- a lost log line is the lesser evil
        pass


_LOG_FN = _abi.LogFn(_log_line)


# The plugins' CUDA memory comes from PyTorch's caching allocator (options.device_allocate/device_free), so
# one pool serves the GPU: with the host's own cudaMallocAsync beside it, torch keeps its freed blocks cached
# and CAD's allocations fail although torch holds plenty of free memory. Called from any thread of a plugin.
def _torch_allocate(user, device_id, size, stream, out):
    try:
        import torch
        try:
            out[0] = torch.cuda.caching_allocator_alloc(size, device=device_id, stream=stream or 0)
            return _abi.OK
        except torch.cuda.OutOfMemoryError as exc:
            status, error = _abi.OUT_OF_MEMORY, exc
    except Exception as exc:  # noqa: BLE001 -- nothing may cross the C boundary
        status, error = _abi.DEVICE_ERROR, exc
    _log_line(None, 4, b"host", f"torch.cuda.caching_allocator_alloc({size}, device={device_id}) failed: "
                                f"{type(error).__name__}: {error}".encode(errors="replace"))
    return status


def _torch_free(user, device_id, ptr, size, stream):
    try:
        import torch
        torch.cuda.caching_allocator_delete(ptr)
    except Exception as exc:  # noqa: BLE001 -- nothing may cross the C boundary
        _log_line(None, 4, b"host", f"torch.cuda.caching_allocator_delete of {size} bytes on device {device_id} "
                                    f"failed: {type(exc).__name__}: {exc}".encode(errors="replace"))


_TORCH_ALLOCATE_FN = _abi.DeviceAllocateFn(_torch_allocate)
_TORCH_FREE_FN = _abi.DeviceFreeFn(_torch_free)


def torch_allocator_wanted():
    """Whether a new Host lends PyTorch's caching allocator: torch with CUDA, unless CAD_TORCH_ALLOCATOR=0."""
    if os.environ.get("CAD_TORCH_ALLOCATOR", "").strip() == "0":
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 -- no usable torch: the host keeps cudaMallocAsync
        return False


class Host:
    """A cad host made from `config` (a dict), with torch.distributed lent when `collectives` is given."""

    def __init__(self, config, attention, collectives=None, search_path=None):
        self.config = config
        self.collectives = collectives
        self.releases = []
        self._releases_lock = threading.Lock()  # plans made ahead register their release from the planning thread
        self.planner = None  # _planner.Planner, made by the stack's first plan ahead (Context.planner)
        self._lib = lib()
        self._handle = C.c_void_p()
        text = json.dumps(config).encode()
        options = _abi.HostOptions()
        options.struct_size = C.sizeof(options)
        options.config_json = text
        options.search_path = search_path.encode() if search_path else None
        options.log_callback = _LOG_FN
        self.torch_allocator = torch_allocator_wanted()
        if self.torch_allocator:
            options.device_allocate = _TORCH_ALLOCATE_FN
            options.device_free = _TORCH_FREE_FN
        if collectives is not None:
            collectives.lend(options)
        error = C.create_string_buffer(4096)
        status = self._lib.cad_host_create(C.byref(options), C.byref(self._handle), error, len(error))
        if status != _abi.OK:
            self._handle = None
            raise CadError(self._with_cause(f"cad: creating the plugin stack failed ({status_name(status)}): "
                                            f"{error.value.decode(errors='replace')}"), status_name(status))
        table, instance = C.c_void_p(), C.c_void_p()
        status = self._lib.cad_host_find_instance(self._handle, attention.encode(), _abi.KIND_ATTENTION,
                                                  C.byref(table), C.byref(instance))
        if status != _abi.OK:
            self.close()
            raise CadError(f"cad: the config has no attention instance named '{attention}'", status_name(status))
        self.table = C.cast(table, C.POINTER(_abi.AttentionTable)).contents
        if self.table.struct_size < C.sizeof(_abi.AttentionTable):
            self.close()
            raise CadError(f"cad: attention instance '{attention}' predates ABI v1.1 (no plans); rebuild its plugin")
        self.instance = instance
        self.name = attention

    @property
    def closed(self):
        return not getattr(self, "_handle", None)

    def close(self):
        if getattr(self, "_handle", None):
            # The planning thread first: queued plans fail, the one being made finishes (bounded by timeouts).
            if self.planner is not None and not self.planner.close():
                _log_line(None, 4, b"cad", b"the planning thread is still inside a collective make_plan after its "
                          b"timeouts; the CAD stack is left undestroyed rather than freed under it")
                self._handle = None
                return
            # Plans and saved states still held by Python objects go back before their instance does; the
            # Python objects see `closed` and refuse to be used afterwards (cad.Plan.check_usable).
            with self._releases_lock:
                releases, self.releases = list(self.releases), []
            for release in releases:
                release()
            self._lib.cad_host_destroy(self._handle)
            self._handle = None
            if self.collectives is not None:
                self.collectives.close()  # after the plugins that called into its groups are gone

    def owns(self, finalizer):
        """Run this weakref.finalize (a plan's or a saved state's release) at close() if it has not run."""
        with self._releases_lock:
            self.releases = [f for f in self.releases if f.alive] + [finalizer]

    def __del__(self):
        self.close()

    # ---- calls ---------------------------------------------------------------------------------------
    def _with_cause(self, message):
        exc = self.collectives.last_exception if self.collectives is not None else None
        if exc is not None:
            self.collectives.last_exception = None
            if str(exc) not in message:  # the plugin usually carries it already (the callback's error text)
                message += f" [torch.distributed: {type(exc).__name__}: {exc}]"
        return message

    def check(self, status, what):
        if status == _abi.OK:
            return
        detail = self.table.last_error(self.instance)
        detail = detail.decode(errors="replace") if detail else "(no message)"
        raise CadError(self._with_cause(f"cad {what} ({status_name(status)}): {detail}"), status_name(status))

    def capabilities(self):
        caps = _abi.Capabilities()
        caps.struct_size = C.sizeof(caps)
        self.check(self.table.get_capabilities(self.instance, C.byref(caps)), "get_capabilities")
        return caps

    def make_plan(self, args):
        plan = C.c_void_p()
        self.check(self.table.make_plan(self.instance, C.byref(args), C.byref(plan)), "make_plan")
        return plan.value

    def release_plan(self, plan):
        if plan and self._handle:
            self.table.release_plan(self.instance, C.c_void_p(plan))

    def release_saved(self, saved):
        if saved and self._handle:
            self.table.release_saved(self.instance, C.c_void_p(saved))

    def forward(self, args):
        self.check(self.table.forward(self.instance, C.byref(args)), "forward")

    def backward(self, args):
        self.check(self.table.backward(self.instance, C.byref(args)), "backward")

    def stats(self):
        """The instance's get_stats_json as a dict ({} if it has none)."""
        if not self.table.get_stats_json:
            return {}
        needed = C.c_size_t(0)
        self.table.get_stats_json(self.instance, None, 0, C.byref(needed))
        # The statistics may grow between the size query and the read (exchanges completing on the GPU, a plan
        # made ahead on the planning thread): room to spare, and a retry with the new size if even that is short.
        for _ in range(4):
            buffer = C.create_string_buffer(needed.value + 4096)
            status = self.table.get_stats_json(self.instance, buffer, len(buffer), C.byref(needed))
            if status == _abi.OK or needed.value < len(buffer):
                break
        self.check(status, "get_stats_json")
        return json.loads(buffer.value.decode() or "{}")

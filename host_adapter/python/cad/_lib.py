"""Loading libcad_host and calling its C API through ctypes.

The library is found, in order, at $CAD_HOST_LIBRARY (a path to libcad_host.so, e.g. a build tree's
build/lib/libcad_host.so), then inside this package (lib/libcad_host.so, where `pip install .` puts it).

The host searches plugins, in order, in the search path the caller passes, on $CAD_PLUGIN_PATH, and in the
plugin directory next to the libcad_host.so it loaded (here: this package's lib/cad/plugins). The package's
libcad_host has no other directory compiled in (host_adapter/CMakeLists.txt, CAD_PYTHON_PACKAGE): pip builds it
under a temporary, world-writable /tmp directory, which must never be searched. A libcad_host named by
$CAD_HOST_LIBRARY is a build tree's and also searches that tree's plugin directory.
"""
import ctypes as C
import os
import pathlib

from . import _abi
from ._errors import CadError

_lib = None


def library_path():
    env = os.environ.get("CAD_HOST_LIBRARY")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parent / "lib" / "libcad_host.so"


def lib():
    """The loaded libcad_host, with the signatures the package uses declared."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise CadError(f"cad: libcad_host not found at {path}: install the package with `pip install .` from the "
                       "repository root, or set CAD_HOST_LIBRARY to a built libcad_host.so")
    # No forked probe of each plugin file at load (cad_host.h, cad_library_open): a trainer process holds GPU
    # mappings and NCCL/torch threads, where fork is slow and unsafe. The CLI tools probe plugins instead.
    os.environ.setdefault("CAD_PLUGIN_PROBE", "0")
    lib_ = C.CDLL(str(path), mode=C.RTLD_LOCAL)
    lib_.cad_host_create.argtypes = [C.POINTER(_abi.HostOptions), C.POINTER(C.c_void_p), C.c_char_p, C.c_size_t]
    lib_.cad_host_create.restype = _abi.c_status
    lib_.cad_host_destroy.argtypes = [C.c_void_p]
    lib_.cad_host_destroy.restype = None
    lib_.cad_host_find_instance.argtypes = [C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_void_p),
                                            C.POINTER(C.c_void_p)]
    lib_.cad_host_find_instance.restype = _abi.c_status
    lib_.cad_host_attention.argtypes = [C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(C.c_void_p)]
    lib_.cad_host_attention.restype = _abi.c_status
    _lib = lib_
    return _lib


def status_name(status):
    return _abi.STATUS_NAMES.get(status, f"status {status}")

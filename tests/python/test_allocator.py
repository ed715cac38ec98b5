"""A cad Host lends PyTorch's caching allocator for its plugins' CUDA memory (options.device_allocate /
device_free), unless CAD_TORCH_ALLOCATOR=0. On CPU with torch's functions replaced by fakes (the host never
touches the fake addresses), and on a GPU, when there is one, with the real allocator."""
import ctypes as C

import pytest
import torch

from cad import _abi
from cad._host import Host

# The reference plugin: a stack that allocates nothing itself, so every allocation seen is the test's own.
CONFIG = {"log_level": "warn", "instances": [{"name": "local", "plugin": "reference", "config": {}}],
          "attention": "local"}
STREAM = 0x5150  # a raw stream handle as the plugins pass it; the fakes only compare it


class Services(C.Structure):
    """The head of cad_host_services_v1_t (plugin_api/cad_common_v1.h), up to free."""
    _fields_ = [("struct_size", C.c_size_t), ("abi_major", C.c_uint32), ("abi_minor", C.c_uint32),
                ("host_ctx", C.c_void_p), ("log_level", C.c_int32), ("log", C.c_void_p),
                ("allocate", C.CFUNCTYPE(_abi.c_status, C.c_void_p, _abi.Device, C.c_size_t, C.c_void_p,
                                         C.POINTER(C.c_void_p))),
                ("free", C.CFUNCTYPE(None, C.c_void_p, _abi.Device, C.c_void_p, C.c_void_p))]


class HostMemory:
    """cad_host_services(host)'s allocate and free, for CUDA device `device_id`."""

    def __init__(self, host):
        host._lib.cad_host_services.argtypes = [C.c_void_p]
        host._lib.cad_host_services.restype = C.POINTER(Services)
        self.services = host._lib.cad_host_services(host._handle).contents

    def allocate(self, device_id, size, stream=None):
        out = C.c_void_p()
        status = self.services.allocate(self.services.host_ctx, _abi.Device(_abi.DEVICE_CUDA, device_id), size,
                                        stream, C.byref(out))
        return status, out.value

    def free(self, device_id, ptr, stream=None):
        self.services.free(self.services.host_ctx, _abi.Device(_abi.DEVICE_CUDA, device_id), ptr, stream)


class FakeTorch:
    """torch.cuda as the Host sees it on a GPU machine, with an allocator that records its calls."""

    def __init__(self, monkeypatch, raises=None):
        self.allocs, self.deletes, self.raises = [], [], raises
        monkeypatch.delenv("CAD_TORCH_ALLOCATOR", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", self.alloc)
        monkeypatch.setattr(torch.cuda, "caching_allocator_delete", self.delete)

    def alloc(self, size, device=None, stream=None):
        self.allocs.append((size, device, stream))
        if self.raises is not None:
            raise self.raises
        return 0x7F0000000000 + 0x100000 * len(self.allocs)  # 256-aligned, never dereferenced

    def delete(self, ptr):
        self.deletes.append(ptr)


def test_host_lends_torch_caching_allocator(monkeypatch):
    fake = FakeTorch(monkeypatch)
    host = Host(CONFIG, "local")
    try:
        assert host.torch_allocator
        memory = HostMemory(host)
        status, ptr = memory.allocate(1, 1000, STREAM)
        assert status == _abi.OK
        assert fake.allocs == [(1000, 1, STREAM)] and ptr == 0x7F0000100000
        memory.free(1, ptr, STREAM)
        assert fake.deletes == [ptr]
        status, ptr = memory.allocate(0, 64)  # a NULL stream is torch's stream 0
        assert status == _abi.OK and fake.allocs[-1] == (64, 0, 0)
        leaked = ptr
    finally:
        host.close()
    assert fake.deletes[-1] == leaked, "a block the plugins leaked goes back to torch at close"


@pytest.mark.parametrize("raises,status", [(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"),
                                            _abi.OUT_OF_MEMORY),
                                           (RuntimeError("CUDA error: invalid device ordinal"), _abi.DEVICE_ERROR)])
def test_torch_failure_is_a_status_and_a_log_line(monkeypatch, capsys, raises, status):
    fake = FakeTorch(monkeypatch, raises=raises)
    host = Host(CONFIG, "local")
    try:
        got, ptr = HostMemory(host).allocate(3, 4096, STREAM)
    finally:
        host.close()
    assert (got, ptr) == (status, None) and fake.allocs == [(4096, 3, STREAM)] and fake.deletes == []
    err = capsys.readouterr().err
    assert f"[cad error] host: torch.cuda.caching_allocator_alloc(4096, device=3) failed: " \
           f"{type(raises).__name__}: {raises}" in err
    assert "refused 4096 bytes on CUDA device 3" in err  # the host's own line


def test_cad_torch_allocator_0_keeps_the_hosts_allocator(monkeypatch):
    fake = FakeTorch(monkeypatch)
    monkeypatch.setenv("CAD_TORCH_ALLOCATOR", "0")
    host = Host(CONFIG, "local")
    try:
        assert not host.torch_allocator
        memory = HostMemory(host)
        status, ptr = memory.allocate(0, 1000)
        if status == _abi.OK:  # a real GPU: cudaMallocAsync served it
            memory.free(0, ptr)
    finally:
        host.close()
    assert fake.allocs == [] and fake.deletes == []


def test_no_cuda_no_torch_allocator(monkeypatch):
    monkeypatch.delenv("CAD_TORCH_ALLOCATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    host = Host(CONFIG, "local")
    try:
        assert not host.torch_allocator
    finally:
        host.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_allocations_come_from_torchs_pool(monkeypatch):
    monkeypatch.delenv("CAD_TORCH_ALLOCATOR", raising=False)
    device = torch.cuda.current_device()
    stream = torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    host = Host(CONFIG, "local")
    try:
        assert host.torch_allocator
        memory = HostMemory(host)
        status, ptr = memory.allocate(device, 3 << 20, stream.cuda_stream)
        assert status == _abi.OK and ptr % 256 == 0
        assert torch.cuda.memory_allocated(device) - before >= 3 << 20, "the block is torch's"
        memory.free(device, ptr, stream.cuda_stream)
        assert torch.cuda.memory_allocated(device) == before
        status, ptr = memory.allocate(device, 1 << 20)  # NULL stream, then leaked
        assert status == _abi.OK and torch.cuda.memory_allocated(device) - before >= 1 << 20
    finally:
        host.close()
    assert torch.cuda.memory_allocated(device) == before, "the leak went back to torch at close"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("torch_allocator", ["1", "0"])
def test_gpu_memory_cached_by_torch_serves_cad(monkeypatch, torch_allocator):
    """The failure this allocator is for: torch's cache holds the GPU's free memory, and only a host that
    allocates from that cache gets any."""
    monkeypatch.setenv("CAD_TORCH_ALLOCATOR", torch_allocator)
    device = torch.cuda.current_device()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    filler = torch.empty(free - (256 << 20), dtype=torch.uint8, device=device)
    del filler  # freed, but kept reserved in torch's cache
    host = Host(CONFIG, "local")
    try:
        memory = HostMemory(host)
        status, ptr = memory.allocate(device, 2 << 30)
        if status == _abi.OK:
            memory.free(device, ptr)
    finally:
        host.close()
        torch.cuda.empty_cache()
    assert status == (_abi.OK if torch_allocator == "1" else _abi.OUT_OF_MEMORY)

"""The installed wheel on the CPU, run with the virtual environment's python from outside the source tree
(tests/wheel/check_wheel.sh): the package imports from the environment, finds libcad_host and its plugins inside
itself (CAD_HOST_LIBRARY and CAD_PLUGIN_PATH must be unset), and CAD on 2 gloo ranks gives local attention's
O, dQ, dK, dV, which match torch's scaled_dot_product_attention per document. Every library the package loads
(libcad_host, the plugins, the runtime libraries it bundles) must come from inside it. Exit status 0 only on
success; any failure raises.

  python smoke.py            # the package checks, then the two ranks (children of this process)
  python smoke.py --rank R --world W --port P   # one rank (what the parent starts)
  python smoke.py --gpu      # on a GPU (tests/wheel/gpu_check.sh): the CUDA plugins in the package, local bf16
                             # attention through the "cuda" backend against sdpa, loaded from the package
"""
import argparse
import os
import pathlib
import subprocess
import sys

WORLD = 2
TIMEOUT_S = 120
# Per rank, unequal documents: the balanced plan moves work from rank 0 to rank 1.
LENGTHS = [[300, 20, 5], [7, 9, 33]]
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
# The plugins the CPU stack of the package uses: CAD, its "host" communicator (torch.distributed lent through
# the ABI), the CPU reference backend and the balancers.
NEEDED_PLUGINS = ("cad_cad.so", "cad_host.so", "cad_reference.so", "cad_prefix_aware.so", "cad_colocated.so")


def package_dir():
    import cad
    return pathlib.Path(cad.__file__).resolve().parent


def check_package(needed=NEEDED_PLUGINS):
    for name in ("CAD_HOST_LIBRARY", "CAD_PLUGIN_PATH"):
        if os.environ.get(name):
            raise SystemExit(f"smoke.py: {name} is set ({os.environ[name]}); the wheel must work without it")
    package = package_dir()
    prefix = pathlib.Path(sys.prefix).resolve()
    if prefix not in package.parents:
        raise AssertionError(f"cad imported from {package}, not from the environment {prefix}")
    from cad import _lib
    library = _lib.library_path().resolve()
    if library != package / "lib" / "libcad_host.so" or not library.is_file():
        raise AssertionError(f"libcad_host: {library}, expected the package's {package / 'lib' / 'libcad_host.so'}")
    plugins = sorted(p.name for p in (package / "lib" / "cad" / "plugins").glob("cad_*.so"))
    missing = [p for p in needed if p not in plugins]
    if missing:
        raise AssertionError(f"plugins {missing} missing from the package ({plugins})")
    # The trainers' parts ship as the subpackage cad.train, beside the rest of the package.
    from cad.train import recipe
    if pathlib.Path(recipe.__file__).resolve().parent != package / "train":
        raise AssertionError(f"cad.train.recipe from {recipe.__file__}, not from {package / 'train'}")
    print(f"package {package}: libcad_host and {len(plugins)} plugins ({', '.join(plugins)}), cad.train", flush=True)


def sdpa_varlen(q, k, v, cu):
    """O of causal attention per document with torch's own kernel (GQA by repeating the KV heads)."""
    import torch
    import torch.nn.functional as F
    group = q.shape[1] // k.shape[1]
    out = []
    for b, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qd = q[b:e].transpose(0, 1)
        kd = k[b:e].repeat_interleave(group, dim=1).transpose(0, 1)
        vd = v[b:e].repeat_interleave(group, dim=1).transpose(0, 1)
        out.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True).transpose(0, 1))
    return torch.cat(out)


def loaded_libraries():
    """Paths of the shared objects mapped into this process."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and ".so" in fields[5]:
                paths.add(pathlib.Path(fields[5]).resolve())
    return paths


def check_loaded_from_package(rank, needed=("libcad_host.so", "cad_cad.so", "cad_host.so", "cad_reference.so")):
    package = package_dir()
    mapped = loaded_libraries()
    ours = [p for p in mapped if p.name.startswith(("cad_", "libcad_host"))]
    outside = [str(p) for p in ours if package not in p.parents]
    if outside:
        raise AssertionError(f"rank {rank}: CAD libraries loaded from outside the package: {outside}")
    names = {p.name for p in ours}
    for name in needed:
        if name not in names:
            raise AssertionError(f"rank {rank}: {name} is not loaded (loaded: {sorted(names)})")
    # The runtime libraries the package bundles (cmake/CadPackage.cmake) are the package's copies. The CUDA
    # runtime is the exception: where PyTorch loaded one of the same name first, the loader reuses that one.
    bundled = {p.name for p in (package / "lib").glob("lib*.so.*") if not p.name.startswith("libcudart")}
    elsewhere = [str(p) for p in mapped if p.name in bundled and package not in p.parents]
    if elsewhere:
        raise AssertionError(f"rank {rank}: bundled libraries loaded from the system instead: {elsewhere}")


def run_rank(rank, world, port):
    import datetime
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    import cad
    try:
        cad.init(balancer="prefix_aware", timeout_ms=20000)
        lengths = LENGTHS[rank]
        g = torch.Generator().manual_seed(rank)
        tokens = sum(lengths)
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        q = torch.randn(tokens, HEADS, HEAD_DIM, generator=g)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=g)
        v = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=g)
        d_o = torch.randn(q.shape, generator=g)
        plan = cad.plan(cu)
        results = {}
        for name, fn in (("local", lambda q, k, v: cad.varlen_attn(q, k, v, cu)),
                         ("cad", lambda q, k, v: cad.varlen_attn(q, k, v, cu, plan=plan)),
                         ("sdpa", lambda q, k, v: sdpa_varlen(q, k, v, cu))):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            o = fn(*leaves)
            o.backward(d_o)
            results[name] = [o.detach()] + [t.grad for t in leaves]
        for other in ("cad", "sdpa"):
            for label, a, b in zip(("O", "dQ", "dK", "dV"), results[other], results["local"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5,
                                           msg=lambda m: f"rank {rank}: {other} {label} vs local: {m}")
        stats = plan.stats
        if stats is None or len(stats["servers"]) != world:
            raise AssertionError(f"rank {rank}: the plan's stats do not describe {world} servers: {stats}")
        check_loaded_from_package(rank)
        if rank == 0:
            print(f"{world} gloo ranks: CAD (prefix_aware, imbalance {stats['imbalance']:.3f}) = local = sdpa "
                  f"for O, dQ, dK, dV; every CAD library loaded from the package", flush=True)
    finally:
        cad.shutdown()
        dist.barrier()
        dist.destroy_process_group()


def run_gpu():
    import torch
    import cad
    check_package(NEEDED_PLUGINS + ("cad_cuda.so", "cad_nccl.so"))
    if not torch.cuda.is_available():
        raise SystemExit("smoke.py --gpu: no GPU visible to torch")
    g = torch.Generator().manual_seed(0)
    lengths = [700, 33, 1, 290]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), h, 64, generator=g) for h in (8, 2, 2))
    d_o = torch.randn(q.shape, generator=g)
    results = []
    for dtype, fn in ((torch.bfloat16, lambda q, k, v: cad.varlen_attn(q, k, v, cu.cuda())),
                      (torch.float32, lambda q, k, v: sdpa_varlen(q, k, v, cu))):
        leaves = [t.to("cuda", dtype).requires_grad_() for t in (q, k, v)]
        o = fn(*leaves)
        o.backward(d_o.to("cuda", dtype))
        results.append([o.detach().float()] + [t.grad.float() for t in leaves])
    for label, a, b in zip(("O", "dQ", "dK", "dV"), *results):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=lambda m: f"cuda {label} vs sdpa: {m}")
    check_loaded_from_package(0, ("libcad_host.so", "cad_cuda.so"))
    print(f"{torch.cuda.get_device_name()}: local bf16 attention through the package's cuda backend = sdpa "
          f"(O, dQ, dK, dV); loaded from the package", flush=True)


def run_ranks():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(WORLD), "--port", str(port)])
             for r in range(WORLD)]
    failed = []
    for r, p in enumerate(ranks):
        try:
            if p.wait(timeout=TIMEOUT_S) != 0:
                failed.append(f"rank {r} exited {p.returncode}")
        except subprocess.TimeoutExpired:
            failed.append(f"rank {r} did not finish within {TIMEOUT_S} s")
    for p in ranks:
        if p.poll() is None:
            p.kill()
            p.wait()
    if failed:
        raise AssertionError("; ".join(failed))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int, default=WORLD)
    parser.add_argument("--port", type=int)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    if args.gpu:
        run_gpu()
        print("wheel GPU smoke test passed")
        return
    if args.rank is not None:
        if args.port is None:
            parser.error("--rank needs --port")
        run_rank(args.rank, args.world, args.port)
        return
    check_package()
    run_ranks()
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()

"""Under mpirun (no torch.distributed): CAD over the "mpi" communicator from Python, against torch sdpa per
document, forward and backward. Run: mpirun -np N python3 tests/python/mpi_check.py. Exit status 0 on success.
With CAD_TEST_DEVICE=cuda: bf16 CUDA tensors, every process on GPU 0, host-staged over MPI."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import cad  # noqa: E402
from reference import random_batch, sdpa_varlen  # noqa: E402

LENGTHS = [[40, 3, 1], [5, 6, 7, 8], [1, 29], [17]]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
cad.init(communicator="mpi", timeout_ms=30000)
cuda = os.environ.get("CAD_TEST_DEVICE") == "cuda"
q, k, v, cu = random_batch(LENGTHS[rank % len(LENGTHS)], 4, 2, 64 if cuda else 16, seed=rank)
if cuda:
    q, k, v = (t.bfloat16().float() for t in (q, k, v))  # the reference sees the same rounded inputs
plan = cad.plan(cu.cuda() if cuda else cu)
results = []
for fn in (lambda a, b, c: cad.varlen_attn(a, b, c, plan.cu_seqlens, plan=plan),
           lambda a, b, c: sdpa_varlen(a, b, c, cu, True)):
    on_gpu = cuda and not results
    leaves = [(t.cuda().bfloat16() if on_gpu else t.clone()).requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(torch.ones_like(o))
    results.append([x.float().cpu() for x in [o.detach()] + [t.grad for t in leaves]])
tol = dict(rtol=2e-2, atol=2e-2) if cuda else dict(rtol=1e-5, atol=2e-5)
for name, a, b in zip(("o", "dq", "dk", "dv"), *results):
    torch.testing.assert_close(a, b, **tol, msg=lambda m: f"rank {rank} {name}: {m}")
assert len(plan.stats["servers"]) == int(os.environ["OMPI_COMM_WORLD_SIZE"])
print(f"rank {rank}: CAD over mpi matches sdpa (imbalance {plan.stats['imbalance']:.3f})", flush=True)
cad.shutdown()

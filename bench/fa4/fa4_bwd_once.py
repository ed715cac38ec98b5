"""fa4_bwd_once.py -- FA4's forward and backward (cad.fa4.varlen_attn) on one dense causal document of 16K tokens,
Hq 32, Hkv 8, D 128, bf16, three times: the workload bench/fa4/ncu_bwd_vs_fa4.sh profiles (the first call compiles,
ncu skips it). Exits non-zero if FA4 is not available.
"""
import sys

import torch

import cad.fa4


def main():
    ok, why = cad.fa4.available()
    if not ok:
        print(f"FA4 not available: {why}", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    t, hq, hkv, d = 16384, 32, 8, 128
    q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, t], device="cuda", dtype=torch.int32)
    d_o = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        o = cad.fa4.varlen_attn(q, k, v, cu, t, causal=True)
        o.backward(d_o)
    torch.cuda.synchronize()
    print("fa4 backward: 3 calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

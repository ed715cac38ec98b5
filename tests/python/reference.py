"""The oracle the tests compare against: torch's scaled_dot_product_attention, one document at a time."""
import torch
import torch.nn.functional as F


def sdpa_varlen(q, k, v, cu_seqlens, causal, scale=None):
    """O [T, Hq, D] of varlen attention, document by document (GQA by repeating KV heads)."""
    groups = q.shape[1] // k.shape[1]
    out = []
    cu = cu_seqlens.tolist()
    for a, b in zip(cu, cu[1:]):
        if b == a:
            continue
        qd = q[a:b].transpose(0, 1)
        kd = k[a:b].repeat_interleave(groups, dim=1).transpose(0, 1)
        vd = v[a:b].repeat_interleave(groups, dim=1).transpose(0, 1)
        out.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale).transpose(0, 1))
    return torch.cat(out) if out else q.new_zeros(q.shape)


def random_batch(lengths, num_heads, num_kv_heads, head_dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(t, num_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(t, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(t, num_kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v, cu

"""The oracle the tests compare against: torch's scaled_dot_product_attention, one document at a time."""
import torch
import torch.nn.functional as F


def _per_document(q, k, v, cu_seqlens, attend):
    """O [T, Hq, D]: attend(qd, kd, vd, length) ([H, L, D] each, K/V heads repeated for GQA) per non-empty
    document of cu_seqlens."""
    groups = q.shape[1] // k.shape[1]
    out = []
    cu = cu_seqlens.tolist()
    for a, b in zip(cu, cu[1:]):
        if b == a:
            continue
        qd = q[a:b].transpose(0, 1)
        kd = k[a:b].repeat_interleave(groups, dim=1).transpose(0, 1)
        vd = v[a:b].repeat_interleave(groups, dim=1).transpose(0, 1)
        out.append(attend(qd, kd, vd, b - a).transpose(0, 1))
    return torch.cat(out) if out else q.new_zeros(q.shape)


def sdpa_varlen(q, k, v, cu_seqlens, causal, scale=None):
    """O [T, Hq, D] of varlen attention, document by document (GQA by repeating KV heads)."""
    return _per_document(q, k, v, cu_seqlens, lambda qd, kd, vd, _: F.scaled_dot_product_attention(
        qd, kd, vd, is_causal=causal, scale=scale))


def window_mask(length, causal, window_size):
    """[length, length] bool mask, True where query i may see key j: PyTorch's window_size (left, right),
    -1 = no limit, built key by key (a dense mask shares nothing with the backends' range arithmetic)."""
    left, right = window_size
    i = torch.arange(length).unsqueeze(1)
    j = torch.arange(length).unsqueeze(0)
    allowed = torch.ones(length, length, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    return allowed


def sdpa_varlen_window(q, k, v, cu_seqlens, causal, window_size, scale=None):
    """sdpa_varlen with an explicit per-document window mask."""
    return _per_document(q, k, v, cu_seqlens, lambda qd, kd, vd, length: F.scaled_dot_product_attention(
        qd, kd, vd, attn_mask=window_mask(length, causal, window_size), scale=scale))


def random_batch(lengths, num_heads, num_kv_heads, head_dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(t, num_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(t, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(t, num_kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v, cu

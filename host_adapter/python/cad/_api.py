"""The package's functions: a thin facade over the default cad.Context (_context.default()).

A program that drives one group calls cad.init / cad.plan / cad.shutdown and never names a context; each is the
default context's method of the same name (cad.init is Context.configure, cad.shutdown closes it and forgets the
settings). A program that drives several groups makes a cad.Context per group and calls its methods.
"""
from . import _context, _settings


def context():
    """The default context (what the functions of this module act on)."""
    return _context.default()


def init(config=None, *, communicator=None, balancer="prefix_aware", keep_forward_tensors="auto", min_shard_tokens=0,
         timeout_ms=60000, group=None, log_level="warn", comm_stream_priority="highest", nccl_max_ctas=0,
         nccl_blocking_comm=False, nccl_copy_engines=False, balancer_config=None, own_tasks_in_place=False,
         own_tasks_reserve_sms=16, forward_walk="static", head_groups=1, memory_cap_bytes=0,
         server_backend="default"):
    """Choose how the default context builds its CAD stacks (call before the first plan; gives back the stacks made
    with older settings: plans made before are refused afterwards). cad.Context(group, ...) takes the same settings.

    config: a full stack config (dict, JSON file path) whose "attention" names the CAD instance; the other
    arguments then do not apply. communicator: "host" (torch.distributed/gloo, CPU memory), "mpi" (under
    mpirun) or "nccl" (CUDA; bootstrapped through torch.distributed). balancer: "colocated", "per_doc_cp",
    "distca", "prefix_aware". balancer_config: that balancer's config keys (docs/balancers.md), e.g.
    {"tolerance": 0.005} for prefix_aware: a plan within 0.5% of the mean instead of 2% (more bytes, better
    balance: where links are fast); None: the plugin's defaults. keep_forward_tensors: where a forward's
    Q/K/V/O/LSE wait for its backward --
    True: on the servers that computed it (the backward then moves only dO out and gradients back; the owner
    keeps no copy, but the servers' O is a second copy of the output), False: on the owners, as local attention
    keeps them (the backward re-sends them), "auto" (default): kept on the servers only for a forward that runs
    inside a backward -- a recomputed layer under activation checkpointing, whose state lives until that
    layer's backward a moment later --, re-sent otherwise, so that CAD holds no more than local attention.
    timeout_ms: every collective's deadline. group: the torch.distributed group CAD spans.
    comm_stream_priority: "highest" (default) or "normal", the priority of CAD's CUDA communication stream;
    nccl_max_ctas: at most this many CTAs (SMs) per NCCL operation of CAD's communicator (0: NCCL's default).
    Both matter where exchanges run beside compute (ping-pong): an exchange waiting for a late peer holds its
    SMs (plugins/cad/README.md, docs/nccl.md). nccl_blocking_comm: a blocking NCCL communicator for CAD (the
    nccl plugin's blocking_comm): its operations launch on the calling thread instead of a job thread of NCCL's
    own that the caller waits for (measured 2.4-5 ms per exchange under ping-pong, docs/multi_gpu.md), at the
    price of no deadline while an enqueue waits for a peer (docs/nccl.md). nccl_copy_engines: CAD's all-to-alls
    move through the GPUs' copy engines and CUDA IPC (the nccl plugin's copy_engines; every rank on one host, its
    GPUs reaching each other): no SM is used, so an exchange can run beside the persistent attention kernels that
    NCCL's kernels wait behind (head_groups). own_tasks_in_place: True: a rank runs
    the tasks on documents it holds whole in place on its own tensors, on GPUs while one collective moves the other
    rows; False (default): they go through the exchange to itself like every other task (the plugin's
    own_tasks_in_place, plugins/cad/README.md; measured no faster on 2 H200s, bench/results/trainer_h200x2_2026-11-27_{0a9366b,afdc6f0,c9c0322}).
    own_tasks_reserve_sms: on GPUs, the SMs their forward kernel (persistent, one block per SM) leaves free for the
    collective that runs beside it; 0: every SM. A second 'cuda' backend instance runs them, with that 'reserve_sms'
    and the dynamic walk (its blocks take the next untaken unit, so that those whose SM the collective holds at
    first take fewer). forward_walk: on GPUs, the walk of the server's forward kernel: "static" (default; each
    block a fixed share, what `cad simulate` models) or "dynamic" (the 'cuda' backend's forward_walk).
    head_groups: on GPUs over NCCL, each call's heads split into this many groups (a divisor of the model's query
    and key/value heads): the server computes group g while group g + 1's rows arrive and group g - 1's results
    leave, so that only the first group's inbound and the last group's outbound exchange are left exposed
    (the plugin's head_groups, plugins/cad/README.md); 1 (default): one exchange per tensor, unsplit.
    memory_cap_bytes: the most foreign Q/K/V/O bytes one server receives in a call (the balancers' memory cap:
    prefix_aware plans within it, the others refuse a plan over it, naming the server); 0 (default): none.
    server_backend: what computes the server batches: "default" (the project's kernel; the reference backend on the
    CPU), "fa4" (FlashAttention-4 through cad.fa4, where cad.server_backend.available says it can run) or "torch"
    (plain torch, fp32 math, any device): cad.server_backend. One per direction: {"forward": "default", "backward":
    "fa4"} or the string "default+fa4" (FORWARD+BACKWARD): our forward, FA4's backward given our O and LSE.
    """
    _context.default().configure(
        config, communicator=communicator, balancer=balancer, keep_forward_tensors=keep_forward_tensors,
        min_shard_tokens=min_shard_tokens, timeout_ms=timeout_ms, group=group, log_level=log_level,
        comm_stream_priority=comm_stream_priority, nccl_max_ctas=nccl_max_ctas, nccl_blocking_comm=nccl_blocking_comm,
        nccl_copy_engines=nccl_copy_engines, balancer_config=balancer_config, own_tasks_in_place=own_tasks_in_place,
        own_tasks_reserve_sms=own_tasks_reserve_sms, forward_walk=forward_walk, head_groups=head_groups,
        memory_cap_bytes=memory_cap_bytes, server_backend=server_backend)


def shutdown():
    """Destroy the default context's stacks (also done at exit) and forget cad.init's settings: a later stack is
    built from the defaults unless cad.init is called again (a failed or test-only cad.init must not outlive its
    user). Other contexts are closed by their own close()."""
    _context.default().configure()


def plan(cu_seqlens, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None, head_dim=None,
         dtype=None, device=None, ahead=False, tag=None, lane=0):
    return _context.default().plan(cu_seqlens, causal=causal, window_size=window_size, num_heads=num_heads,
                                   num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device,
                                   ahead=ahead, tag=tag, lane=lane)


def plan_pieces(pieces, *, causal=True, window_size=(-1, -1), num_heads=None, num_kv_heads=None, head_dim=None,
                dtype=None, device=None, ahead=False, tag=None, lane=0):
    return _context.default().plan_pieces(pieces, causal=causal, window_size=window_size, num_heads=num_heads,
                                          num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device,
                                          ahead=ahead, tag=tag, lane=lane)


# The facade's plans are the default context's: the same words as Context.plan / Context.plan_pieces.
plan.__doc__ = "The default context's plan (cad.context().plan). " + _context.Context.plan.__doc__
plan_pieces.__doc__ = "The default context's plan from pieces. " + _context.Context.plan_pieces.__doc__


def stack_config(device, settings=None):
    """The generated CAD stack config for `device`: the default context's, or the one `settings` (a full dict of
    cad.init's settings, e.g. dict(cad.context().settings, communicator="nccl")) describe."""
    if settings is None:
        return _context.default().stack_config(device)
    return _settings.stack_config(device, settings)


def attention_time(reset=True):
    """The default context's Context.attention_time (seconds in varlen_attn calls since the last reset)."""
    return _context.default().attention_time(reset)


def attention_calls():
    """The default context's Context.attention_calls."""
    return _context.default().attention_calls()


def timing(sync_cuda=False):
    """The default context's Context.timing: with sync_cuda, attention_time waits for CUDA work."""
    _context.default().timing(sync_cuda)


def exchange_times(device=None):
    """The default context's Context.exchange_times."""
    return _context.default().exchange_times(device)


def call_times(device=None):
    """The default context's Context.call_times."""
    return _context.default().call_times(device)

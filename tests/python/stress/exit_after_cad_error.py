"""One rank of a 2-rank gloo CAD job that hits a CadError, then exits (argv: scenario exit_mode); run by
exit_after_cad_error.sh. Env as torchrun sets it: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
import datetime, os, sys, time
import torch
import torch.distributed as dist

scenario, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
import cad
cad.init(timeout_ms=int(os.environ.get("T_MS", "3000")))
torch.manual_seed(rank)
lengths = [[40, 3, 1], [5, 6, 7, 8]][rank]
cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
t = sum(lengths)
hq = 2
q, k, v = (torch.randn(t, hq, 16) for _ in range(3))
plan = cad.plan(cu)
cad.varlen_attn(q, k, v, cu, plan=plan)  # one good call: the stack is up

def fail():
    if scenario == "heads":   # ranks disagree on head counts under a plan
        h = 2 if rank == 0 else 4
        qq, kk, vv = (torch.randn(t, h, 16) for _ in range(3))
        cad.varlen_attn(qq, kk, vv, cu, plan=cad.plan(cu))
    elif scenario == "scale":
        cad.varlen_attn(q, k, v, cu, plan=plan, softmax_scale=0.25 if rank == 0 else 0.5)
    elif scenario == "timeout":  # rank 1 never comes
        if rank == 0:
            cad.varlen_attn(q, k, v, cu, plan=plan)
        else:
            time.sleep(float(os.environ.get("SLEEP", "4")))
            raise cad.CadError("rank 1 pretends", "TIMEOUT")
    elif scenario == "after_shutdown":
        cad.shutdown()
        cad.varlen_attn(q, k, v, cu, plan=plan)
    elif scenario == "backward":  # rank 1 skips the backward: rank 0 times out inside autograd's backward
        qq = q.clone().requires_grad_()
        o = cad.varlen_attn(qq, k, v, cu, plan=plan)
        if rank == 0:
            o.sum().backward()
        else:
            time.sleep(float(os.environ.get("SLEEP", "4")))
            raise cad.CadError("rank 1 pretends", "TIMEOUT")
    raise SystemExit(f"scenario {scenario} raised nothing")

if mode == "uncaught":
    fail()
else:
    try:
        fail()
    except cad.CadError as e:
        print(f"rank {rank}: CadError: {str(e)[:200]}", file=sys.stderr)
    if mode == "sysexit":
        sys.exit(0)
    if mode == "clean":
        cad.shutdown(); dist.barrier(); dist.destroy_process_group()

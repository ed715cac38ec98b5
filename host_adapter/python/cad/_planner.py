"""Plans made ahead: a CAD stack's planning thread.

The documents of micro-batch i+1 are known when it is loaded, so its plan can be made while micro-batch i
computes. `cad.plan(cu_seqlens, ahead=True, ...)` hands the plan to this thread and returns at once; the first
call that uses the plan waits for it (usually it is long done). The thread runs make_plan, whose collectives go
over the stack's plan communicator (a gloo group of their own), never over the training stream or at a layer,
so a rank whose host is late delays only its own plan, not everybody's first layer.

Rules, checked rather than trusted:
  - every rank asks for the same plans in the same order. Before each make, the ranks exchange the plan's
    number in this stack and its `tag` (if the caller gives one, e.g. the micro-batch's index): a rank whose
    tag differs fails the plan on every rank, naming both ranks and tags. A rank that never asks fails the
    others' plan after the stack's timeout (TIMEOUT, naming the plan), never a hang.
  - after a failure the planning thread's collectives are in an unknown state: every later plan ahead on this
    stack fails with the first failure (make a new stack with cad.init()).
  - a plan whose owner dropped it before it was made is made anyway (the other ranks are making theirs) and
    released at once; cad.shutdown()/cad.init() fail the plans still queued, wait for the one being made (its
    collectives are bounded by the timeout) and only then destroy the stack.
"""
import queue
import threading
import time

import torch

from ._errors import CadError


def _cuda_index(device):
    """The CUDA device index a plan for `device` runs on (None off CUDA), resolved on the submitting thread."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


class Planner:
    """One stack's planning thread (started at the first plan ahead) and its queue."""

    def __init__(self, host, collectives, timeout_ms):
        self._host = host
        self._collectives = collectives
        self.timeout_s = timeout_ms / 1e3
        self._queue = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()
        self._next_number = 1
        self._failure = None  # the first failure: every later plan ahead fails with it
        self._closing = False

    @property
    def rank(self):
        return self._collectives.rank if self._collectives is not None else 0

    def submit(self, plan, args, shape, tag):
        """Queue plan's make (args: its filled PlanArgs). Returns the plan's number in this stack."""
        with self._lock:
            if self._closing:
                raise CadError(f"cad.plan(ahead=True): rank {self.rank}: the CAD stack is being closed "
                               f"(cad.init or cad.shutdown)", "INVALID_ARGUMENT")
            number = self._next_number
            self._next_number += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cad-planner", daemon=True)
                self._thread.start()
            # Under the lock: a job can never land behind close()'s end marker, where nothing would make it.
            self._queue.put((number, plan, args, shape, tag, _cuda_index(shape[4])))
        return number

    def close(self):
        """Fail what is queued, let the plan being made finish (bounded by its collectives' timeouts) and stop
        the thread. Returns False if the thread is still inside a make (the stack must then not be destroyed)."""
        with self._lock:
            self._closing = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is None:
            return True
        thread.join(timeout=3 * self.timeout_s + 5.0)  # make_plan makes three collectives, each bounded
        return not thread.is_alive()

    # ---- the thread -------------------------------------------------------------------------------------
    def _run(self):
        if self._collectives is not None:
            self._collectives.mark_planning_thread()
        while True:
            job = self._queue.get()
            if job is None:
                return
            number, plan, args, shape, tag, cuda_device = job
            job = None
            try:
                self._make(number, plan, args, shape, tag, cuda_device)
            except CadError as exc:
                self._fail(plan, exc)
            except Exception as exc:  # noqa: BLE001 -- reaches the waiting caller, never lost
                self._fail(plan, CadError(f"cad.plan(ahead=True): rank {self.rank}: plan #{plan.id}: "
                                          f"{type(exc).__name__}: {exc}", "INTERNAL"))
            finally:
                plan._ready.set()
                plan = args = None  # a plan its owner dropped goes here, on this thread

    def _make(self, number, plan, args, shape, tag, cuda_device):
        if self._closing:
            raise CadError(f"cad.plan(ahead=True): rank {self.rank}: plan #{plan.id} was not made: the CAD stack "
                           f"was closed (cad.init or cad.shutdown) first", "INVALID_ARGUMENT")
        if self._failure is not None:
            raise CadError(f"cad.plan(ahead=True): rank {self.rank}: plan #{plan.id} was not made: an earlier plan "
                           f"ahead failed, which leaves the planning collectives unusable: {self._failure}",
                           self._failure.status)
        self._check_same_plan(number, plan, tag)
        if cuda_device is not None:
            # A new thread's current CUDA device is 0. Make the plan's device current before the plugin runs:
            # CUDA calls on device 0 (or a guard restoring it) would open a context there from every rank's
            # process, 0.5 GiB of GPU 0 each (seen as out of memory on rank 0 with 4 GPUs).
            torch.cuda.set_device(cuda_device)
        start = time.perf_counter()
        handle = self._host.make_plan(args)
        plan._adopt(self._host, handle, shape, start)

    def _fail(self, plan, exc):
        if self._failure is None and "the CAD stack was closed" not in str(exc):
            self._failure = exc
        plan._error = exc

    def _check_same_plan(self, number, plan, tag):
        """Every rank is about to make its plan `number` with the same tag (one small gather on the planning
        group; a rank that never comes is a TIMEOUT after the stack's timeout)."""
        c = self._collectives
        if c is None or c.world == 1 or c.planning_group is None:
            return
        mine = torch.tensor([number, -1 if tag is None else int(tag), 0 if tag is None else 1], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(c.world)]
        try:
            torch.distributed.all_gather(everyone, mine, group=c.planning_group)
        except Exception as exc:  # noqa: BLE001
            described = f" (tag {tag})" if tag is not None else ""
            raise CadError(f"cad.plan(ahead=True): rank {c.rank} of {c.world}: plan number {number}{described} of "
                           f"this stack: the other ranks did not ask for a plan ahead within {self.timeout_s:g} s "
                           f"(every rank must ask for the same plans, in the same order): {type(exc).__name__}: "
                           f"{exc}", "TIMEOUT") from exc
        first = everyone[0].tolist()
        for rank, theirs in enumerate(t.tolist() for t in everyone):
            if theirs != first:
                def name(t):
                    return f"plan number {t[0]}" + (f" with tag {t[1]}" if t[2] else " without a tag")
                raise CadError(f"cad.plan(ahead=True): ranks ask for plans in different orders: rank 0 makes "
                               f"{name(first)} while rank {rank} makes {name(theirs)} (every rank must ask for the "
                               f"same plans, in the same order)", "INVALID_ARGUMENT")

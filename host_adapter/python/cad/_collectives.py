"""torch.distributed lent to libcad_host as ctypes callbacks: the bootstrap all-gather (how the NCCL plugin
gets its unique id without MPI) and the host collectives on CPU memory (ABI v1.1: the "host" communicator
forwards CAD's all_to_all_v / all_gather / barrier to them, so CAD on CPU runs under torchrun).

The collectives run on a gloo group of their own, created with the communicator's timeout: a peer that never
comes turns into a TIMEOUT status (and a CadError) instead of a hang. Plans made ahead (cad.plan(ahead=True))
run their collectives on the stack's planning thread, which gets a second gloo group: a group's collectives
must come in the same order on every rank, and the planning thread's would otherwise interleave with the
training thread's data exchanges (communicator "host") at random. A Python exception never crosses into C:
each callback catches it, writes its text into the caller's error buffer and returns a status.
"""
import ctypes as C
import datetime
import threading
import traceback

import torch
import torch.distributed as dist

from . import _abi
from ._errors import CadError


def _view(address, nbytes):
    """A uint8 tensor over C memory (no copy); empty for 0 bytes."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((C.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


def _failed(error, capacity, exc):
    timed_out = "timed out" in str(exc).lower() or "timeout" in str(exc).lower()
    _abi.write_message(error, capacity, f"{type(exc).__name__}: {exc}")
    return _abi.TIMEOUT if timed_out else _abi.COMMUNICATION


class Collectives:
    """The callbacks for one cad host: rank/world of `group` (or a world of one without torch.distributed)."""

    def __init__(self, group=None, timeout_ms=60000):
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed:
            self.rank = dist.get_rank(group)
            self.world = dist.get_world_size(group)
            ranks = None if group is None else dist.get_process_group_ranks(group)
            # Over the whole world: collective over the default group, every rank creates the cad host at the same
            # point. Over a part of it (e.g. one pipeline stage's data-parallel ranks, each stage a CAD stack of its
            # own), only that part's ranks come here, so they make their groups alone (use_local_synchronization):
            # otherwise torch names a group by a counter that every rank advances alike, disjoint groups made at
            # the same point get the same name and meet in the same store keys (gloo then wires ranks of different
            # groups together and hangs: seen with examples/train_pipeline.py --pool stage on 2 x 2 ranks); made
            # locally, a group's name comes from its ranks.
            part = ranks is not None and len(ranks) < dist.get_world_size()
            try:
                timeout = datetime.timedelta(milliseconds=timeout_ms)
                self.group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout,
                                            use_local_synchronization=part)
                self.planning_group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout,
                                                     use_local_synchronization=part)
            except Exception as exc:  # noqa: BLE001
                raise CadError(f"cad: rank {self.rank} of {self.world}: creating the gloo group for CAD's "
                               f"collectives failed (every rank of the group makes its CAD stack at its first "
                               f"plan): {type(exc).__name__}: {exc}", "TIMEOUT") from exc
        else:
            self.rank, self.world, self.group, self.planning_group = 0, 1, None, None
        self._thread = threading.local()  # .planning: this thread makes plans ahead; .last_exception
        # Keep the ctypes function objects alive as long as the host may call them.
        self.bootstrap_fn = _abi.BootstrapFn(self._bootstrap)
        self.all_to_all_v_fn = _abi.AllToAllVFn(self._all_to_all_v)
        self.all_gather_fn = _abi.AllGatherFn(self._all_gather)
        self.barrier_fn = _abi.BarrierFn(self._barrier)

    def close(self):
        """Destroy the two gloo groups made here (after the stack that used them is gone). Each holds gloo
        worker threads; a group nobody destroys is torn down with the interpreter, where gloo can end the process
        with "terminate called without an active exception" (pytorch/pytorch#190489; seen here after a CadError,
        3 of 53 runs). Local, not collective: a rank that failed can close while its peers still run. The
        user's own groups stay theirs."""
        groups = [g for g in (self.group, self.planning_group) if g is not None]
        self.group = self.planning_group = None
        if not (self.distributed and dist.is_initialized()):
            return
        for group in groups:
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 -- already destroyed with the default group: nothing left to free
                pass

    def lend(self, options):
        """Fill the collective fields of a HostOptions."""
        options.bootstrap_all_gather = self.bootstrap_fn
        options.bootstrap_rank = self.rank
        options.bootstrap_world_size = self.world
        options.host_all_to_all_v = self.all_to_all_v_fn
        options.host_all_gather = self.all_gather_fn
        options.host_barrier = self.barrier_fn

    # ---- which group, and what went wrong, per thread ---------------------------------------------------
    def mark_planning_thread(self):
        """Called once by the stack's planning thread: its collectives go to the planning group."""
        self._thread.planning = True

    @property
    def _group(self):
        return self.planning_group if getattr(self._thread, "planning", False) else self.group

    @property
    def last_exception(self):
        """The exception of this thread's last failed collective (None once read or if none)."""
        return getattr(self._thread, "last_exception", None)

    @last_exception.setter
    def last_exception(self, exc):
        self._thread.last_exception = exc

    # ---- the gathers -----------------------------------------------------------------------------------
    def _gather(self, send, nbytes, recv):
        out = _view(recv, nbytes * self.world)
        if self.world == 1:
            out.copy_(_view(send, nbytes))
            return
        if nbytes == 0:
            dist.barrier(group=self._group)
            return
        # gloo gets tensors of its own on both sides, never a view of the plugin's memory: its worker threads may
        # drop their last reference to a buffer late, and a view's owner (a ctypes array) needs the GIL to go,
        # which a thread cannot take while the interpreter exits (like _all_to_all_v's landed buffer).
        landed = torch.empty(nbytes * self.world, dtype=torch.uint8)
        dist.all_gather_into_tensor(landed, _view(send, nbytes).clone(), group=self._group)
        out.copy_(landed)

    def _bootstrap(self, user, send, nbytes, recv):
        try:
            self._gather(send, nbytes, recv)
            return _abi.OK
        except Exception as exc:  # noqa: BLE001 -- nothing may cross into C
            self.last_exception = exc
            traceback.print_exc()
            return _abi.COMMUNICATION

    def _all_gather(self, user, send, nbytes, recv, timeout_ms, error, capacity):
        try:
            self._gather(send, nbytes, recv)
            return _abi.OK
        except Exception as exc:  # noqa: BLE001
            self.last_exception = exc
            return _failed(error, capacity, exc)

    def _all_to_all_v(self, user, send, send_counts, send_displs, recv, recv_counts, recv_displs, timeout_ms, error,
                      capacity):
        try:
            w = self.world
            sc, sd = [send_counts[p] for p in range(w)], [send_displs[p] for p in range(w)]
            rc, rd = [recv_counts[p] for p in range(w)], [recv_displs[p] for p in range(w)]
            send_all = _view(send, max((d + c for d, c in zip(sd, sc)), default=0))
            recv_all = _view(recv, max((d + c for d, c in zip(rd, rc)), default=0))
            if w == 1:
                recv_all[rd[0]:rd[0] + rc[0]].copy_(send_all[sd[0]:sd[0] + sc[0]])
                return _abi.OK
            # gloo takes one contiguous buffer per side, in rank order: pack / unpack around it.
            packed = torch.cat([send_all[d:d + c] for d, c in zip(sd, sc)]) if sum(sc) else torch.empty(0, dtype=torch.uint8)
            landed = torch.empty(sum(rc), dtype=torch.uint8)
            dist.all_to_all_single(landed, packed, output_split_sizes=rc, input_split_sizes=sc, group=self._group)
            at = 0
            for d, c in zip(rd, rc):
                recv_all[d:d + c].copy_(landed[at:at + c])
                at += c
            return _abi.OK
        except Exception as exc:  # noqa: BLE001
            self.last_exception = exc
            return _failed(error, capacity, exc)

    def _barrier(self, user, timeout_ms, error, capacity):
        try:
            if self.world > 1:
                dist.barrier(group=self._group)
            return _abi.OK
        except Exception as exc:  # noqa: BLE001
            self.last_exception = exc
            return _failed(error, capacity, exc)

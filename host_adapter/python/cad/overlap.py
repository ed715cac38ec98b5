"""cad.OverlapChoice: which overlap hides CAD's exchanges in a trainer's step -- none, the CAD plugin's head groups
(2, 4 or 8) or ping-pong of two nano-batches --, decided from one measured unsplit step, and confirmed or reverted
by one measured step under the choice. It generalises cad.PingPongChoice (ping-pong or not, from the stall alone).

The model, per step (ms; the slowest rank's numbers, so that every rank decides alike):
  step    the unsplit step's time                       stall    how long the calling streams waited for CAD's
  server  the server backends' compute in CAD's calls             exchanges (cad.exchange_times' stall_ms)
  compute = step - stall
- Nothing is tried where the stall is under `min_stall_share` of the step (5%): nothing worth hiding, and nothing
  paid. On NVLink the stall was 2.5-4.2% of the step and every overlap lost (docs/multi_gpu.md runs 20, 38-43).
- Head groups G: the server computes group g while group g+1's rows arrive and group g-1's results leave, so
  only the first group's inbound and the last group's outbound stay exposed: an ideal pipeline hides
  min(stall, server) * (1 - 1/G) (server unknown: the stall). What reaches the step is HIDDEN_SHARE of it (the
  collectives share the SMs with the compute they overlap, which slows by part of what is hidden), minus a fixed
  cost (every moved row packed per group, a second server launch per call) and a cost per group beyond two
  (more, smaller collectives and kernels).
- Ping-pong: the other nano-batch's compute hides PP_HIDDEN_SHARE of the stall, at PP_COST_SHARE of the compute
  (half-size kernels, NCCL kernels beside compute).
The best prediction is chosen if it gains at least `min_gain_share` of the step; ping-pong only where it beats the
best head-group prediction by `ping_pong_margin_share` (its constants were measured on NVLink, not on a slow link;
head groups were measured on both). The second observation, a step under the choice, reverts to none if that step
was slower than the unsplit one by more than `revert_tolerance` of it: a wrong prediction costs one step.

The constants are fitted to the head-group and ping-pong records of 2026-11-28 (bench/results/trainer_h200x2_2026-11-28_6fc2a34*), 2 H200s, Llama-3-8B shapes, 64K tokens per
GPU, 2 layers, 2 micro-batches, FSDP2 (predicted / measured saving per step, ms):
  through host memory (NCCL_P2P_DISABLE=1, the slow-link stand-in; records _4 and _5): unsplit 2777 ms, stall 244 ms
    (8.8%): +hg2 28 / 29-31, +hg4 50 / 60-68, +hg8 48 / 58;
  NVLink (records _2 and _5): unsplit 2377 ms, stall 68 ms: +hg2 -11 / -8..-20, +hg4 -10 / -19;
  NVLink, ping-pong of halves (bench/cad/trace_overlap.py): unsplit 2422 ms, GPU idle 41 ms: -45 / -37.
The model is a fit of these few points (the step-to-step noise is 5-10 ms), not a law: the second observation is
what keeps a wrong prediction from lasting.
"""
import torch

from ._errors import CadError

# Head groups: the share of the ideal pipeline's hiding that reaches the step. Fitted with FIXED_COST_SHARE on +hg2
# through host memory (saved 29-31 ms where 122 can be hidden) and on NVLink (lost 8-20 where 34 can be hidden):
# 0.5 x 122 - c = 30 and 0.5 x 34 - c = -14 give 0.5 and c = 31 ms, 1.2% of the step (the records above).
HIDDEN_SHARE = 0.5
FIXED_COST_SHARE = 0.012
# Each group beyond two: +hg8 was no better than +hg4 through host memory (58 against 62 ms saved, record _5), +hg4
# 19 ms slower than unsplit on NVLink where +hg2 was 8-20 (record _5): about 0.15% of the step per group.
PER_GROUP_COST_SHARE = 0.0015
# Ping-pong of halves (2 H200s, 64K, NVLink, bench/cad/trace_overlap.py): split, the GPU idled 15 ms where
# unsplit it idled 41, and the split plans move 1.32x the bytes (heavier half first,
# bench/balancers/nano_split_bytes.py): 1 - 1.32 x 15 / 41 = 0.52 of the stall hidden; the compute kernels took
# 2.8% longer (2375 against 2310 ms).
PP_HIDDEN_SHARE = 0.52
PP_COST_SHARE = 0.028

MODES = ("off", "head_groups", "ping_pong")


class OverlapChoice:
    """Which overlap a trainer's steps use, from measured steps (see the module doc for the model and its data).

        choice = cad.OverlapChoice(heads=(Hq, Hkv))
        ... after an unsplit step (not the warm-up), with the slowest rank's numbers:
        choice.observe(step_ms, stall_ms, exchange_ms, server_ms)   # decides: choice.mode, choice.groups
        choice.apply()             # head groups: the context's stacks rebuilt with them, between steps
        ... after the first step run under the choice:
        choice.observe(step_ms, stall_ms, exchange_ms, server_ms)   # confirms, or reverts to "off" (apply again)
        print(choice.reason)

    mode: None until the first observation, then "off", "head_groups" or "ping_pong"; groups: the head groups
    (1 unless mode is "head_groups"); split: whether to split into nano-batches (as PingPongChoice's); final: no
    later observation changes anything; predictions: each candidate's predicted saving (ms) at the decision.
    heads: (query heads, key/value heads): head-group counts that do not divide both are not candidates.
    ping_pong: False leaves ping-pong out (a trainer that cannot split)."""

    def __init__(self, *, min_stall_share=0.05, head_groups=(2, 4, 8), heads=None, ping_pong=True,
                 min_gain_share=0.005, ping_pong_margin_share=0.01, revert_tolerance=0.0):
        for name, value in (("min_stall_share", min_stall_share), ("min_gain_share", min_gain_share),
                            ("ping_pong_margin_share", ping_pong_margin_share), ("revert_tolerance", revert_tolerance)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise CadError(f"cad.OverlapChoice: {name} must be a number in [0, 1), got {value!r}",
                               "INVALID_ARGUMENT")
        groups = list(head_groups)
        if any(isinstance(g, bool) or not isinstance(g, int) or not 2 <= g <= 64 for g in groups):
            raise CadError(f"cad.OverlapChoice: head_groups must be ints in [2, 64], got {head_groups!r}",
                           "INVALID_ARGUMENT")
        if heads is not None:
            if len(heads) != 2 or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in heads):
                raise CadError(f"cad.OverlapChoice: heads must be (query heads, key/value heads), positive ints, got "
                               f"{heads!r}", "INVALID_ARGUMENT")
            groups = [g for g in groups if heads[0] % g == 0 and heads[1] % g == 0]
        self.head_group_candidates = groups
        self.ping_pong = bool(ping_pong)
        self.min_stall_share = float(min_stall_share)
        self.min_gain_share = float(min_gain_share)
        self.ping_pong_margin_share = float(ping_pong_margin_share)
        self.revert_tolerance = float(revert_tolerance)
        self.mode = None
        self.groups = 1
        self.final = False
        self.predictions = {}
        self.baseline = None  # the unsplit step's numbers the decision came from
        self.reason = "undecided: no unsplit step observed yet"

    @property
    def split(self):
        """Whether steps split into two nano-batches (None until decided), as cad.PingPongChoice.split."""
        return None if self.mode is None else self.mode == "ping_pong"

    def predict(self, step_ms, stall_ms, server_ms=None):
        """Each candidate's predicted saving per step (ms): {"head_groups=G": ..., "ping_pong": ...}."""
        compute = max(step_ms - stall_ms, 0.0)
        hideable = stall_ms if not server_ms else min(stall_ms, server_ms)
        out = {}
        for g in self.head_group_candidates:
            out[f"head_groups={g}"] = (HIDDEN_SHARE * hideable * (1.0 - 1.0 / g) - FIXED_COST_SHARE * step_ms
                                       - PER_GROUP_COST_SHARE * (g - 2) * step_ms)
        if self.ping_pong:
            out["ping_pong"] = PP_HIDDEN_SHARE * stall_ms - PP_COST_SHARE * compute
        return out

    def observe(self, step_ms, stall_ms, exchange_ms=None, server_ms=None, *, group=None):
        """One measured step: its time, the exchanges' stall, their time on the wire and the server compute (ms;
        None where not measured). The first call is the unsplit step the decision comes from, the second a step
        under the choice (confirm or revert); later calls change nothing. group: a torch.distributed group to take
        the slowest rank's numbers over (collective: every rank calls it); None: the numbers are every rank's
        already (e.g. gathered). Returns the mode."""
        if self.final:
            return self.mode
        numbers = [_number(step_ms, "step_ms"), _number(stall_ms, "stall_ms"),
                   _number(exchange_ms if exchange_ms is not None else -1.0, "exchange_ms", -1.0),
                   _number(server_ms if server_ms is not None else -1.0, "server_ms", -1.0)]
        if group is not None:
            numbers = slowest(numbers, group)
        step_ms, stall_ms, exchange_ms, server_ms = numbers
        exchange_ms = exchange_ms if exchange_ms >= 0 else None
        server_ms = server_ms if server_ms >= 0 else None
        if self.mode is None:
            self._decide(step_ms, stall_ms, exchange_ms, server_ms)
        else:
            self._confirm(step_ms)
        return self.mode

    def _decide(self, step_ms, stall_ms, exchange_ms, server_ms):
        self.baseline = {"step_ms": step_ms, "stall_ms": stall_ms, "exchange_ms": exchange_ms, "server_ms": server_ms}
        share = stall_ms / step_ms if step_ms > 0 else 0.0
        seen = (f"the exchanges stalled the unsplit step for {stall_ms:.1f} ms of {step_ms:.1f} ms ({share:.1%})"
                + (f", {exchange_ms:.1f} ms on the wire" if exchange_ms is not None else "")
                + (f", server compute {server_ms:.1f} ms" if server_ms is not None else ""))
        if share < self.min_stall_share:
            self.mode, self.groups, self.final = "off", 1, True
            self.reason = f"overlap off: {seen}, under {self.min_stall_share:.0%}: nothing worth hiding"
            return
        self.predictions = self.predict(step_ms, stall_ms, server_ms)
        grouped = {k: v for k, v in self.predictions.items() if k.startswith("head_groups")}
        best_group = max(grouped, key=lambda k: (grouped[k], -int(k.split("=")[1])), default=None)
        best = best_group
        pp = self.predictions.get("ping_pong")
        if pp is not None and (best is None or pp > grouped[best] + self.ping_pong_margin_share * step_ms):
            best = "ping_pong"
        listed = ", ".join(f"{k} {v:+.1f} ms" for k, v in self.predictions.items())
        if best is None or self.predictions[best] < self.min_gain_share * step_ms:
            self.mode, self.groups, self.final = "off", 1, True
            self.reason = (f"overlap off: {seen}; predicted savings {listed or 'none (no candidate)'}, none at least "
                           f"{self.min_gain_share:.1%} of the step")
            return
        if best == "ping_pong":
            self.mode, self.groups = "ping_pong", 1
        else:
            self.mode, self.groups = "head_groups", int(best.split("=")[1])
        self.reason = (f"overlap {self.describe()}: {seen}; predicted savings {listed}; to be confirmed by the next "
                       f"step under it")

    def _confirm(self, step_ms):
        base = self.baseline["step_ms"]
        chosen = self.describe()
        self.final = True
        if step_ms > base * (1.0 + self.revert_tolerance):
            self.mode, self.groups = "off", 1
            self.reason = (f"overlap off (reverted): {chosen} measured {step_ms:.1f} ms, slower than the unsplit "
                           f"step's {base:.1f} ms; before: {self.reason}")
        else:
            self.reason = (f"overlap {chosen} (confirmed): measured {step_ms:.1f} ms against the unsplit step's "
                           f"{base:.1f} ms; before: {self.reason}")

    def describe(self):
        return {"head_groups": f"head groups {self.groups}", "ping_pong": "ping-pong", "off": "off",
                None: "undecided"}[self.mode]

    def apply(self, context=None):
        """Rebuild `context`'s (default: the default context's) CAD stacks with this choice's head groups, if its
        settings have others (cad.Context.configure: plans made before are refused afterwards, so call it between
        steps, after waiting for any plan made ahead; the next plans make new stacks). Returns whether it
        rebuilt them. Collective in effect: every rank must apply the same choice before its next plan."""
        from . import _context
        context = context if context is not None else _context.default()
        settings = context.settings
        if settings["head_groups"] == self.groups:
            return False
        config = settings.pop("config")
        settings["head_groups"] = self.groups
        context.configure(config, **settings)
        return True

    def record(self):
        """What a run's JSON keeps of the choice."""
        return {"mode": self.mode, "head_groups": self.groups, "final": self.final, "reason": self.reason,
                "predictions_ms": dict(self.predictions), "baseline": self.baseline}


def _number(value, name, low=0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low or value != value:
        raise CadError(f"cad.OverlapChoice.observe: {name} must be a number of ms at least {low:g}, got {value!r}",
                       "INVALID_ARGUMENT")
    return float(value)


def slowest(values, group=None):
    """The largest of every rank's `values` (a list of floats), element by element, over `group` (collective): the
    numbers every rank decides from. On an NCCL group the tensor goes through the current CUDA device."""
    dist = torch.distributed
    backend = str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend and "gloo" not in backend \
        else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()

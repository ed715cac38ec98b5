"""Attention time as trainers report it: wall-clock seconds and calls of a context's varlen_attn forwards and
backwards (cad.attention_time, cad.attention_calls, cad.timing)."""
import time

import torch


class Timer:
    """One context's count (Context.attention_time / attention_calls / timing)."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.sync_cuda = False

    def take(self, reset=True):
        seconds = self.seconds
        if reset:
            self.seconds, self.calls = 0.0, 0
        return seconds


class timed:
    """Counts the block's wall time into `timer` (with sync_cuda, after the device's work too)."""

    def __init__(self, timer, device):
        self.timer, self.device = timer, device

    def __enter__(self):
        if self.timer.sync_cuda and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer.sync_cuda and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.timer.seconds += time.perf_counter() - self.start
        self.timer.calls += 1
        return False

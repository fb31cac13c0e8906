"""One training step's marks, and the row of `rank-NNNNN.csv` they make.

A mark is the moment a boundary of the step was passed, on the recorder's timer: the
host clock (time.perf_counter) on CPU, a CUDA event on the compute stream on a GPU,
read when the next step ends so that no step waits for the device to be measured.
Each phase is the difference of two marks, and other_s is the step minus the phases,
so the phases add up to step_s by construction."""

import math
import time

import torch


class HostTimer:
    """Marks on the host clock, in seconds since the run's origin."""

    device = False

    def __init__(self, origin):
        self.origin = origin

    def mark(self):
        return time.perf_counter()

    def seconds(self, mark):
        return mark - self.origin.perf

    def ready(self, mark):
        return True


class CudaTimer:
    """Marks as CUDA events recorded on the current stream; seconds since an event
    recorded at the run's origin. A mark is read only after its event has completed
    (`ready`), one step later, so that recording never waits for the device."""

    device = True

    def __init__(self, origin, device):
        self.origin = origin
        self.device_index = device
        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record()
        torch.cuda.synchronize(device)

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def seconds(self, mark):
        return self.start.elapsed_time(mark) / 1e3

    def ready(self, mark):
        mark.synchronize()
        return True


class Step:
    """The marks of one step, filled in by the recorder's hooks as the step runs."""

    __slots__ = (
        "epoch", "step", "global_step", "unix_start", "start", "got_batch", "copied", "forward_start",
        "forward_end", "backward_start", "last_bucket", "backward_end", "optimizer_start", "optimizer_end",
        "end", "buckets", "loss", "samples", "forwards", "backwards", "sq_local", "sq_mean", "loss_scale",
    )

    def __init__(self, epoch, step, global_step, start):
        self.epoch, self.step, self.global_step = epoch, step, global_step
        self.unix_start = time.time()
        self.start = start
        for name in ("got_batch", "copied", "forward_start", "forward_end", "backward_start", "last_bucket",
                     "backward_end", "optimizer_start", "optimizer_end", "end", "loss", "samples", "loss_scale"):
            setattr(self, name, None)
        # Per bucket: [handed-over mark, done mark (None until its all-reduce ended), bytes].
        self.buckets = []
        self.forwards = 0
        self.backwards = 0
        # The gradient noise scale's squared norms, summed over the buckets (tensors,
        # read when the row is written): this rank's gradient before the all-reduce, and
        # the ranks' mean after it. None on a step that does not take them.
        self.sq_local = None
        self.sq_mean = None


def _merged(intervals):
    """The intervals' union as sorted disjoint (start, end) pairs."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def phases(s, timer):
    """(phases in COLUMNS' phase order, step_s, comm figures) of a finished step `s`."""
    t = lambda m: None if m is None else timer.seconds(m)  # noqa: E731
    start, end = t(s.start), t(s.end)
    got = t(s.got_batch) if s.got_batch is not None else start
    copied = t(s.copied) if s.copied is not None else got
    fwd0 = t(s.forward_start)
    bwd0 = t(s.backward_start) if s.backward_start is not None else t(s.forward_end)
    last = t(s.last_bucket) if s.last_bucket is not None else t(s.backward_end)
    bwd1 = t(s.backward_end)
    span = lambda a, b: max(0.0, b - a) if a is not None and b is not None else 0.0  # noqa: E731
    named = [
        span(start, got),
        span(got, copied),
        span(fwd0, bwd0),
        span(bwd0, last),
        span(last, bwd1),
        span(t(s.optimizer_start), t(s.optimizer_end)),
    ]
    step_s = max(0.0, end - start)
    other = step_s - sum(named)
    if other < 0:
        # Marks out of order (a device timeline read against the host's): the step is
        # at least its phases.
        step_s, other = sum(named), 0.0
    intervals = [(t(b[0]), t(b[1])) for b in s.buckets if b[1] is not None]
    union = _merged(intervals)
    comm_s = sum(e - b for b, e in union)
    hidden_until = last if last is not None else end
    comm_hidden_s = sum(max(0.0, min(e, hidden_until) - b) for b, e in union)
    if intervals:
        comm_start = min(b for b, _ in intervals)
        comm_last = max(b for b, _ in intervals)
    else:
        comm_start = comm_last = bwd1 if bwd1 is not None else start + step_s
    # Inside the step, as reduce checks.
    comm_start = min(max(comm_start, start), start + step_s)
    comm_last = min(max(comm_last, comm_start), start + step_s)
    return named + [other], step_s, dict(
        comm_s=min(comm_s, step_s),
        comm_hidden_s=min(comm_hidden_s, comm_s),
        comm_start_at_s=comm_start,
        comm_last_start_at_s=comm_last,
        start=start,
        bytes=sum(b[2] for b in s.buckets),
    )


def loss_value(loss):
    if loss is None:
        return math.nan
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        return math.nan

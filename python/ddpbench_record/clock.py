"""Clock offsets between ranks, estimated as ddpbench's own runs estimate them
(src/train/clock.rs) and written by rank 0 to `clock.csv`.

Every rank's times count from its own origin, the moment it left a barrier. Ranks under
one kernel (same boot id) share CLOCK_MONOTONIC, so the difference of their origins on
that clock is their exact offset. Across kernels the offset is estimated by round trips
to rank 0: they repeat until half the shortest round trip (the error bound) is below
TARGET_ERROR_S or BUDGET_S is spent, at least MIN_ROUNDS times. The messages go over a
gloo process group, on CPU whatever the training backend."""

import time

import torch
import torch.distributed as dist

MIN_ROUNDS = 8
MAX_ROUNDS = 100_000
TARGET_ERROR_S = 50e-6
BUDGET_S = 0.2
DONE = -1.0

CLOCK_COLUMNS = ("sync", "rank", "rank0_at_s", "offset_s", "error_s", "rounds", "exact_offset_s", "exact_error_s")


class Origin:
    """The common start of the run on this rank's clocks: perf_counter's reading, and
    where it lies on CLOCK_MONOTONIC (the middle of two reads around it)."""

    def __init__(self):
        before = time.clock_gettime(time.CLOCK_MONOTONIC)
        self.perf = time.perf_counter()
        after = time.clock_gettime(time.CLOCK_MONOTONIC)
        self.unix = time.time()
        self.monotonic_s = (before + after) / 2
        self.monotonic_error_s = (after - before) / 2

    def now(self):
        """Seconds since the origin."""
        return time.perf_counter() - self.perf


def boot_id_hash():
    """This kernel's boot id as a number (0 when unreadable: no rank then shares rank 0's clock)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            text = f.read().strip()
    except OSError:
        return 0
    return int(text.replace("-", "")[:12], 16) or 1 if text else 0


def _round_trips(group, origin):
    """Rank r > 0: round trips to rank 0; returns (rank0_at_s, offset_s, error_s, rounds)."""
    started = time.perf_counter()
    best = [0.0, 0.0, float("inf"), 0]
    ping, pong = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    while best[3] < MAX_ROUNDS and (best[3] < MIN_ROUNDS or (best[2] > TARGET_ERROR_S and time.perf_counter() - started < BUDGET_S)):
        sent = origin.now()
        ping[0] = sent
        dist.send(ping, 0, group=group)
        dist.recv(pong, 0, group=group)
        back = origin.now()
        best[3] += 1
        if (back - sent) / 2 < best[2]:
            theirs = float(pong[0])
            best[:3] = [theirs, theirs - (sent + back) / 2, (back - sent) / 2]
    ping[0] = DONE
    dist.send(ping, 0, group=group)
    return best


def estimate(group, rank, world, origin, sync):
    """Every rank's offset to rank 0 (a collective over `group`): rank 0 gets the rows
    of clock.csv as tuples in CLOCK_COLUMNS' order, the others an empty list."""
    boot = boot_id_hash()
    if rank != 0:
        est = _round_trips(group, origin)
        msg = torch.tensor(est + [origin.monotonic_s, origin.monotonic_error_s, float(boot)], dtype=torch.float64)
        dist.send(msg, 0, group=group)
        return []
    rows = [(sync, 0, origin.now(), 0.0, 0.0, 0, 0.0, 0.0)]
    ping = torch.zeros(1, dtype=torch.float64)
    msg = torch.zeros(7, dtype=torch.float64)
    for r in range(1, world):
        while True:
            dist.recv(ping, r, group=group)
            if float(ping[0]) == DONE:
                break
            dist.send(torch.tensor([origin.now()], dtype=torch.float64), r, group=group)
        dist.recv(msg, r, group=group)
        at, offset, error, rounds, mono, mono_err, their_boot = msg.tolist()
        shared = boot != 0 and int(their_boot) == boot
        rows.append(
            (
                sync,
                r,
                at,
                offset,
                error,
                int(rounds),
                mono - origin.monotonic_s if shared else None,
                mono_err + origin.monotonic_error_s if shared else None,
            )
        )
    return rows

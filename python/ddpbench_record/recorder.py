"""The recorder: hooks on a DDP model and its optimizer that time every step of a
user's own training loop, and the run folder they make."""

import atexit
import math
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import clock, lock, run
from .columns import COLUMNS, RUN_FILES
from .files import CsvFile, exact, rfc3339_utc, write_json
from .step import CudaTimer, HostTimer, Step, loss_value, phases

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.+")
MAX_NAME = 64


class RecorderError(Exception):
    """What the recorder cannot measure, or was given wrong, and what to do instead."""


def _check_name(what, name):
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not set(name) <= NAME_CHARS:
        raise RecorderError(
            f"{what}={name!r}: give 1 to {MAX_NAME} letters, digits, '-', '_', '.' or '+' "
            "(it names the workload in ddpbench's tables, e.g. model_name=\"my-vit\")"
        )


def _is_fsdp(model):
    names = {c.__name__ for c in type(model).__mro__}
    return bool(names & {"FullyShardedDataParallel", "FSDPModule"})


def _check_model(model, optimizer):
    if _is_fsdp(model):
        raise RecorderError(
            "the model is wrapped in FSDP: the recorder measures DistributedDataParallel only (FSDP's sharded "
            "all-gathers and reduce-scatters are not timed yet); wrap the model in DDP, or run without the recorder"
        )
    if not isinstance(model, DistributedDataParallel):
        raise RecorderError(
            f"the model is a {type(model).__name__}, not wrapped in DistributedDataParallel: give the recorder "
            "the DDP model, e.g. `ddp = DistributedDataParallel(model)`, `Recorder(ddp, optimizer, ...)`"
        )
    if getattr(model, "_comm_hooks", None):
        raise RecorderError(
            "the DDP model already has a communication hook (fp16 compression, PowerSGD, ...): the recorder times "
            "DDP's default all-reduce through a hook of its own; construct the Recorder on a model without one"
        )
    if optimizer is None:
        raise RecorderError("no optimizer given: pass the optimizer whose step() ends each step, Recorder(ddp, optimizer, ...)")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RecorderError(f"optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer")


def _samples(batch):
    """The samples in a batch: the first dimension of its first tensor (None if it has none)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = _samples(b)
            if n is not None:
                return n
    return None


def _to(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    return batch


def _tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)


def _backend(name, device_type):
    """The all-reduce as ddpbench names it: `nccl`, `gloo` or `mpi` (a multi-device
    backend string such as `cpu:gloo,cuda:nccl` by the part of the model's device)."""
    parts = dict(p.split(":", 1) for p in name.split(",")) if ":" in name else {device_type: name}
    chosen = parts.get(device_type, name)
    if chosen not in ("nccl", "gloo", "mpi"):
        raise RecorderError(
            f"the process group's backend is {name!r}: the recorder records nccl, gloo or mpi all-reduces; "
            "init_process_group with one of them"
        )
    return chosen


def _grad_dtype(model):
    kinds = {p.dtype for p in model.parameters() if p.requires_grad}
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    return names.get(kinds.pop()) if len(kinds) == 1 else None


class Recorder:
    """Times every step of a torchrun DDP training loop and writes a ddpbench run folder.

    rec = Recorder(ddp_model, optimizer, out="results/myjob", batch_size=64, model_name="my-vit")
    for batch in rec.batches(loader):
        loss = loss_fn(ddp_model(batch[0]), batch[1]); loss.backward(); optimizer.step()
    rec.close()

    Every rank constructs it (it is collective), after init_process_group and before the
    first step. `out` is the run folder: created, locked and refused when it already
    holds a run. `batch_size` is the samples per rank per step. `warmup_steps` first
    steps are marked warm-up (reduce leaves them out).

    `noise_every=K` (K >= 1) takes the gradient noise scale's two squared norms every
    K-th step, in the communication hook: this rank's gradient before the all-reduce
    (its batch) and the ranks' mean after it (the global batch); `reduce` turns them
    into B_simple as for ddpbench's `--noise-scale every:K`. They cost one squared
    norm per bucket twice on those steps. The loss must be a mean over the batch. On
    one rank no norms are taken (one batch size only); the key keeps K, so that the
    run stays the reference of the N-rank runs that asked for the same.

    `clock_sync` says when the ranks' clock offsets to rank 0 are estimated into
    clock.csv (a collective of a few milliseconds, up to 0.2 s per rank across nodes):
    `"epochs"` (the default, as ddpbench's own runs) at the start, at the end of every
    `rec.batches()` loop that runs out (every rank's loader ends together, as
    DistributedSampler makes them) and at close; `"ends"` at the start and at close only,
    for a script whose `rec.batches()` loops are short blocks timed as a whole.

    `scaler` is the script's `torch.amp.GradScaler`, when it trains with mixed precision:
    each row's `loss_scale` is then the scale its backward ran under, and `step_skipped`
    is 1 for a step whose `scaler.step()` skipped the optimizer (inf or NaN gradients).

    `caller_holds_folder=True` is for a program that owns the run folder and runs the
    script inside it (`ddpbench study` does, for its PyTorch twin): the folder must
    exist and be locked by a live process of this host; the recorder then takes no lock
    and writes no manifest.json (the owner writes it; `rec.manifest` holds what the
    recorder would have written), only the rank files, their end records and clock.csv."""

    def __init__(self, model, optimizer=None, *, out, batch_size, model_name, dataset_name="unnamed",
                 node_type=None, warmup_steps=5, caller_holds_folder=False, noise_every=0, clock_sync="epochs",
                 scaler=None):
        _check_model(model, optimizer)
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise RecorderError(
                f"scaler is a {type(scaler).__name__}, not a torch.amp.GradScaler: give the GradScaler whose "
                "scale(loss).backward() and step(optimizer) the script calls, or leave scaler out"
            )
        self.scaler = scaler
        if clock_sync not in ("epochs", "ends"):
            raise RecorderError(
                f"clock_sync={clock_sync!r}: give \"epochs\" (clock offsets at every epoch's end, the default) or "
                "\"ends\" (at the start and at close only)"
            )
        self.clock_sync = clock_sync
        if isinstance(noise_every, bool) or not isinstance(noise_every, int) or noise_every < 0:
            raise RecorderError(
                f"noise_every={noise_every!r}: give the steps between two measurements of the gradient noise scale "
                "(a whole number >= 1), or 0 for none"
            )
        self.noise_every = noise_every
        _check_name("model_name", model_name)
        _check_name("dataset_name", dataset_name)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise RecorderError(f"batch_size={batch_size!r}: give the samples each rank trains per step (a whole number >= 1)")
        if not dist.is_initialized():
            raise RecorderError("torch.distributed is not initialised: call dist.init_process_group() before Recorder(...)")
        self.model, self.optimizer, self.batch_size = model, optimizer, batch_size
        self.warmup_steps = int(warmup_steps)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        backend = _backend(dist.get_backend(), model.device.type if hasattr(model, "device") else "cpu")
        self.group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        self.dir = os.path.realpath(out)
        self.run_id = os.path.basename(self.dir)
        self.caller_holds_folder = bool(caller_holds_folder)
        self._lock = None
        self._claim_folder()
        self.device = model.device if hasattr(model, "device") else next(model.parameters()).device
        self.cuda = self.device.type == "cuda"
        dist.barrier(group=self.group)
        self.origin = clock.Origin()
        self.timer = CudaTimer(self.origin, self.device) if self.cuda else HostTimer(self.origin)
        self.clock_rows = clock.estimate(self.group, self.rank, self.world, self.origin, 0)
        self.syncs = 1
        self._start_files(backend, node_type, model_name, dataset_name)
        self.epoch, self.global_step = -1, 0
        self.current = None
        self.pending = None
        self.closed = False
        self.rows = 0
        self.bucket_bytes = []
        self.copy_measured = False
        self._install_hooks()
        atexit.register(self._at_exit)

    # ----- the folder --------------------------------------------------------------

    def _claim_folder(self):
        """Rank 0 creates the folder, takes its lock and refuses one that holds a run; every
        rank raises the same error."""
        error = None
        if self.rank == 0 and self.caller_holds_folder:
            error = self._check_held_folder()
        elif self.rank == 0:
            try:
                os.makedirs(self.dir, exist_ok=True)
                self._lock = lock.FolderLock(self.dir)
                present = sorted(n for n in os.listdir(self.dir) if n.startswith("rank-") or n in RUN_FILES)
                if present:
                    self._lock.release()
                    self._lock = None
                    first = "manifest.json" if "manifest.json" in present else present[0]
                    error = (
                        f"{self.dir} already holds a run ({first}): choose another `out` or move that run away"
                        if first == "manifest.json"
                        else f"{self.dir} already holds {first}, a file a run writes: choose another `out` or move {first} away"
                    )
            except (OSError, lock.LockError) as e:
                error = str(e)
        said = [error]
        dist.broadcast_object_list(said, src=0, group=self.group)
        if said[0] is not None:
            raise RecorderError(said[0])

    def _check_held_folder(self):
        """With caller_holds_folder: None when the folder exists, is locked by a live
        process of this host and holds none of the files the recorder writes; else why not."""
        if not os.path.isdir(self.dir):
            return f"caller_holds_folder=True: {self.dir} is not a folder; the caller creates and locks it first"
        why = lock.held_live(self.dir)
        if why is not None:
            return f"caller_holds_folder=True: {why}; the caller locks the folder before the recorder starts"
        present = sorted(n for n in os.listdir(self.dir) if n.startswith("rank-") or n == "clock.csv")
        if present:
            return f"{self.dir} already holds {present[0]}, a file the recorder writes: give the recorder a folder without rank files"
        return None

    def _start_files(self, backend, label, model_name, dataset_name):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        me = run.rank_info(self.rank, local, self.device, label)
        self.node_type = me["node_type"]
        ranks = [None] * self.world
        dist.all_gather_object(ranks, me, group=self.group)
        ddp = self.model
        self.ddp_options = {
            "bucket_cap_mb": ddp.bucket_bytes_cap / (1024 * 1024),
            "static_graph": bool(ddp.static_graph),
            "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "find_unused_parameters": bool(ddp.find_unused_parameters),
        }
        self.gradient_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
        self.parameters = sum(p.numel() for p in ddp.parameters())
        options = [f"{k}={str(v).lower()}" for k, v in self.ddp_options.items() if k != "bucket_cap_mb"]
        self.manifest = self._manifest(backend, ranks, model_name, dataset_name, options)
        self.rank_file = CsvFile(os.path.join(self.dir, f"rank-{self.rank:05d}.csv"), COLUMNS)
        self._end_record("running", None)
        if self.rank == 0:
            self.clock_file = CsvFile(os.path.join(self.dir, "clock.csv"), clock.CLOCK_COLUMNS)
            for r in self.clock_rows:
                self.clock_file.row(r)
            if not self.caller_holds_folder:
                write_json(os.path.join(self.dir, "manifest.json"), self.manifest)

    def _manifest(self, backend, ranks, model_name, dataset_name, options):
        v = run.versions()
        hosts = {r["host"] for r in ranks}
        return {
            "schema_version": 4,
            "run_id": self.run_id,
            "status": "running",
            "error": None,
            "ddpbench_version": v["ddpbench_version"],
            "libtorch_version": v["libtorch_version"],
            "mpi_library": "",
            "command_line": run.command_line(),
            "config": {
                "trainer": run.TRAINER,
                "warmup_steps": self.warmup_steps,
                "ddp": self.ddp_options,
                "versions": v,
                "timer": "cuda events, read a step late" if self.cuda else "host clock (time.perf_counter)",
                "phases_measured": ["data_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "other_s"],
                "phases_not_measured": {
                    "batch_copy_s": "measured only when rec.batches(loader, device=...) copies the batch; "
                    "otherwise 0 and the script's own copy is inside other_s",
                },
                "forward_s": "from the DDP module's forward pre-hook to the start of backward (the loss included)",
                "other_s": "the step minus the phases: zero_grad, the script's own copies, logging",
                "noise_scale": f"every:{self.noise_every}" if self.noise_every else "off",
                "clock_sync": "at the start, after every epoch (a rec.batches() loop run out) and at close"
                if self.clock_sync == "epochs" else "at the start and at close",
                "loss_scale": "the GradScaler's scale as the step's backward began; step_skipped is 1 where its "
                "step() skipped the optimizer (inf or NaN gradients)" if self.scaler is not None
                else "no GradScaler given: loss_scale empty, step_skipped 0",
                "noise_norms": "in the communication hook: |G|^2 of this rank's bucket buffers before the all-reduce "
                "and of the ranks' mean after it, summed over the buckets, every noise_every-th step on more than one "
                "rank; they are the gradient of the batch's mean loss only when the script's loss is a mean",
            },
            "model": model_name,
            "dataset": dataset_name,
            "dataset_source": "the script's own loader",
            "parameters": self.parameters,
            "gradient_bytes": self.gradient_bytes,
            "comm_backend": backend,
            "comm": {
                "overlap": True,
                "backward_stages": 1,
                "grad_dtype": _grad_dtype(self.model) or "",
                "amp": "",
                "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
                "mpi_threading": "",
                "note": "PyTorch DDP script (ddpbench_record): comm_s is the time any bucket's all-reduce was in flight, "
                "from its hand-over to DDP's communication hook to its end; backward_s ends at the last bucket's "
                "hand-over, comm_exposed_s runs from there to the end of backward",
                "overlap_shares_core": False,
                "bucket_bytes": [],
                "bucket_ready_fraction": [],
            },
            "buckets": 0,
            "world_size": self.world,
            "nodes": len(hosts),
            "batch_size_per_rank": self.batch_size,
            "global_batch_size": self.batch_size * self.world,
            "steps_per_epoch": 0,
            "start_utc": rfc3339_utc(self.origin.unix),
            "end_utc": None,
            "wall_s": None,
            "final_param_l2": None,
            "final_val_accuracy": None,
            "allreduce_probe": None,
            "ranks": ranks,
            "comparison_key": run.key(
                model_name, dataset_name, ranks, self.device, backend,
                options, self.ddp_options["bucket_cap_mb"], None, _grad_dtype(self.model), self.noise_every,
            ),
        }

    def _end_record(self, status, error):
        write_json(
            os.path.join(self.dir, f"rank-{self.rank:05d}.end.json"),
            {
                "run_id": self.run_id, "rank": self.rank, "host": self.manifest["ranks"][self.rank]["host"],
                "status": status, "error": error, "steps": self.rows if hasattr(self, "rows") else 0,
                "time_utc": rfc3339_utc(time.time()),
            },
        )

    # ----- the hooks ---------------------------------------------------------------

    def _install_hooks(self):
        m = self.model
        self._handles = [
            m.register_forward_pre_hook(self._forward_pre),
            m.register_forward_hook(self._forward_post),
            self.optimizer.register_step_pre_hook(self._optimizer_pre),
            self.optimizer.register_step_post_hook(self._optimizer_post),
        ]
        try:
            m.register_comm_hook(None, self._comm_hook)
        except RuntimeError as e:
            raise RecorderError(
                f"the DDP model already has a communication hook ({e}): the recorder times DDP's default all-reduce "
                "through a hook of its own; construct the Recorder instead of registering another hook"
            ) from None

    def _training(self):
        return self.current is not None and self.model.training and torch.is_grad_enabled()

    def _forward_pre(self, module, args):
        if not self._training():
            return
        s = self.current
        if not self.model.require_backward_grad_sync:
            raise RecorderError(
                "a forward inside DDP's no_sync(): gradient accumulation over several forward/backward passes per "
                "step is not measured yet; train one forward and one backward per optimizer step with the recorder"
            )
        s.forwards += 1
        if s.forwards > 1:
            raise RecorderError(
                "a second forward of the DDP model in one step (gradient accumulation, or two losses): the recorder "
                "measures one forward and one backward per step; run the validation forward under torch.no_grad()"
            )
        s.forward_start = self.timer.mark()

    def _forward_post(self, module, args, output):
        if not self._training():
            return
        s = self.current
        s.forward_end = self.timer.mark()
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(self._backward_start)

    def _backward_start(self, grad):
        s = self.current
        if s is not None and s.backward_end is not None:
            raise RecorderError(
                "a second backward in one step (backward with retain_graph, then backward again): the recorder "
                "measures one forward and one backward per optimizer step; call optimizer.step() after each backward"
            )
        if s is not None and s.backward_start is None:
            s.backward_start = self.timer.mark()
            s.loss_scale = self._loss_scale()
        return None

    def _loss_scale(self):
        """The GradScaler's scale now (its backward has begun, so the loss is scaled): a copy
        of its tensor, read when the row is written (a step late on a GPU, so no wait), or
        None without an enabled scaler."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        scale = getattr(self.scaler, "_scale", None)
        return scale.detach().clone() if isinstance(scale, torch.Tensor) else float(self.scaler.get_scale())

    def _comm_hook(self, state, bucket):
        s = self.current
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size() if self.world > 1 else 0
        entry = [self.timer.mark(), None, nbytes]
        if s is not None:
            if s.backward_end is not None:
                raise RecorderError(
                    "a second backward in one step: the recorder measures one forward and one backward per optimizer "
                    "step; call optimizer.step() after each backward"
                )
            s.buckets.append(entry)
            if self._takes_norms(s):
                # This rank's gradient, its mean over the rank's batch, before the all-reduce.
                sq = buf.detach().double().pow(2).sum()
                s.sq_local = sq if s.sq_local is None else s.sq_local + sq
            if bucket.is_last():
                s.last_bucket = entry[0]
                s.backwards += 1
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        buf.div_(self.world)
        work = dist.all_reduce(buf, group=self.model.process_group, async_op=True)

        def done(fut):
            entry[1] = self.timer.mark()
            mean = fut.value()[0]
            if s is not None and self._takes_norms(s):
                sq = mean.detach().double().pow(2).sum()
                s.sq_mean = sq if s.sq_mean is None else s.sq_mean + sq
            return mean

        return work.get_future().then(done)

    def _scale_cell(self, s):
        """The row's loss_scale: the step's scale, empty without a scaler (or a non-finite one)."""
        if s.loss_scale is None:
            return None
        v = float(s.loss_scale)
        return v if math.isfinite(v) and v > 0 else None

    def _skipped(self, s):
        """1 when the step's backward ran and its scaler skipped the optimizer's step."""
        return 1 if self.scaler is not None and s.backward_end is not None and s.optimizer_start is None else 0

    def _takes_norms(self, s):
        """Whether step `s` takes the noise scale's norms: every `noise_every`-th step, from
        the first, on more than one rank (one rank's batch and the global batch are then
        two sizes)."""
        return self.noise_every > 0 and self.world > 1 and s.global_step % self.noise_every == 0

    def _norms(self, s):
        """The row's four noise cells: batch and |G|² of this rank, then of all ranks."""
        if s.sq_local is None or s.sq_mean is None or any(b[1] is None for b in s.buckets):
            return [None, None, None, None]
        return [s.samples, exact(s.sq_local), s.samples * self.world, exact(s.sq_mean)]

    def _backward_end(self):
        s = self.current
        if s is not None:
            s.backward_end = self.timer.mark()

    def _optimizer_pre(self, optimizer, args, kwargs):
        if self.current is not None:
            self.current.optimizer_start = self.timer.mark()

    def _optimizer_post(self, optimizer, args, kwargs):
        if self.current is not None:
            self.current.optimizer_end = self.timer.mark()

    def loss(self, value):
        """Records this step's loss (a tensor or a number), read when the step's row is
        written; without it the row's loss cell is empty."""
        if self.current is not None:
            self.current.loss = value.detach() if isinstance(value, torch.Tensor) else value

    # ----- the loop ----------------------------------------------------------------

    def batches(self, loader, device=None):
        """Yields `loader`'s batches, one step each, timing the wait for each one (one call
        is one epoch). With `device`, the batch's tensors are copied there and the copy
        timed as batch_copy_s."""
        if self.closed:
            raise RecorderError("the recorder is closed: construct a new one (with a new `out`) for another run")
        self.epoch += 1
        if hasattr(loader, "__len__") and self.rank == 0:
            self.manifest["steps_per_epoch"] = max(self.manifest["steps_per_epoch"], len(loader))
        it = iter(loader)
        index = 0
        try:
            while True:
                at = self.timer.mark()
                self._end_step(at)
                self.current = Step(self.epoch, index, self.global_step, at)
                try:
                    batch = next(it)
                except StopIteration:
                    self.current = None
                    if self.clock_sync == "epochs":
                        self._sync_clocks()
                    return
                s = self.current
                s.got_batch = self.timer.mark()
                if device is not None:
                    batch = _to(batch, device)
                    s.copied = self.timer.mark()
                    self.copy_measured = True
                n = _samples(batch)
                if n is not None and n > self.batch_size:
                    raise RecorderError(
                        f"a batch of {n} samples, more than batch_size={self.batch_size}: give the recorder the "
                        "samples each rank trains per step"
                    )
                s.samples = n if n is not None else self.batch_size
                index += 1
                self.global_step += 1
                yield batch
        finally:
            # The loop left mid-epoch (break, or an error in the step): only a step whose
            # optimizer ran is whole.
            if self.current is not None and self.current.optimizer_end is None:
                self.current = None
            self._end_step(self.timer.mark())

    def _end_step(self, at):
        """Ends the step in progress at mark `at`, and writes the step before it (on a GPU)
        or it (on CPU)."""
        s = self.current
        if s is None:
            return
        self.current = None
        s.end = at
        if s.backward_end is None and s.optimizer_end is None:
            # A batch taken and not trained on (the loop broke out, or the script failed
            # in the step): no row, so that every row is a whole step.
            return
        if self.timer.device:
            if self.pending is not None:
                self._write(self.pending)
            self.pending = s
        else:
            self._write(s)

    def _write(self, s):
        self.timer.ready(s.end)
        named, step_s, c = phases(s, self.timer)
        self.bucket_bytes = [b[2] for b in s.buckets]
        row = [
            self.run_id, self.rank, self.node_type, s.epoch, s.step, s.global_step,
            1 if s.global_step < self.warmup_steps else 0,
            rfc3339_utc(self.origin.unix + c["start"]), c["start"], s.samples,
            *named, step_s, c["comm_s"], 0.0, 0.0, c["comm_hidden_s"], c["comm_start_at_s"],
            c["comm_last_start_at_s"], loss_value(s.loss), c["bytes"], self._scale_cell(s), self._skipped(s),
            *self._norms(s),
        ]
        self.rank_file.row(row)
        self.rows += 1

    def _sync_clocks(self):
        """Every rank's clock offset to rank 0, estimated now (collective, between steps);
        rank 0 appends them to clock.csv."""
        rows = clock.estimate(self.group, self.rank, self.world, self.origin, self.syncs)
        self.syncs += 1
        if self.rank == 0:
            for r in rows:
                self.clock_file.row(r)
            self.clock_file.sync()

    # ----- the end -----------------------------------------------------------------

    def close(self):
        """Ends the run: the last row written, clock offsets estimated again, the manifest
        marked completed. Collective: every rank calls it."""
        if self.closed:
            return
        if self.current is not None:
            self._end_step(self.timer.mark())
        if self.pending is not None:
            self._write(self.pending)
            self.pending = None
        self.closed = True
        for h in self._handles:
            h.remove()
        self.rank_file.sync()
        self.rank_file.close()
        dist.barrier(group=self.group)
        self._sync_clocks()
        steps = [0] * self.world
        dist.all_gather_object(steps, self.rows, group=self.group)
        self._end_record("completed", None)
        if self.rank == 0:
            self.clock_file.close()
            self._finish_manifest("completed", None)
        atexit.unregister(self._at_exit)

    def _finish_manifest(self, status, error):
        m = self.manifest
        m["status"], m["error"] = status, error
        if self.copy_measured:
            m["config"]["phases_measured"].insert(1, "batch_copy_s")
            m["config"]["phases_not_measured"].pop("batch_copy_s", None)
        m["wall_s"] = self.origin.now()
        m["end_utc"] = rfc3339_utc(time.time())
        m["comm"]["bucket_bytes"] = self.bucket_bytes
        m["buckets"] = len(self.bucket_bytes)
        if not self.caller_holds_folder:
            write_json(os.path.join(self.dir, "manifest.json"), m)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _at_exit(self):
        """The script ended without close(): the rows written stay, and the run says it
        did not end (reduce skips it with this reason)."""
        if self.closed:
            return
        self.closed = True
        error = "the script exited without Recorder.close()"
        if getattr(sys, "last_value", None) is not None:
            error = "".join(traceback.format_exception_only(type(sys.last_value), sys.last_value)).strip()
        error = f"rank {self.rank}, after {self.rows} complete steps: {error}"
        try:
            self._end_record("failed", error)
            if self.rank == 0:
                self._finish_manifest("failed", error)
        except OSError:
            pass

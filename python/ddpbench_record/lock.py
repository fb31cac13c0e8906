"""`.ddpbench.lock`: one writer per folder, as ddpbench's own runs take it
(src/record/lock.rs). The lock is created whole and exclusively (written under a random
name, then hard-linked into place) and says who holds it: host, pid, the kernel's boot
id, the process's start time, its PID namespace, the batch job, when and with what
command. ddpbench judges a lock written here exactly as one of its own, and this module
judges one of ddpbench's by the same rule:

- held on this host: cleared when its process is gone (no such pid, a pid now started
  at another time, or the host restarted since); refused while it runs;
- held on another host, in another PID namespace, or unreadable: refused, since no
  process there can be checked from here.
"""

import json
import os
import re
import secrets
import socket
import sys
import time

from .files import rfc3339_utc

LOCK_FILE = ".ddpbench.lock"
BREAK_FILE = ".ddpbench.lock.break"
MAX_LOCK_BYTES = 64 << 10


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace():
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def process_start_ticks(pid):
    """Field 22 of /proc/PID/stat (after the command, which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 1 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def scheduler_job():
    """The batch job that started this process, as ddpbench names it (`Slurm job 12_3`)."""
    env = {k: v for k, v in os.environ.items() if v}
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        name, job = "Slurm", f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    elif "SLURM_JOB_ID" in env or "SLURM_JOBID" in env:
        name, job = "Slurm", env.get("SLURM_JOB_ID") or env["SLURM_JOBID"]
    elif "PBS_JOBID" in env:
        name, job = "PBS", env["PBS_JOBID"]
    elif "LSB_JOBID" in env:
        index = env.get("LSB_JOBINDEX", "0")
        name, job = "LSF", env["LSB_JOBID"] + (f"_{index}" if index != "0" else "")
    elif env.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"torchrun job {env['TORCHELASTIC_RUN_ID']}"
    else:
        return None
    return f"{name} job {re.sub(r'[^A-Za-z0-9._-]', '_', job)}"


def me():
    """The holder record of this process, in the field order ddpbench writes."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "boot_id": boot_id(),
        "process_start_ticks": process_start_ticks(pid) or 0,
        "pid_namespace": pid_namespace(),
        "job": scheduler_job(),
        "start_utc": rfc3339_utc(time.time()),
        "command": [sys.executable] + sys.argv,
    }


def describe(h):
    job = f", {h['job']}" if h.get("job") else ""
    return f"pid {h.get('pid')} on {h.get('host')}{job}, since {h.get('start_utc')}: `{' '.join(map(str, h.get('command') or []))}`"


def judge(h):
    """('live' | 'stale' | 'unknown', why) for a holder record, by lock.rs's rule."""
    if h.get("host") != socket.gethostname():
        return "unknown", f"it was taken on {h.get('host')}, whose processes cannot be checked from here"
    if h.get("boot_id") and h.get("boot_id") != boot_id():
        return "stale", f"{h.get('host')} has restarted since"
    if h.get("pid_namespace") is None:
        return "unknown", "it was written by an older ddpbench that did not record its PID namespace"
    if h.get("pid_namespace") != pid_namespace():
        return "unknown", "it was taken in another PID namespace, whose processes cannot be checked from here"
    pid, ticks = h.get("pid"), h.get("process_start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int) or pid <= 0 or pid > 2**31 - 1 or ticks == 0:
        return "unknown", f"it names pid {pid} started at tick {ticks}, which no process of a running job has"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "stale", f"process {pid} no longer exists"
    except PermissionError:
        pass
    now = process_start_ticks(pid)
    if now is not None and now != ticks:
        return "stale", f"pid {pid} now belongs to a later process"
    return "live", ""


def _read(path):
    """The lock's bytes, or a word for what is there instead ('missing', 'a symbolic link', ...)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    import stat as st_mod

    if not st_mod.S_ISREG(st.st_mode):
        return "a symbolic link" if st_mod.S_ISLNK(st.st_mode) else "not a regular file"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LOCK_BYTES + 1)
    except OSError:
        return "unreadable"
    return data if len(data) <= MAX_LOCK_BYTES else "unreadable"


def _create_whole(path, data):
    """Creates `path` holding `data`, whole from its first instant; False when taken."""
    tmp = os.path.join(os.path.dirname(path), f"{LOCK_FILE}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _clear(path, seen):
    guard = os.path.join(os.path.dirname(path), BREAK_FILE)
    try:
        os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        raise LockError(f"another job is clearing the stale lock {path} at this moment; if none is, remove {guard}")
    try:
        if _read(path) == seen:
            os.unlink(path)
    finally:
        os.unlink(guard)


def held_live(folder):
    """None when `folder`'s lock is held by a live process of this host; else why it is not."""
    path = os.path.join(folder, LOCK_FILE)
    seen = _read(path)
    if not isinstance(seen, bytes):
        return f"{path} is {seen}"
    try:
        holder = json.loads(seen)
    except ValueError:
        holder = None
    if not isinstance(holder, dict):
        return f"{path} cannot be read as a ddpbench lock"
    verdict, why = judge(holder)
    return None if verdict == "live" else f"{path} is not held by a live process ({why})"


class LockError(Exception):
    pass


class FolderLock:
    """The lock of folder `folder`, held by this process until `release()`."""

    def __init__(self, folder):
        self.path = os.path.join(folder, LOCK_FILE)
        self.data = (json.dumps(me(), indent=2)).encode()
        for _ in range(4):
            if _create_whole(self.path, self.data):
                return
            seen = _read(self.path)
            if seen == "missing":
                continue
            holder = None
            if isinstance(seen, bytes):
                try:
                    holder = json.loads(seen)
                except ValueError:
                    holder = None
            verdict, why = judge(holder) if isinstance(holder, dict) else ("unknown", f"{self.path} cannot be read as a ddpbench lock")
            who = describe(holder) if isinstance(holder, dict) else "a job whose lock cannot be read"
            if verdict == "live":
                raise LockError(
                    f"the run folder {folder} is being written by another ddpbench job ({who}). "
                    "One folder takes one job: wait for that job to end, or choose another `out`"
                )
            if verdict == "unknown":
                raise LockError(
                    f"the run folder {folder} is locked by another ddpbench job ({who}), and {why}. "
                    f"One folder takes one job; if that job has ended, remove {self.path}"
                )
            _clear(self.path, seen)
        raise LockError(f"cannot take the lock of {folder}: other jobs keep taking it; one folder takes one job")

    def release(self):
        """Removes the lock, only while it still holds what this process wrote."""
        if self.data is not None and _read(self.path) == self.data:
            os.unlink(self.path)
        self.data = None

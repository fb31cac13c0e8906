"""Writing a run folder's files as ddpbench writes them: rows handed to the kernel whole
(one `write` per row, so a process killed at any moment leaves no torn row), JSON
replaced atomically (temporary file, fsync, rename), numbers as plain decimals."""

import datetime
import decimal
import json
import math
import os
import secrets


def plain(v):
    """A real number as ddpbench's CSVs hold it: up to 9 decimals, trailing zeros
    trimmed, never an exponent; NaN and infinities as an empty cell."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return ""
    t = f"{v:.9f}"
    if "." in t:
        t = t.rstrip("0").rstrip(".")
    return "0" if t == "-0" else t


def exact(v):
    """A real number of unknown scale (a squared gradient norm) as a plain decimal that
    reads back to the same float: every digit of its shortest form, never an exponent
    (9 decimals, as `plain` writes seconds, would leave nothing of 1e-10)."""
    if v is None or not math.isfinite(v):
        return ""
    if v == 0:
        return "0"
    return format(decimal.Decimal(repr(float(v))), "f")


def cell(v):
    """One CSV cell: numbers plain, text quoted when it holds a comma, quote or newline."""
    if isinstance(v, str):
        if any(c in v for c in ',"\n\r'):
            return '"' + v.replace('"', '""') + '"'
        return v
    return plain(v)


def rfc3339_utc(unix_s):
    """RFC 3339 UTC with microseconds, e.g. 2026-11-22T08:15:02.123456Z."""
    t = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def create_exclusive(path):
    """Opens `path` for appending only when nothing is there (never through a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o644)


class CsvFile:
    """A CSV file created exclusively; each row is one `write` of the whole line."""

    def __init__(self, path, columns):
        self.path = path
        self.fd = create_exclusive(path)
        self._write(",".join(columns))

    def _write(self, line):
        data = (line + "\n").encode()
        written = os.write(self.fd, data)
        if written != len(data):
            raise OSError(f"cannot write a whole row to {self.path} (is the file system full?)")

    def row(self, values):
        self._write(",".join(cell(v) for v in values))

    def sync(self):
        os.fsync(self.fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def write_atomic(path, text):
    """Writes `text` to `path` through a temporary file in the same folder, synced before
    the rename, so a reader sees the old file or the new one, whole."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def write_json(path, value):
    write_atomic(path, json.dumps(value, indent=2) + "\n")

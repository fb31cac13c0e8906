#!/usr/bin/env python3
"""Draws a merged timeline.json (written by `ddpbench trace RUN_DIR`) as a PNG: one band
per rank, one row per track (steps and phases, all-reduce, hand-over), the slices of
the chosen steps at their true times on the common clock. It draws what the file says
and nothing else: no slice is moved, merged or invented.

Usage: python docs/render_timeline.py RUN_DIR/timeline.json OUT.png [--steps A:B] [--title TEXT]

Needs Pillow (in the venv job-scripts/setup.sh makes: `$DDPBENCH_PYTHON -m pip install
pillow` if it is missing) and the DejaVu Sans font (`fonts-dejavu-core`, which setup.sh
installs). Prints, per step shown, when each rank's first all-reduce started and how
long each rank's exposed communication lasted, in ms: the numbers the picture shows.
"""

import argparse
import json
import sys

try:
    from PIL import Image, ImageDraw, ImageFont
except ImportError:
    sys.exit("render_timeline.py needs Pillow: $DDPBENCH_PYTHON -m pip install pillow")

FONT_PATH = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
WIDTH_PX = 1400
LEFT_PX = 250
RIGHT_PX = 30
ROW_PX = 26
COLOURS = {
    "ProfilerStep": "#d9d9d9",
    "data": "#8c564b",
    "batch_copy": "#c49c94",
    "forward": "#ff7f0e",
    "backward": "#2ca02c",
    "comm_exposed": "#d62728",
    "optimizer": "#9467bd",
    "other": "#bcbd22",
    "validation": "#7f7f7f",
    "all-reduce": "#1f77b4",
    "exposed": "#d62728",
    "hand-over": "#17becf",
}
LEGEND = ["forward", "backward", "comm_exposed", "optimizer", "data", "other", "all-reduce", "hand-over"]


def colour(name):
    for key, c in COLOURS.items():
        if name.startswith(key):
            return c
    return "#aaaaaa"


def font(size):
    try:
        return ImageFont.truetype(FONT_PATH, size)
    except OSError:
        sys.exit(f"render_timeline.py needs {FONT_PATH} (Debian: apt-get install fonts-dejavu-core)")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names, threads, slices = {}, {}, []
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            slices.append(e)
    return names, threads, slices


def window(slices, steps):
    """The time span of ProfilerStep#A..#B over every rank."""
    a, b = steps
    chosen = [e for e in slices if e["name"].startswith("ProfilerStep#") and a <= int(e["name"].split("#")[1]) <= b]
    if not chosen:
        sys.exit(f"no ProfilerStep#{a}..#{b} in the timeline")
    return min(e["ts"] for e in chosen), max(e["ts"] + e["dur"] for e in chosen)


def depths(track):
    """Nesting depth of each slice of one track (a slice inside another is one deeper)."""
    track = sorted(track, key=lambda e: (e["ts"], -e["dur"]))
    open_ends, out = [], []
    for e in track:
        # Phases end where the next begins, up to the clock's rounding: 1 µs.
        open_ends = [end for end in open_ends if end > e["ts"] + 1.0]
        out.append((len(open_ends), e))
        open_ends.append(e["ts"] + e["dur"])
    return out


def tick_step_ms(span_ms):
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        if span_ms / step <= 12:
            return step
    return 10000


def allreduce_starts(slices, step):
    """When each rank (pid) started its first all-reduce of `step`."""
    starts = {}
    for e in slices:
        if e["name"].startswith("all-reduce") and e.get("args", {}).get("step") == step:
            starts[e["pid"]] = min(starts.get(e["pid"], float("inf")), e["ts"])
    return starts


def report(slices, steps, names):
    """Per step: each rank's first all-reduce start and its exposed communication, in ms."""
    origin = min(e["ts"] for e in slices)
    for step in range(steps[0], steps[1] + 1):
        starts, exposed = allreduce_starts(slices, step), {}
        step_spans = {
            e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in slices if e["name"] == f"ProfilerStep#{step}"
        }
        for e in slices:
            span = step_spans.get(e["pid"])
            if e["name"] == "comm_exposed" and span and span[0] <= e["ts"] < span[1]:
                exposed[e["pid"]] = exposed.get(e["pid"], 0.0) + e["dur"]
        cells = ", ".join(
            f"rank {pid}: all-reduce at {(starts[pid] - origin) / 1e3:.1f} ms, exposed {exposed.get(pid, 0) / 1e3:.1f} ms"
            for pid in sorted(starts)
        )
        last = max(starts, key=starts.get) if starts else None
        print(f"step {step}: {cells}; last to start: {names.get(last, last)}")


def summary(slices, names):
    """Over every traced step: how often each rank's all-reduce started last."""
    steps = sorted({e["args"]["step"] for e in slices if e["name"].startswith("all-reduce") and "step" in e.get("args", {})})
    last = {}
    for step in steps:
        starts = allreduce_starts(slices, step)
        if len(starts) > 1:
            pid = max(starts, key=starts.get)
            last[pid] = last.get(pid, 0) + 1
    cells = ", ".join(f"{names.get(pid, pid).split(' · ')[0]} in {n}" for pid, n in sorted(last.items()))
    print(f"all {len(steps)} traced steps: the all-reduce started last on {cells}")


def draw(names, threads, slices, steps, out, title):
    t0, t1 = window(slices, steps)
    span = t1 - t0
    plot_w = WIDTH_PX - LEFT_PX - RIGHT_PX
    x = lambda ts: LEFT_PX + (ts - t0) / span * plot_w
    tracks = sorted({(e["pid"], e["tid"]) for e in slices})
    rows = []
    for pid, tid in tracks:
        inside = [e for e in slices if (e["pid"], e["tid"]) == (pid, tid) and e["ts"] < t1 and e["ts"] + e["dur"] > t0]
        nested = depths(inside)
        rows.append((pid, tid, nested, 1 + max((d for d, _ in nested), default=0)))
    title_h, axis_h, legend_h = 40, 34, 40
    height = title_h + axis_h + sum(n * ROW_PX + 8 for *_, n in rows) + 12 * len(names) + legend_h
    img = Image.new("RGB", (WIDTH_PX, height), "white")
    g = ImageDraw.Draw(img)
    small, normal, bold = font(11), font(13), font(15)
    what = f": {title}" if title else ""
    g.text((12, 10), f"ddpbench trace: steps {steps[0]}-{steps[1]} of a {len(names)}-rank run{what}", fill="black", font=bold)
    # Time axis, ms from the window's start.
    y = title_h
    step_ms = tick_step_ms(span / 1e3)
    for k in range(0, int(span / 1e3 / step_ms) + 1):
        tx = x(t0 + k * step_ms * 1e3)
        g.line([(tx, y + 18), (tx, height - legend_h)], fill="#eeeeee")
        g.text((tx, y + 4), f"{k * step_ms} ms", fill="#444444", font=small, anchor="mt")
    y += axis_h
    last_pid, tops, bottoms = None, {}, {}
    for pid, tid, nested, n in rows:
        if pid != last_pid:
            if last_pid is not None:
                y += 12
                g.line([(12, y - 6), (WIDTH_PX - RIGHT_PX, y - 6)], fill="#999999")
            rank, _, where = names.get(pid, f"rank {pid}").partition(" · ")
            g.text((12, y), rank, fill="black", font=bold)
            g.text((80, y + 3), where.split(" · ")[0][:24], fill="#444444", font=small)
            last_pid = pid
        label = threads.get((pid, tid), f"track {tid}").split(":")[0]
        g.text((24, y + 20), label, fill="#444444", font=small)
        tops[pid] = min(tops.get(pid, y), y)
        bottoms[pid] = y + n * ROW_PX
        for d, e in nested:
            x0, x1 = max(x(e["ts"]), LEFT_PX), min(x(e["ts"] + e["dur"]), WIDTH_PX - RIGHT_PX)
            top = y + d * ROW_PX + 2
            g.rectangle([x0, top, max(x1, x0 + 2), top + ROW_PX - 4], fill=colour(e["name"]), outline="white")
            text = e["name"]
            if g.textlength(text, font=small) < x1 - x0 - 6:
                g.text((x0 + 3, top + (ROW_PX - 4) / 2), text, fill="black", font=small, anchor="lm")
        y += n * ROW_PX + 8
    # Per step, a line at the last rank's all-reduce start, across every rank: until
    # then the others' all-reduce waits (their comm_exposed).
    for step in range(steps[0], steps[1] + 1):
        starts = allreduce_starts(slices, step)
        if len(starts) < 2:
            continue
        last = max(starts, key=starts.get)
        lx = x(starts[last])
        for py in range(title_h + axis_h, y, 8):
            g.line([(lx, py), (lx, min(py + 4, y))], fill="black", width=1)
        note = f"rank {last}'s all-reduce starts"
        right = lx + 3 + g.textlength(note, font=small) > WIDTH_PX - 4
        g.text((lx - 3 if right else lx + 3, title_h + axis_h - 12), note, fill="black", font=small, anchor="ra" if right else "la")
    # Legend.
    lx = LEFT_PX
    ly = height - legend_h + 12
    for name in LEGEND:
        g.rectangle([lx, ly, lx + 16, ly + 12], fill=COLOURS[name])
        g.text((lx + 22, ly + 6), name, fill="black", font=normal, anchor="lm")
        lx += 34 + g.textlength(name, font=normal)
    img.save(out, optimize=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline", help="RUN_DIR/timeline.json from `ddpbench trace RUN_DIR`")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("--steps", default="6:8", help="global steps A:B to draw (default 6:8)")
    p.add_argument("--title", default="", help="what the run was, after the picture's title")
    a = p.parse_args()
    try:
        steps = tuple(int(s) for s in a.steps.split(":"))
        assert len(steps) == 2 and steps[0] <= steps[1]
    except (ValueError, AssertionError):
        sys.exit(f"--steps wants A:B with A <= B, got {a.steps!r}")
    names, threads, slices = load(a.timeline)
    report(slices, steps, names)
    summary(slices, names)
    draw(names, threads, slices, steps, a.out, a.title)


if __name__ == "__main__":
    main()

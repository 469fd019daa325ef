#!/usr/bin/env python3
"""Where a rank's link worked and idled, step by step, from its chunk event
log (`pstar train --chunk-events FILE` with several ranks: FILE.rank<K>).

Per step (from one step_begin to the next): the step time; the link's busy
time (the union of gather and reduce-scatter spans); its idle time split
into the head (step_begin to the first collective), the gaps between
collectives, and the tail (the last collective's end to the next
step_begin); and the spans of the step's optimizer updates and of the
main thread's uses. Prints one line per step and the medians over the
steps after the first.

Usage: bench/collective_timeline.py FILE [--steps-from K] [--gaps N]
  --gaps N also lists each step's N longest idle gaps with the events
  around them.
"""
import csv
import statistics
import sys

COLLECTIVE = {"gather_begin": ("gather", True), "gather_end": ("gather", False),
              "reduce_scatter_begin": ("reduce_scatter", True), "reduce_scatter_end": ("reduce_scatter", False)}


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["time_s"] = float(r["time_s"])
        r["chunk"] = int(r["chunk"])
    rows.sort(key=lambda r: (r["time_s"], int(r["seq"])))
    return rows


def intervals(rows):
    """(begin, end, op, chunk) of every collective, in begin order."""
    open_at, out = {}, []
    for r in rows:
        kind = COLLECTIVE.get(r["event"])
        if kind is None:
            continue
        op, begins = kind
        if begins:
            open_at[op] = (r["time_s"], r["chunk"])
        elif op in open_at:
            t0, chunk = open_at.pop(op)
            out.append((t0, r["time_s"], op, chunk))
    out.sort()
    return out


def clip(spans, lo, hi):
    return [(max(a, lo), min(b, hi), op, c) for a, b, op, c in spans if b > lo and a < hi]


def union_length(spans):
    total, end = 0.0, None
    for a, b, _, _ in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    path, first, show_gaps = argv[0], 1, 0
    i = 1
    while i < len(argv):
        if argv[i] == "--steps-from" and i + 1 < len(argv):
            first, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--gaps" and i + 1 < len(argv):
            show_gaps, i = int(argv[i + 1]), i + 2
        else:
            print("collective_timeline: unknown argument %r" % argv[i], file=sys.stderr)
            return 2
    try:
        rows = read(path)
    except (OSError, KeyError, ValueError) as e:
        print("collective_timeline: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 2
    begins = [r["time_s"] for r in rows if r["event"] == "step_begin"]
    spans = intervals(rows)
    if len(begins) < 2 or not spans:
        print("collective_timeline: %s has under two steps or no collective events "
              "(a run of one rank records none)" % path, file=sys.stderr)
        return 2
    cols = ["step", "step_s", "busy_s", "idle_s", "head_s", "gaps_s", "tail_s", "gather_s", "reduce_s",
            "update_s", "uses_s"]
    print(" ".join("%9s" % c for c in cols))
    table = []
    for k in range(len(begins) - 1):
        lo, hi = begins[k], begins[k + 1]
        inside = clip(spans, lo, hi)
        busy = union_length(inside)
        head = (inside[0][0] - lo) if inside else hi - lo
        tail = (hi - max(b for _, b, _, _ in inside)) if inside else 0.0
        idle = (hi - lo) - busy
        gaps = max(0.0, idle - head - tail)
        gather = union_length([s for s in inside if s[2] == "gather"])
        reduce = union_length([s for s in inside if s[2] == "reduce_scatter"])
        ups = [r["time_s"] for r in rows if lo <= r["time_s"] < hi and r["event"] in ("update_begin", "update_end")]
        uses = [r["time_s"] for r in rows if lo <= r["time_s"] < hi and r["event"] in ("forward_use", "backward_use")]
        update = (max(ups) - min(ups)) if ups else 0.0
        use_span = (max(uses) - min(uses)) if uses else 0.0
        row = [hi - lo, busy, idle, head, gaps, tail, gather, reduce, update, use_span]
        table.append(row)
        print("%9d " % k + " ".join("%9.4f" % v for v in row))
        if show_gaps:
            holes, end = [], lo
            for a, b, op, c in inside:
                if a > end:
                    holes.append((a - end, end, a))
                end = max(end, b)
            if hi > end:
                holes.append((hi - end, end, hi))
            for length, a, b in sorted(holes, reverse=True)[:show_gaps]:
                around = [r for r in rows if a - 1e-9 <= r["time_s"] <= b + 1e-9 and r["event"] not in COLLECTIVE]
                what = ", ".join("%s %d @%+.4f" % (r["event"], r["chunk"], r["time_s"] - lo) for r in around[:6])
                print("          idle %.4f s at %+.4f: %s%s" % (length, a - lo, what, " ..." if len(around) > 6 else ""))
    later = table[first:] if len(table) > first else table
    print("median    " + " ".join("%9.4f" % statistics.median(c) for c in zip(*later)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

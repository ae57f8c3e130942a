"""Statistics, parsing and the figure of real-gpu/lab, kept free of GPUs and
processes so that they are tested on their own (real-gpu/test_labstats.py).

Intervals are percentile bootstraps with a fixed seed (the same numbers on
every run of the same data): two stages for latency ratios (repeats resampled
with replacement, then the requests of each chosen repeat's shared and alone
windows), one stage for the trainer's fraction of its solo speed (repeats
only: one rate per window, so with three repeats the interval cannot be wider
than their range). The point estimate is the geometric mean over repeats of
each repeat's own ratio (shared / alone of the same repeat).
"""
import math
import random

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))


def quantile(sorted_ms, p):
    """The p-quantile of an ascending list, as workload.py reports it (the
    element at index floor(p * n), clamped); None for an empty list."""
    if not sorted_ms:
        return None
    return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]


def read_latency_log(path):
    """`<due, Unix s> <latency ms>` lines -> [(due, ms)]; a torn last line
    (the writer still running) is skipped."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 2:
                continue
            try:
                out.append((float(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return out


def window(log, t0, t1):
    """Latencies (ascending) of the requests due in [t0, t1)."""
    return sorted(ms for due, ms in log if t0 <= due < t1)


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _percentiles(values, lo=0.025, hi=0.975):
    v = sorted(values)
    if not v:
        return None, None
    return v[int(lo * (len(v) - 1))], v[int(math.ceil(hi * (len(v) - 1)))]


def latency_ratios(pairs, boot=1000, seed=1):
    """pairs: [(shared latencies, alone latencies)] one per repeat, each
    ascending. Returns {name: (point, lo, hi)} for p50/p95/p99 of shared /
    alone; None entries where a window is empty."""
    pairs = [(s, a) for s, a in pairs if s and a]
    if not pairs:
        return {name: (None, None, None) for name, _ in QUANTILES}
    point = {
        name: geomean([quantile(s, p) / quantile(a, p) for s, a in pairs if quantile(a, p) > 0])
        for name, p in QUANTILES
    }
    rng = random.Random(seed)
    reps = {name: [] for name, _ in QUANTILES}
    for _ in range(boot):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        per = {name: [] for name, _ in QUANTILES}
        for s, a in chosen:
            # One resample of each window serves all three quantiles.
            rs = sorted(rng.choices(s, k=len(s)))
            ra = sorted(rng.choices(a, k=len(a)))
            for name, p in QUANTILES:
                qa = quantile(ra, p)
                if qa > 0:
                    per[name].append(quantile(rs, p) / qa)
        for name, _ in QUANTILES:
            g = geomean(per[name])
            if g is not None:
                reps[name].append(g)
    out = {}
    for name, _ in QUANTILES:
        lo, hi = _percentiles(reps[name])
        out[name] = (point[name], lo, hi)
    return out


def rate_ratio(pairs, boot=1000, seed=1):
    """pairs: [(shared rate, solo rate)] one per repeat. Returns (point, lo,
    hi) of shared / solo: the arithmetic mean over repeats, repeats
    resampled. Arithmetic, not geometric: a window in which the trainer
    finished no step is a fraction of 0, which a geometric mean can only
    drop (and so report the trainer faster than it ran)."""
    ratios = [s / solo for s, solo in pairs if s is not None and solo]
    if not ratios:
        return None, None, None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    rng = random.Random(seed)
    reps = [mean([ratios[rng.randrange(len(ratios))] for _ in ratios]) for _ in range(boot)]
    lo, hi = _percentiles(reps)
    return mean(ratios), lo, hi


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def case_line(case, fields, ratios=None, trainer=None):
    """One `key=value` line for a case: its own fields, then each latency
    ratio with its interval (`<q>_x`, `<q>_lo`, `<q>_hi`) and the trainer's
    fraction of its solo speed (`trainer_of_solo`, `_lo`, `_hi`)."""
    parts = [f"case={case}"] + [f"{k}={v}" for k, v in fields.items()]
    if ratios is not None:
        for name, _ in QUANTILES:
            x, lo, hi = ratios[name]
            parts += [f"{name}_x={fmt(x)}", f"{name}_lo={fmt(lo)}", f"{name}_hi={fmt(hi)}"]
    if trainer is not None:
        x, lo, hi = trainer
        parts += [f"trainer_of_solo={fmt(x)}", f"trainer_lo={fmt(lo)}", f"trainer_hi={fmt(hi)}"]
    return " ".join(parts)


def parse_kv(line):
    """A `key=value ...` line -> dict (values as strings)."""
    out = {}
    for part in line.split():
        k, sep, v = part.partition("=")
        if sep:
            out[k] = v
    return out


def svg(rows, title):
    """The figure: per case, the online p99 ratio (bar) with its interval
    (whisker) and the trainer's fraction of its solo speed (dot with its
    interval). rows: parsed case lines with available=yes and a p99_x.
    Plain SVG, no plotting library (none on the build machine)."""
    rows = [r for r in rows if r.get("p99_x", "-") != "-"]
    w, h, left, top, bottom = max(360, 60 + 70 * len(rows)), 360, 50, 40, 110
    ph = h - top - bottom
    ymax = max([2.0] + [float(r.get("p99_hi", "0").replace("-", "0") or 0) for r in rows]) * 1.1

    def y(v):
        return top + ph * (1 - min(v, ymax) / ymax)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13">{title}</text>',
        f'<line x1="{left}" y1="{y(1)}" x2="{w - 10}" y2="{y(1)}" stroke="#999" stroke-dasharray="4 3"/>',
        f'<text x="4" y="{y(1) + 4}">x1.0</text>',
        f'<text x="4" y="{y(ymax / 1.1) + 4}">x{ymax / 1.1:.1f}</text>',
    ]
    for i, r in enumerate(rows):
        cx = left + 35 + 70 * i
        x = float(r["p99_x"])
        out.append(f'<rect x="{cx - 14}" y="{y(x)}" width="28" height="{y(0) - y(x)}" fill="#4878a8"/>')
        if r.get("p99_lo", "-") != "-":
            lo, hi = float(r["p99_lo"]), float(r["p99_hi"])
            out.append(f'<line x1="{cx}" y1="{y(lo)}" x2="{cx}" y2="{y(hi)}" stroke="black"/>')
        if r.get("trainer_of_solo", "-") != "-":
            t = float(r["trainer_of_solo"])
            out.append(f'<circle cx="{cx + 20}" cy="{y(t)}" r="4" fill="#3a9a4a"/>')
            if r.get("trainer_lo", "-") != "-":
                lo, hi = float(r["trainer_lo"]), float(r["trainer_hi"])
                out.append(f'<line x1="{cx + 20}" y1="{y(lo)}" x2="{cx + 20}" y2="{y(hi)}" stroke="#3a9a4a"/>')
        label = r["case"]
        out.append(
            f'<text transform="translate({cx},{h - bottom + 12}) rotate(40)" font-size="10">{label}</text>'
        )
    out.append(
        f'<text x="{left}" y="{h - 8}">bars: online p99 shared / alone (same repeat), whiskers: 95 % bootstrap; '
        "green: trainer / its solo speed</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"

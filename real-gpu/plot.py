#!/usr/bin/env python3
"""The figure of real-gpu/run: online latency (p50, p99) and offline
steps/s per case, from its results.txt (one `case=... key=value` line each).

  python3 real-gpu/plot.py RESULTS.txt OUT.svg
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    rows = []
    for line in open(path):
        if not line.startswith("case="):
            continue
        kv = {}
        for tok in line.split():
            if "=" in tok and not tok.startswith("xcuda="):
                k, v = tok.split("=", 1)
                kv[k] = v
        rows.append(kv)
    return rows


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def grouped(rows, key):
    """Per case, in first-seen order: (median, low, high) of `key` over its runs."""
    out = {}
    for r in rows:
        v = num(r.get(key))
        if v is not None:
            out.setdefault(r["case"], []).append(v)
    stats = []
    for case, vs in out.items():
        vs.sort()
        stats.append((case, vs[len(vs) // 2], vs[0], vs[-1], len(vs)))
    return stats


def bars(ax, stats, offset, width, label=None, color=None):
    x = [i + offset for i in range(len(stats))]
    med = [s[1] for s in stats]
    err = [[s[1] - s[2] for s in stats], [s[3] - s[1] for s in stats]]
    ax.bar(x, med, width, yerr=err, capsize=3, label=label, color=color)


def main():
    rows = read(sys.argv[1])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    p50, p99 = grouped(rows, "online_p50_ms"), grouped(rows, "online_p99_ms")
    bars(a1, p50, -0.2, 0.4, "p50")
    bars(a1, p99, 0.2, 0.4, "p99")
    a1.set_xticks(range(len(p99)), [f"{s[0]} (n={s[4]})" for s in p99], rotation=25, ha="right", fontsize=8)
    a1.set_ylabel("online request latency, ms (open loop)")
    a1.set_title("online: ResNet-50 inference, Poisson arrivals")
    a1.legend()
    steps = grouped(rows, "offline_steps_per_s")
    bars(a2, steps, 0.0, 0.5, color="tab:green")
    a2.set_xticks(range(len(steps)), [f"{s[0]} (n={s[4]})" for s in steps], rotation=25, ha="right", fontsize=8)
    a2.set_ylabel("offline training steps/s")
    a2.set_title("offline: ResNet-50 training")
    fig.suptitle("muxflow on one real GPU (real-gpu/run; bars: median, whiskers: min-max over runs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2])


if __name__ == "__main__":
    main()

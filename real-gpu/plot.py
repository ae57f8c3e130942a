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


def main():
    rows = read(sys.argv[1])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    on = [r for r in rows if num(r.get("online_p99_ms")) is not None]
    names = [r["case"] for r in on]
    x = range(len(on))
    a1.bar([i - 0.2 for i in x], [num(r["online_p50_ms"]) for r in on], 0.4, label="p50")
    a1.bar([i + 0.2 for i in x], [num(r["online_p99_ms"]) for r in on], 0.4, label="p99")
    a1.set_xticks(list(x), names, rotation=25, ha="right", fontsize=8)
    a1.set_ylabel("online request latency, ms (open loop)")
    a1.set_title("online: ResNet-50 inference, Poisson arrivals")
    a1.legend()
    off = [r for r in rows if num(r.get("offline_steps_per_s")) is not None]
    x2 = range(len(off))
    a2.bar(list(x2), [num(r["offline_steps_per_s"]) for r in off], 0.5, color="tab:green")
    a2.set_xticks(list(x2), [r["case"] for r in off], rotation=25, ha="right", fontsize=8)
    a2.set_ylabel("offline training steps/s")
    a2.set_title("offline: ResNet-50 training")
    fig.suptitle("muxflow on one real GPU (real-gpu/run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2])


if __name__ == "__main__":
    main()

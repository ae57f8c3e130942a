#!/usr/bin/env python3
"""PyTorch workloads for real-gpu/run: an online inference service, an
offline trainer, and a check of xCUDA's memory cap. Each prints one
`key=value` line starting `mode=`.

  online  --rate R | --load L   inference (fp16, batch --batch) of --model:
                                resnet50 (torchvision) or bert (a BERT-base
                                encoder, random weights, 128 tokens), Poisson
                                arrivals from --seed, open loop: latency counts
                                the wait behind earlier requests. --load L sets
                                the rate to L / (solo service time).
                                --latency-log F appends `<due, Unix s> <ms>` per
                                request; while --pause-file exists, requests
                                falling due are dropped (real-gpu/lab).
  offline                       ResNet-50 training steps back to back (fp16
                                autocast, SGD), steps/s over --duration;
                                --progress F rewrites `step=N` after each step;
                                no step starts while --pause-file exists.
  captest --cap-mib C           allocations under a cap of C MiB (run with
                                xCUDA preloaded): inside it, beyond it, after a free.
"""
import argparse
import os
import random
import signal
import sys
import time


def wait_for_start(a):
    """Sleeps until --start-at (Unix time), so that the processes of one
    case measure over the same window; says so when warm-up ran past it."""
    if a.start_at is None:
        return
    left = a.start_at - time.time()
    if left > 0:
        time.sleep(left)
    else:
        print(f"late_s={-left:.2f} (warm-up ran past --start-at)", file=sys.stderr, flush=True)


def model(train):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    if not train:
        m = m.half().eval()
    return m


def service(a):
    """The online model and one batch of input for it."""
    import torch

    if a.model == "bert":
        import transformers

        # BERT-base's shape (12 layers, hidden 768, 12 heads) with random
        # weights: what matters here is its kernels, not what it learned.
        m = transformers.BertModel(transformers.BertConfig()).cuda().half().eval()
        x = torch.randint(0, m.config.vocab_size, (a.batch, 128), device="cuda")
        return (lambda: m(input_ids=x)), m
    m = model(train=False)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda", dtype=torch.half)
    x = x.to(memory_format=torch.channels_last)
    return (lambda: m(x)), m


def online(a):
    import torch

    run, _m = service(a)
    with torch.inference_mode():
        for _ in range(30):
            run()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            run()
            torch.cuda.synchronize()
        service_s = (time.perf_counter() - t) / 50
        rate = a.rate if a.rate else a.load / service_s
        rng = random.Random(a.seed)
        arrivals, t = [], 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= a.duration:
                break
            arrivals.append(t)
        lat = []
        print(f"mode=online-ready rate={rate:.2f} service_ms={service_s * 1e3:.3f}", flush=True)
        wait_for_start(a)
        log = open(a.latency_log, "a", buffering=1) if a.latency_log else None
        t0 = time.perf_counter()
        t0_unix = time.time()
        for at in arrivals:
            wait = at - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            if a.pause_file and os.path.exists(a.pause_file):
                continue
            run()
            torch.cuda.synchronize()
            lat.append(time.perf_counter() - t0 - at)
            if log:
                log.write(f"{t0_unix + at:.6f} {lat[-1] * 1e3:.3f}\n")
    lat = lat or [0.0]
    lat.sort()

    def q(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3

    print(
        f"mode=online requests={len(lat)} rate={rate:.2f} service_ms={service_s * 1e3:.3f} "
        f"p50_ms={q(0.50):.3f} p99_ms={q(0.99):.3f} max_ms={lat[-1] * 1e3:.3f}",
        flush=True,
    )


def offline(a):
    import torch

    m = model(train=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()

    stop = []
    if a.checkpoint:
        # Checkpoint on SIGTERM (README, "Checkpoint on requeue"): the handler
        # only notes it; the save runs between steps, on the GPU xCUDA
        # keeps usable until its stop deadline.
        signal.signal(signal.SIGTERM, lambda sig, frame: stop.append(sig))
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print("mode=offline-ready", flush=True)
    wait_for_start(a)
    steps, t = 0, time.perf_counter()
    while time.perf_counter() - t < a.duration and not stop:
        if a.pause_file and os.path.exists(a.pause_file):
            time.sleep(0.005)
            continue
        step()
        torch.cuda.synchronize()
        steps += 1
        if a.progress:
            with open(a.progress + ".tmp", "w") as f:
                f.write(f"step={steps}\n")
            os.replace(a.progress + ".tmp", a.progress)
    if stop:
        tmp = a.checkpoint + ".tmp"
        torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "step": steps}, tmp)
        os.replace(tmp, a.checkpoint)
        print(f"mode=offline-checkpoint step={steps}", flush=True)
        sys.exit(0)  # atexit: xCUDA releases the contexts before the process goes
    el = time.perf_counter() - t
    print(f"mode=offline steps={steps} seconds={el:.3f} steps_per_s={steps / el:.3f}", flush=True)


def captest(a):
    import torch

    mib = 1 << 20
    free, total = torch.cuda.mem_get_info()
    out = [f"mem_get_info_total_mib={total // mib}", f"mem_get_info_free_mib={free // mib}"]

    def alloc(name, n_mib):
        try:
            t = torch.empty(n_mib * mib, dtype=torch.uint8, device="cuda")
            out.append(f"{name}=ok")
            return t
        except torch.OutOfMemoryError as e:
            out.append(f"{name}=refused")
            print(f"{name}: {str(e).splitlines()[0]}", file=sys.stderr)
            return None

    inside = alloc(f"alloc_{a.cap_mib // 2}mib", a.cap_mib // 2)
    alloc(f"alloc_{a.cap_mib}mib_more", a.cap_mib)
    del inside
    torch.cuda.empty_cache()
    alloc(f"after_free_alloc_{a.cap_mib * 3 // 4}mib", a.cap_mib * 3 // 4)
    print("mode=captest " + " ".join(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["online", "offline", "captest"])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--rate", type=float)
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch", type=int)
    p.add_argument("--model", choices=["resnet50", "bert"], default="resnet50", help="online: the service")
    p.add_argument("--latency-log", help="online: append `<due, Unix s> <latency ms>` per request")
    p.add_argument("--pause-file", help="online: drop requests falling due while this file exists; "
                   "offline: start no step while it exists")
    p.add_argument("--progress", help="offline: rewrite `step=N` here after every step")
    p.add_argument("--cap-mib", type=int, default=2048)
    p.add_argument("--start-at", type=float, help="Unix time at which to start measuring")
    p.add_argument("--checkpoint", help="offline: on SIGTERM save the model and step here, then exit 0")
    a = p.parse_args()
    if a.batch is None:
        a.batch = 16 if a.mode == "online" else 64
    {"online": online, "offline": offline, "captest": captest}[a.mode](a)


if __name__ == "__main__":
    main()

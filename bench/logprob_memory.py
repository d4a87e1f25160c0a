"""Peak memory of token logprobs, forward + backward: vocabulary-chunked vs full logits.

Variants (same random hidden states ``[T, H]``, LM-head weight ``[V, H]`` and targets):

  full          logits = h @ W.T (fp32 [T, V]) -> log_softmax -> gather   (the usual path)
  full_ce       the same through F.cross_entropy (fused log_softmax + nll)
  chunked       ludic_lab.training.logprobs.token_logprobs (running log-sum-exp over vocab
                chunks in forward, chunk logits recomputed in backward)
  *+entropy     the same, also returning the per-position entropy (gradient through both)

How memory is measured, honestly on a CPU: torch's CPU allocator is plain malloc, which
tracemalloc does not see, so each variant runs in a *fresh subprocess* that builds its
inputs, then resets the kernel's peak-RSS counter (``/proc/self/clear_refs`` <- 5; falls back
to ``getrusage`` max RSS when that is not allowed), runs forward + backward once and reads
the peak (``VmHWM``). Reported: peak minus the RSS just before the run, i.e. everything the
computation itself needed (activations, temporaries, and the ``[V, H]`` weight gradient,
which both paths produce). The target is chunked / full <= 0.5.

    .venv/bin/python bench/logprob_memory.py [--V 128256] [--T 2048] [--H 512] [--chunk 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("full", "full_ce", "chunked", "full+entropy", "chunked+entropy")


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def worker(variant: str, V: int, T: int, H: int, chunk: int, threads: int) -> dict:
    """Run one variant once in this process and return its peak-memory delta (MiB) and time."""
    import torch
    import torch.nn.functional as F

    from ludic_lab.training.logprobs import full_logits_token_logprobs, token_logprobs

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, H, generator=g).requires_grad_(True)
    W = (torch.randn(V, H, generator=g) * H**-0.5).requires_grad_(True)
    t = torch.randint(0, V, (T,), generator=g)
    ent_w = 0.01
    base = _rss_kb()
    exact = _reset_peak()
    before_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if variant == "full":
        loss = full_logits_token_logprobs(h, W, t).sum()
    elif variant == "full_ce":
        loss = -F.cross_entropy(h @ W.T, t, reduction="sum")
    elif variant == "chunked":
        loss = token_logprobs(h, W, t, chunk_size=chunk).sum()
    elif variant == "full+entropy":
        lp, ent = full_logits_token_logprobs(h, W, t, return_entropy=True)
        loss = lp.sum() + ent_w * ent.sum()
    elif variant == "chunked+entropy":
        lp, ent = token_logprobs(h, W, t, chunk_size=chunk, return_entropy=True)
        loss = lp.sum() + ent_w * ent.sum()
    else:
        raise SystemExit(f"unknown variant {variant!r}; choose from {VARIANTS}")
    loss.backward()
    dt = time.perf_counter() - t0
    peak = _hwm_kb() if exact else max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, before_max)
    return {
        "variant": variant,
        "peak_delta_mib": (peak - base) / 1024,
        "seconds": dt,
        "loss": float(loss),
        "grad_W_norm": float(W.grad.norm()),
        "exact_peak_reset": exact,
    }


def run_variant(variant: str, V: int, T: int, H: int, chunk: int, threads: int = 2) -> dict:
    """One variant in a fresh interpreter (so earlier runs' memory cannot hide its peak)."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        variant,
        "--V",
        str(V),
        "--T",
        str(T),
        "--H",
        str(H),
        "--chunk",
        str(chunk),
        "--threads",
        str(threads),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(
    V: int = 128256,
    T: int = 2048,
    H: int = 512,
    chunk: int = 4096,
    threads: int = 2,
    variants: tuple[str, ...] = VARIANTS,
) -> dict:
    """All variants; returns ``{"results": {variant: row}, "ratio": chunked / full, ...}``."""
    res = {v: run_variant(v, V, T, H, chunk, threads) for v in variants}
    out: dict = {"V": V, "T": T, "H": H, "chunk": chunk, "results": res}
    if "full" in res and "chunked" in res:
        out["ratio"] = res["chunked"]["peak_delta_mib"] / res["full"]["peak_delta_mib"]
        out["same_loss"] = abs(res["chunked"]["loss"] - res["full"]["loss"]) <= 1e-4 * abs(res["full"]["loss"])
    if "full+entropy" in res and "chunked+entropy" in res:
        out["ratio_entropy"] = res["chunked+entropy"]["peak_delta_mib"] / res["full+entropy"]["peak_delta_mib"]
    if "full_ce" in res and "chunked" in res:
        out["ratio_vs_cross_entropy"] = res["chunked"]["peak_delta_mib"] / res["full_ce"]["peak_delta_mib"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--V", type=int, default=128256)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--H", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", action="store_true", help="print the result dict as JSON only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.V, a.T, a.H, a.chunk, a.threads)))
        return
    r = measure(a.V, a.T, a.H, a.chunk, a.threads, tuple(v for v in a.variants.split(",") if v))
    if a.json:
        print(json.dumps(r))
        return
    mib = a.T * a.V * 4 / 2**20
    print(
        f"token logprobs fwd+bwd, V={a.V} T={a.T} H={a.H} chunk={a.chunk}  "
        f"(one fp32 [T, V] tensor = {mib:.0f} MiB; [V, H] weight grad = {a.V * a.H * 4 / 2**20:.0f} MiB)"
    )
    print(f"{'variant':<18}{'peak MiB':>10}{'seconds':>10}")
    for v, row in r["results"].items():
        print(f"{v:<18}{row['peak_delta_mib']:>10.0f}{row['seconds']:>10.2f}")
    if not all(row["exact_peak_reset"] for row in r["results"].values()):
        print("(peak from getrusage max RSS: /proc/self/clear_refs was not writable)")
    if "ratio" in r:
        ok = "OK" if r["ratio"] <= 0.5 else "ABOVE TARGET"
        print(f"chunked / full peak memory: {r['ratio']:.3f}  (target <= 0.5: {ok}); same loss: {r['same_loss']}")
    if "ratio_entropy" in r:
        print(f"with entropy:               {r['ratio_entropy']:.3f}")
    if "ratio_vs_cross_entropy" in r:
        print(f"chunked / full cross_entropy: {r['ratio_vs_cross_entropy']:.3f}")


if __name__ == "__main__":
    main()

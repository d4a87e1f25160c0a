"""Pipeline RL vs synchronous RL: wall time of N optimizer steps on the same model and task.

  sync       one process: each step generates its batch (``RolloutBatchSource`` over an
             in-process ``LocalChatClient``), then trains on it (``Trainer``), then copies
             the weights into the sampler — generation and training alternate
  pipelined  two processes joined by a real ``redis-server``: an actor (``run_pipeline_actor``,
             its own ``LocalChatClient``, loading the trainer's weights from Redis between
             rounds) and a trainer (``PipelineBatchSource`` + ``Trainer`` + ``RedisWeightsPublisher``);
             the actor generates batch k+1 while the trainer trains on batch k

Both sides use the same model, task (``ludic_lab.task.builtin``), algorithm, batch
(``--prompts`` x ``--group-size`` items) and trainer settings. Model loading is excluded:
each pipelined process loads its model, reports ready, and both start on a shared "go".
Both sides then run ``--warmup-steps`` untimed steps (first-call costs; for the pipeline also
the one generation that fills it) and time the next ``--steps``: steady-state throughput.
The trainer's idle fraction is its time waiting in ``next_batch`` over its wall time.
Every process reports its CPU time over the measured window, so the output says how busy
the machine's cores were: when sync already keeps all cores busy, overlapping cannot win
much, and the report shows it.

    .venv/bin/python bench/pipeline.py                        # SmolLM2 + LoRA, capitals (the demo's setup)
    .venv/bin/python bench/pipeline.py --model tiny --task digits --lora-r 0 --lr 1e-3 --steps 3   # quick check
    .venv/bin/python bench/pipeline.py --actor-threads 1 --trainer-threads 1 --sync-threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _trainer_config(a: argparse.Namespace) -> Any:
    from ludic_lab.training.config import TrainerConfig

    return TrainerConfig(
        lr=a.lr,
        max_seq_len=512,
        micro_token_budget=4096,
        seed=a.seed,
        max_lag=None if a.max_lag < 0 else a.max_lag,
        lora_r=a.lora_r,
        lora_alpha=None,  # 2 * lora_r
    )


def _load(a: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.local.client import LocalChatClient

    client = LocalChatClient(a.model, max_batch_size=a.prompts * a.group_size)
    policy = AutoModelForCausalLM.from_pretrained(client.model_path, dtype=torch.float32)
    return client, policy


def _cpu() -> float:
    return time.process_time()


# -- sync ---------------------------------------------------------------------------------------
async def run_sync_mode(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.task.builtin import bind_builtin_task
    from ludic_lab.training import Trainer
    from ludic_lab.training.algorithm import make_preset

    if a.sync_threads > 0:
        torch.set_num_threads(a.sync_threads)
    client, policy = _load(a)
    task = bind_builtin_task(a.task, client, prompts=a.prompts, max_tokens=a.max_tokens, seed=a.seed)
    algo = make_preset(a.algo, max_tokens=a.max_tokens)
    source = RolloutBatchSource(
        task.engine,
        task.requests_fn,
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(a.group_size, seed=a.seed),
    )
    trainer = Trainer(
        policy,
        algo,
        source,
        config=_trainer_config(a),
        publisher=ClientPublisher(client),
        pad_token_id=client.pad_token_id,
    )
    await trainer.train(a.warmup_steps, progress=False)  # first-call costs stay out of the timing
    c0, t0 = _cpu(), time.perf_counter()
    hist = await trainer.train(a.steps, progress=False)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    trainer.close()
    gen = sum(h.get("source/generation_s", 0.0) for h in hist)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "generation_s": gen,
        "train_s": wall - gen,
        "publish_s": sum(h.get("time/publish_s", 0.0) for h in hist),
        "reward_first": hist[0].get("reward_mean"),
        "reward_last": hist[-1].get("reward_mean"),
        "torch_threads": torch.get_num_threads(),
    }


# -- pipelined: the two roles (child processes) -------------------------------------------------
async def _gate(r: Any, prefix: str, role: str) -> None:
    """Report ready, then wait for the parent's go (model loading stays out of the timing)."""
    await r.set(f"{prefix}:ready:{role}", "1")
    while not await r.exists(f"{prefix}:go"):
        await asyncio.sleep(0.01)


async def run_actor_role(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ludic_lab.pipeline import QueueKeys, connect_redis, run_pipeline_actor
    from ludic_lab.pipeline.connection import close_client
    from ludic_lab.rollouts import GRPORequestStrategy
    from ludic_lab.task.builtin import bind_builtin_task
    from ludic_lab.training.algorithm import make_preset

    if a.actor_threads > 0:
        torch.set_num_threads(a.actor_threads)
    client, _ = _load(a)
    task = bind_builtin_task(a.task, client, prompts=a.prompts, max_tokens=a.max_tokens, seed=a.seed)
    algo = make_preset(a.algo, max_tokens=a.max_tokens)
    r = await connect_redis(a.redis_url)
    await _gate(r, a.prefix, "actor")
    stop = asyncio.Event()
    window: dict[str, float] = {}

    async def watch() -> None:  # CPU time over the trainer's measured window (after its warm-up)
        while not await r.exists(f"{a.prefix}:stop"):
            if "cpu0" not in window and await r.exists(f"{a.prefix}:window"):
                window["cpu0"] = _cpu()
            await asyncio.sleep(0.05)
        window["cpu1"] = _cpu()
        stop.set()

    watcher = asyncio.create_task(watch())
    c0, t0 = _cpu(), time.perf_counter()
    stats = await run_pipeline_actor(
        task.engine,
        task.requests_fn,
        algo.credit_assigner,
        a.redis_url,
        a.prefix,
        request_strategy=GRPORequestStrategy(a.group_size, seed=a.seed),
        client=client,
        weights_key=QueueKeys(a.prefix).weights,
        max_queue_items=a.max_queue_items,
        stop_event=stop,
        concurrency=a.prompts * a.group_size,
    )
    wall = time.perf_counter() - t0
    watcher.cancel()
    await close_client(r)
    cpu = window.get("cpu1", _cpu()) - window.get("cpu0", c0)
    return {"wall_s": wall, "cpu_s": cpu, "torch_threads": torch.get_num_threads(), **stats.as_dict()}


async def run_trainer_role(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ludic_lab.pipeline import PipelineBatchSource, QueueKeys, RedisWeightsPublisher, connect_redis
    from ludic_lab.pipeline.connection import close_client
    from ludic_lab.training import Trainer
    from ludic_lab.training.algorithm import make_preset

    if a.trainer_threads > 0:
        torch.set_num_threads(a.trainer_threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic_lab.inference.models import resolve_model

    path = resolve_model(a.model)  # the trainer samples nothing: no sampler copy of the model
    tok = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    algo = make_preset(a.algo, max_tokens=a.max_tokens)
    cfg = _trainer_config(a)
    source = PipelineBatchSource(a.redis_url, a.prefix, a.prompts * a.group_size, max_lag=cfg.max_lag)
    pub = RedisWeightsPublisher(a.redis_url, QueueKeys(a.prefix).weights)
    trainer = Trainer(
        policy,
        algo,
        source,
        config=cfg,
        publisher=pub,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    source.policy_version_fn = lambda: trainer.policy_version
    r = await connect_redis(a.redis_url)
    await _gate(r, a.prefix, "trainer")
    await trainer.train(a.warmup_steps, progress=False)  # includes filling the pipeline once
    await r.set(f"{a.prefix}:window", "1")
    c0, t0 = _cpu(), time.perf_counter()
    hist = await trainer.train(a.steps, progress=False)
    await source.ack()
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    pub.close()
    await source.aclose()
    trainer.close()
    await r.set(f"{a.prefix}:stop", "1")
    await close_client(r)
    wait = sum(h.get("time/data_s", 0.0) for h in hist)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "data_wait_s": wait,
        "idle_fraction": wait / wall,
        "publish_s": sum(h.get("time/publish_s", 0.0) for h in hist),
        "stale_dropped": source.counters["stale_dropped"],
        "lag_mean": _mean(h.get("source/lag_mean") for h in hist),
        "reward_first": hist[0].get("reward_mean"),
        "reward_last": hist[-1].get("reward_mean"),
        "torch_threads": torch.get_num_threads(),
    }


def _mean(xs: Any) -> float:
    v = [x for x in xs if isinstance(x, (int, float))]
    return sum(v) / len(v) if v else float("nan")


# -- pipelined: the parent ----------------------------------------------------------------------
def run_pipelined_mode(a: argparse.Namespace) -> dict[str, Any]:
    import redis

    from ludic_lab.net import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install -y redis-server)")
    tmp = Path(tempfile.mkdtemp(prefix="ludic-bench-redis-"))
    port = free_port()
    server = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    procs: list[subprocess.Popen] = []
    try:
        r = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        prefix = "bench"
        out = {role: tmp / f"{role}.json" for role in ("actor", "trainer")}
        base = [sys.executable, __file__, *sys.argv[1:], "--redis-url", url, "--prefix", prefix]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        for role in ("actor", "trainer"):
            procs.append(subprocess.Popen([*base, "--role", role, "--result", str(out[role])], env=env))
        while not all(r.exists(f"{prefix}:ready:{role}") for role in out):
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit("a pipelined process failed while loading")
            time.sleep(0.05)
        t0 = time.perf_counter()
        r.set(f"{prefix}:go", "1")
        for p in procs:
            if p.wait(timeout=3600) != 0:
                raise SystemExit(f"a pipelined process exited with {p.returncode}")
        res = {role: json.loads(f.read_text()) for role, f in out.items()}
        # N steps took the trainer's window (go -> last step done); the parent's wait also
        # includes both interpreters shutting down, reported separately
        res["wall_s"] = res["trainer"]["wall_s"]
        res["wall_incl_exit_s"] = time.perf_counter() - t0
        return res
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help='"default" (SmolLM2), "tiny" or a local folder')
    p.add_argument("--task", default="capitals", choices=("digits", "capitals"))
    p.add_argument("--algo", default="grpo")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps (after the warm-up steps)")
    p.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first (lazy init, pipeline fill)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (0 = full fine-tune)")
    p.add_argument("--max-lag", type=int, default=-1, help="-1 keeps every item (back-pressure bounds the lag)")
    p.add_argument("--max-queue-items", type=int, default=0, help="actor back-pressure (0 = two batches)")
    p.add_argument("--sync-threads", type=int, default=0, help="torch threads of the sync process (0 = default)")
    p.add_argument("--actor-threads", type=int, default=1)
    p.add_argument("--trainer-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--modes",
        default="sync,sync1,pipelined",
        help="sync (default threads), sync1 (sync on 1 thread: each phase's speed on the one core "
        "a pipelined role gets, for the overlap bound), pipelined",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    # internal: the pipelined roles
    p.add_argument("--role", choices=("actor", "trainer"), help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    # the stream counts items until they are trained, the batch in training included: two
    # batches let the actor generate batch k+1 while the trainer works on batch k
    a.max_queue_items = a.max_queue_items or 2 * a.prompts * a.group_size
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.role:
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
        fn = run_actor_role if a.role == "actor" else run_trainer_role

        async def role() -> dict[str, Any]:
            def dump() -> None:  # `kill -USR2 <pid>` prints every asyncio task's stack
                for t in asyncio.all_tasks():
                    t.print_stack(file=sys.stderr)

            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump)
            return await fn(a)

        Path(a.result).write_text(json.dumps(asyncio.run(role())))
        return

    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    res: dict[str, Any] = {
        "config": {k: v for k, v in vars(a).items() if k not in ("role", "redis_url", "prefix", "result")},
        "cores": cores,
        "load_avg_1min_at_start": load,
    }
    print(
        f"{cores} cores, 1-min load average {load:.2f} at start"
        + ("  (the machine is busy: ratios are unreliable)" if load > 0.5 * cores else "")
    )
    modes = a.modes.split(",")
    if "sync" in modes:
        s = res["sync"] = asyncio.run(run_sync_mode(a))
        print(
            f"sync       {s['wall_s']:7.1f} s for {a.steps} steps ({s['generation_s']:.1f} s generating, "
            f"{s['train_s']:.1f} s training; {s['torch_threads']} threads); CPU {s['cpu_s']:.1f} s = "
            f"{s['cpu_s'] / s['wall_s']:.2f} of {cores} cores busy"
        )
    if "sync1" in modes:
        import copy

        a1 = copy.copy(a)
        a1.sync_threads = 1
        s1 = res["sync1"] = asyncio.run(run_sync_mode(a1))
        print(
            f"sync1      {s1['wall_s']:7.1f} s for {a.steps} steps ({s1['generation_s']:.1f} s generating, "
            f"{s1['train_s']:.1f} s training; 1 thread); CPU {s1['cpu_s']:.1f} s"
        )
    if "pipelined" in modes:
        q = res["pipelined"] = run_pipelined_mode(a)
        act, tr = q["actor"], q["trainer"]
        busy = (act["cpu_s"] + tr["cpu_s"]) / q["wall_s"]
        print(
            f"pipelined  {q['wall_s']:7.1f} s for {a.steps} steps; trainer idle {100 * tr['idle_fraction']:.0f}% "
            f"(waiting for batches {tr['data_wait_s']:.1f} s), mean lag {tr['lag_mean']:.2f}, stale dropped "
            f"{tr['stale_dropped']}; trainer spent {tr['publish_s']:.1f} s writing weights to Redis"
        )
        print(
            f"           CPU: actor {act['cpu_s']:.1f} s ({act['torch_threads']} thr, generating "
            f"{act['generation_s']:.1f} s, back-pressure {act['backpressure_wait_s']:.1f} s), trainer "
            f"{tr['cpu_s']:.1f} s ({tr['torch_threads']} thr) = {busy:.2f} of {cores} cores busy"
        )
    if "sync" in res and "pipelined" in res:
        sp = res["sync"]["wall_s"] / res["pipelined"]["wall_s"]
        res["speedup"] = sp
        print(f"speedup    {sp:.2f}x (target >= 1.5x)")
        s = res["sync"]
        ideal = s["wall_s"] / max(s["generation_s"], s["train_s"])
        print(
            f"           perfect overlap at sync's per-phase speeds would give {ideal:.2f}x (max of generation "
            f"and training time); sync keeps {s['cpu_s'] / s['wall_s']:.2f} of {cores} cores busy, so the overlap "
            f"has {cores - s['cpu_s'] / s['wall_s']:.2f} idle cores to use"
        )
    if "sync" in res and "sync1" in res:
        s, s1 = res["sync"], res["sync1"]
        # the pipelined roles get one core each: a step can go no faster than the slower phase
        # at one thread; sync runs both phases on every core in turn
        bound = s["wall_s"] / max(s1["generation_s"], s1["train_s"])
        res["overlap_bound"] = bound
        g_scale, t_scale = s1["generation_s"] / max(s["generation_s"], 1e-9), s1["train_s"] / max(s["train_s"], 1e-9)
        print(
            f"bound      one core per role: at most {bound:.2f}x (sync's wall over the slower one-thread phase); "
            f"{cores} threads speed generation up {g_scale:.2f}x and training {t_scale:.2f}x over 1 thread"
        )
        # whatever the scheduling, N steps need at least their CPU work spread over every core;
        # one thread per phase is the most CPU-efficient way to do that work
        work = min(s["cpu_s"], s1["cpu_s"]) / cores
        res["work_bound"] = s["wall_s"] / work
        print(
            f"           any schedule on {cores} cores: at most {s['wall_s'] / work:.2f}x (the steps' CPU work, "
            f"{min(s['cpu_s'], s1['cpu_s']):.0f} s, spread perfectly over {cores} cores = {work:.0f} s)"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

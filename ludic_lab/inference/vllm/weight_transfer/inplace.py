"""In-place weight loading for vLLM's CPU workers: the fast path of a shared-memory update.

vLLM's ``reload_weights`` rebuilds every layer it reloads: it puts the layer's parameters back
on the meta device, materialises fresh tensors, loads into them, re-runs the layer's weight
processing and copies the result back. On CPU that costs ~14x a memcpy of the weights for
SmolLM2, most of it in fresh allocations. This loader does only what an update needs, with
vLLM's own code for the parts that matter:

- a linear layer whose weight vLLM packed for its CPU GEMM (oneDNN / AMX kernels keep only
  the packed copy and drop the plain weight): it gets the new weight -- a zero-copy view of
  the update file, fused q/k/v or gate/up read as one block when they lie back to back --
  and vLLM's ``process_weights_after_loading`` packs it again;
- plain parameters (norms, embeddings, biases): copied in place by the parameter's own
  ``weight_loader``; embedding-style layers are then re-packed for their GEMM (the output
  head at once; an input embedding, whose GEMM packing is only used if something calls it,
  on first use);
- anything else (another layer type, quantization, tensor parallelism, a name that does not
  resolve): no plan, and the caller uses ``reload_weights``.

Trust, but verify: the first time a set of names is loaded this way, the worker loads the
same file with vLLM's ``reload_weights`` too and compares: every parameter, and every
re-packed layer's output on a probe input, must be equal bit for bit. A difference disables
the fast path for the rest of the server's life (logged) and leaves vLLM's result in place.
Nothing loaded here may keep pointing into the update file (it is rewritten by the next
update): that is checked after every re-pack. Which module each name reaches is decided by
:mod:`ludic_lab.inference.vllm.weight_transfer.inplace_plan`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# build_plan is looked up in this module when a load runs (a test extension replaces it here)
from ludic_lab.inference.vllm.weight_transfer.inplace_plan import Copy, Plan, Repack, build_plan

logger = logging.getLogger("ludic_lab.inference.vllm.weight_transfer.inplace")


def _repack(module: Any, weight: Any) -> None:
    import torch

    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    module.quant_method.process_weights_after_loading(module)


def _lazy_gemm(module: Any) -> None:
    """Re-pack ``module``'s GEMM weight on the first call of its ``cpu_linear`` (exactly what
    an eager re-pack would build, from the weights current at that time)."""

    def first_use(x: Any, weight: Any, bias: Any) -> Any:
        module.quant_method.process_weights_after_loading(module)  # installs the packed cpu_linear
        return module.cpu_linear(x, weight, bias)

    module.cpu_linear = first_use


def _points_into(module: Any, fmap: Any) -> bool:
    """Whether a tensor held by ``module`` (parameters, buffers, its GEMM closure) aliases the file."""
    import torch

    tensors = list(module._parameters.values()) + list(module._buffers.values())
    fn = getattr(module, "cpu_linear", None)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            tensors.append(cell.cell_contents)
        except ValueError:
            pass
    return any(isinstance(t, torch.Tensor) and t.numel() and fmap.contains(t.data_ptr()) for t in tensors)


def apply_plan(plan: Plan, fmap: Any, rename: Mapping[str, str], helpers: Sequence[Any] = ()) -> dict[str, float]:
    """Load the tensors of ``fmap`` (a :class:`~.shm.SafetensorsMap`) as ``plan`` says.

    ``rename`` maps a checkpoint name in the plan back to the name in the file (a tied
    ``lm_head.weight`` loaded as the embedding). ``helpers``: executors (one thread each, on
    cores the worker does not use) that share the re-packing. Returns the seconds spent
    re-packing.
    """
    import torch
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    back = {v: k for k, v in rename.items()}
    src = lambda n: fmap.tensor(back.get(n, n))  # noqa: E731 - a one-line name lookup
    pack_s = 0.0
    # an embedding's copy and the re-packing of the output heads sharing its weight are one
    # job, run alongside the linear layers' re-packing; other copies are small: done here
    heads: dict[int, list[Any]] = {}
    for m in plan.embeddings_eager:
        heads.setdefault(id(m.weight), []).append(m)
    with torch.no_grad():
        offsets: dict[int, int] = {}
        deferred: list[Copy] = []
        for c in plan.copies:
            if not c.fused and id(c.param) in heads:
                deferred.append(c)
                continue
            t = src(c.name)
            if not c.fused:
                getattr(c.param, "weight_loader", default_weight_loader)(c.param, t)
            else:  # consecutive shards of a fused bias
                r = offsets.get(id(c.param), 0)
                c.param.data[r : r + t.shape[0]].copy_(t)
                offsets[id(c.param)] = r + t.shape[0]
        for pid, rows in offsets.items():
            param = next(c.param for c in plan.copies if id(c.param) == pid)
            if rows != param.shape[0]:
                raise RuntimeError(f"fused bias rows {rows} != {param.shape[0]}")
        t0 = time.perf_counter()
        jobs: list[tuple[int, Callable[[], None]]] = []  # (bytes, job): re-packs are independent

        def repack_job(target: str, rp: Repack) -> Callable[[], None]:
            def run() -> None:
                m = rp.module
                w = fmap.concat_rows([back.get(rp.weights[i], rp.weights[i]) for i in range(rp.n_shards)])
                want = (int(m.output_size_per_partition), int(m.input_size_per_partition))
                if tuple(w.shape) != want or w.dtype != m.params_dtype:
                    raise RuntimeError(
                        f"{target}: assembled weight {tuple(w.shape)} {w.dtype}, expected {want} {m.params_dtype}"
                    )
                _repack(m, w)
                if _points_into(m, fmap):  # the kernel kept the view: give it a private copy
                    _repack(m, w.clone())

            return run

        for target, rp in plan.repacks.items():
            nbytes = sum(fmap.entries[back.get(n, n)][3] - fmap.entries[back.get(n, n)][2] for n in rp.weights.values())
            jobs.append((nbytes, repack_job(target, rp)))

        def head_job(c: Copy) -> Callable[[], None]:
            def run() -> None:
                getattr(c.param, "weight_loader", default_weight_loader)(c.param, src(c.name))
                for m in heads[id(c.param)]:
                    m.quant_method.process_weights_after_loading(m)

            return run

        for c in deferred:
            jobs.append((2 * c.param.numel() * c.param.element_size(), head_job(c)))
        copied = {id(c.param) for c in deferred}
        for pid, ms in heads.items():  # heads tied to a weight this update does not copy (none today)
            if pid not in copied:
                jobs.extend(
                    (
                        m.weight.numel() * m.weight.element_size(),
                        functools.partial(_process_after_loading, m),
                    )
                    for m in ms
                )
        run_parallel(jobs, helpers)
        for m in plan.embeddings_lazy:
            _lazy_gemm(m)
        pack_s = time.perf_counter() - t0
    return {"pack_seconds": pack_s}


def _process_after_loading(module: Any) -> None:
    """vLLM's post-load step of a quantised head (repacking after its weight changed)."""
    module.quant_method.process_weights_after_loading(module)


def run_parallel(jobs: Sequence[tuple[int, Callable[[], None]]], helpers: Sequence[Any]) -> None:
    """Run ``(cost, job)`` pairs on this thread and ``helpers`` (executors), largest first,
    each to the least loaded thread; re-raises the first error after all have finished."""
    lanes: list[list[Callable[[], None]]] = [[] for _ in range(len(helpers) + 1)]
    load = [0] * len(lanes)
    for cost, job in sorted(jobs, key=lambda j: -j[0]):
        i = load.index(min(load))
        lanes[i].append(job)
        load[i] += cost

    def run_lane(lane: list[Callable[[], None]]) -> None:
        for job in lane:
            job()

    futures = [ex.submit(run_lane, lane) for ex, lane in zip(helpers, lanes[1:], strict=True) if lane]
    errors: list[BaseException] = []
    try:
        run_lane(lanes[0])
    except BaseException as e:  # noqa: BLE001 - wait for the helpers before raising
        errors.append(e)
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001 - collected, the first re-raised after all lanes end
            errors.append(e)
    if errors:
        raise errors[0]


def _openmp_set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime loaded in this process (it sets the
    calling thread's team size only), or None when none is found."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ("libgomp" in line or "libiomp" in line) and "/" in line}
    except OSError:
        return None
    for lib in sorted(libs):
        try:
            fn = ctypes.CDLL(lib).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        return fn
    return None


def make_helpers() -> list[Any]:
    """One single-threaded executor per online core this worker's threads are not bound to.

    vLLM binds a CPU worker's threads to its cores (leaving one for the server process); while
    an update runs, generation is paused and the other cores are idle, so they share the
    re-packing. Each helper thread pins itself to its core and runs OpenMP with one thread.
    Empty when there is no other core or no way to size the helper's OpenMP team.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    try:
        own = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return []
    spare = sorted(set(range(os.cpu_count() or 1)) - own)
    set_threads = _openmp_set_num_threads() if spare else None
    if set_threads is None:
        return []

    def pin(core: int) -> None:
        try:
            os.sched_setaffinity(0, {core})
        except OSError:
            pass
        set_threads(1)

    return [ThreadPoolExecutor(1, thread_name_prefix="ludic-pack", initializer=pin, initargs=(c,)) for c in spare]


def snapshot(model: Any, plan: Plan, seed: int = 0) -> dict[str, Any]:
    """Every non-empty parameter (cloned) and each re-packed layer's output on a probe input."""
    import torch

    out: dict[str, Any] = {f"param:{k}": v.detach().clone() for k, v in model.named_parameters() if v.numel()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, m in [(k, rp.module) for k, rp in plan.repacks.items()] + [
            (f"embedding:{i}", m) for i, m in enumerate(plan.embeddings_eager + plan.embeddings_lazy)
        ]:
            k = int(getattr(m, "input_size_per_partition", 0) or m.weight.shape[1])
            x = torch.randn(5, k, generator=g).to(getattr(m, "params_dtype", None) or m.weight.dtype)
            bias = getattr(m, "bias", None) if not getattr(m, "skip_bias_add", False) else None
            out[f"out:{name}"] = m.quant_method.apply(m, x, bias).clone()
    return out


def differences(ref: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """Keys whose tensors differ (or are missing on one side)."""
    import torch

    bad = sorted(set(ref) ^ set(got))
    for k in set(ref) & set(got):
        a, b = ref[k], got[k]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            bad.append(k)
    return sorted(bad)


class InplaceLoader:
    """Per-worker state of the fast path: plans by name set, which are verified, mapped files."""

    MAX_MAPS = 2

    def __init__(self) -> None:
        self.plans: dict[Any, tuple[Plan | None, str]] = {}
        self.verified: set[Any] = set()
        self.disabled: str | None = None
        self.maps: dict[str, Any] = {}
        self.helpers: list[Any] | None = None

    # -- mapped update files -----------------------------------------------------------------
    def _map(self, path: str, keep: bool) -> Any:
        from ludic_lab.inference.vllm.weight_transfer.shm import SafetensorsMap

        for p in list(self.maps):  # drop files that were replaced or deleted since
            if not self.maps[p].still_valid():
                self.maps.pop(p).close()
        fmap = self.maps.get(path)
        if fmap is None:
            fmap = SafetensorsMap(path)
            if keep:  # a reused staging buffer: keep it mapped (its pages stay faulted in)
                while len(self.maps) >= self.MAX_MAPS:
                    self.maps.pop(next(iter(self.maps))).close()
                self.maps[path] = fmap
        return fmap

    # -- loading ------------------------------------------------------------------------------
    @staticmethod
    def applicable(worker: Any) -> str:
        """Why the fast path cannot serve this worker ("" when it can)."""
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return "not a CPU worker"
        pc = worker.parallel_config
        if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
            return "tensor or pipeline parallelism"
        if getattr(worker.vllm_config, "lora_config", None) is not None:
            return "LoRA adapters are enabled"
        if getattr(worker.model_config, "quantization", None):
            return "a quantized model"
        return ""

    def load(
        self, worker: Any, path: str, names: Sequence[str], rename: Mapping[str, str], *, keep: bool, mode: str
    ) -> dict[str, Any]:
        """Load ``names`` from the safetensors file at ``path`` into ``worker``'s model.

        ``mode``: ``"auto"`` (in place when possible, verified against vLLM's reload the first
        time a name set is seen) or ``"reload"`` (always vLLM's ``reload_weights``).
        """
        from vllm.config import set_current_vllm_config

        from ludic_lab.inference.vllm.weight_transfer.shm import iter_safetensors

        t0 = time.perf_counter()
        model = worker.model_runner.get_model()

        def vllm_reload() -> None:
            worker.reload_weights(weights_iterator=iter_safetensors(path, list(names), dict(rename)))
            worker.ludic_refresh_tied([rename.get(n, n) for n in names])

        key = (tuple(names), tuple(sorted(rename.items())))
        plan: Plan | None = None
        try:
            why = "" if mode == "auto" else f"mode {mode!r}"
            why = why or self.disabled or self.applicable(worker)
            if not why:
                if key not in self.plans:
                    self.plans[key] = build_plan(model, [rename.get(n, n) for n in names])
                plan, why = self.plans[key]
        except Exception as e:  # noqa: BLE001 - nothing was touched yet: vLLM's reload serves
            why = f"no in-place plan ({type(e).__name__}: {e})"
            self.plans[key] = (None, why)
        if why:
            vllm_reload()
            return {"count": len(names), "mode": "reload", "reason": why, "seconds": time.perf_counter() - t0}
        assert plan is not None
        if self.helpers is None:
            self.helpers = make_helpers()
        t_map = time.perf_counter()
        fmap = self._map(path, keep)
        map_s = time.perf_counter() - t_map
        try:
            with set_current_vllm_config(worker.vllm_config):
                if key in self.verified:
                    info = apply_plan(plan, fmap, rename, self.helpers)
                    mode_used = "inplace"
                else:
                    vllm_reload()
                    ref = snapshot(model, plan)
                    info = apply_plan(plan, fmap, rename, self.helpers)
                    bad = differences(ref, snapshot(model, plan))
                    if bad:
                        raise RuntimeError(
                            f"the in-place load differs from vLLM's reload in {len(bad)} tensors, e.g. {bad[:3]}"
                        )
                    self.verified.add(key)
                    mode_used = "inplace (verified against reload)"
        except Exception as e:  # noqa: BLE001 - vLLM's reload of the same file restores a consistent state
            self.disabled = f"the in-place load was disabled after an error: {type(e).__name__}: {e}"
            logger.warning("ludic: %s; using vLLM's reload_weights from now on", self.disabled)
            vllm_reload()
            return {"count": len(names), "mode": "reload", "reason": self.disabled, "seconds": time.perf_counter() - t0}
        finally:
            if path not in self.maps:
                fmap.close()
        worker.ludic_reset_caches()
        return {
            "count": len(names),
            "mode": mode_used,
            "map_seconds": map_s,
            "pack_threads": 1 + len(self.helpers),
            "seconds": time.perf_counter() - t0,
            **info,
        }

"""FSDP2 in the Trainer: real ``torchrun --nproc_per_node=2`` (gloo, CPU) against one process.

The scenarios (``tests/dist_scripts/fsdp_scenarios.py``) run once under torchrun and once in
this process, on the same global batches of the tiny model.

Tolerances. Both runs start from bitwise-identical weights and compute the same per-item
terms; what differs is only the fp32 summation order: each rank packs its own share into
different micro-batches (different matmul shapes and row mixes), the ranks' gradients are
added by a reduce-scatter, and the global gradient norm is summed shard by shard. Step-1
losses agree to ~1e-7 relative (measured: 0 to 1.2e-7); later steps to ~5e-6, so losses and
gradient norms are compared at rtol 1e-4. Weights after SGD (linear in the gradient) agree
to ~2e-6 of how far they moved: checked at 1e-4 of the movement. Under AdamW the update
``m / (sqrt(v) + eps)`` turns a rounding-level difference in a near-zero gradient component
into an O(lr) difference for that one element, so there the check is: no element off by more
than lr / 10 and fewer than 1 in 1000 elements off by more than lr / 1000 (measured: max
0.023 lr, 8e-5 of the elements). A real error (a rank's share missing, gradients averaged
instead of summed, a lost micro-batch) moves almost every element and fails these by far.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist_scripts"))

from fsdp_scenarios import CHECKPOINT_STEP, SCENARIOS, STEPS, build_trainer

from ludic_lab.distributed.dist_utils import all_reduce_dict, all_reduce_floats, broadcast_bytes, split_balanced
from ludic_lab.distributed.fsdp import find_transformer_blocks
from ludic_lab.distributed.publisher import Rank0OnlyPublisher
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.lora import (
    apply_lora,
    merged_lora_weights,
    merged_lora_weights_from_state_dict,
    policy_state_dict,
    trainable_state_dict,
    trainable_to_model_names,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "dist_scripts" / "fsdp_train.py"
TORCHRUN_TIMEOUT_S = 420
RESUMED = ("full", "lora")
"""Scenarios whose one-process step-2 checkpoint is resumed under torchrun."""


def _torchrun(
    out: Path, model_dir: str, *extra: str, timeout: float = TORCHRUN_TIMEOUT_S
) -> subprocess.CompletedProcess:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no gloo backend")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        "--model-dir",
        model_dir,
        "--out",
        str(out),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    """All scenarios under torchrun, once per module (about 40 s); ``resume-full`` and
    ``resume-lora`` continue checkpoints written here by one process after step 2."""
    out = tmp_path_factory.mktemp("fsdp")
    resume = []
    for name in RESUMED:
        tr = build_trainer(SCENARIOS[name], tiny_model_dir, str(out / f"single-{name}"))
        try:
            tr.train_sync(CHECKPOINT_STEP, progress=False)
            ckpt = tr.save_checkpoint(str(out / f"single-{name}" / "ckpt"))
        finally:
            tr.close()
        resume += ["--resume", f"{name}={ckpt.path}"]
    scenarios = ",".join([*SCENARIOS, *(f"resume-{n}" for n in RESUMED)])
    res = _torchrun(out, tiny_model_dir, "--scenarios", scenarios, *resume)
    assert res.returncode == 0, f"torchrun failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert (out / "done-0").exists() and (out / "done-1").exists()
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> dict[str, dict[str, Any]]:
    """The same scenarios in this process: metrics and the final policy state dict."""
    out = tmp_path_factory.mktemp("single")
    runs = {}
    for name, sc in SCENARIOS.items():
        tr = build_trainer(sc, tiny_model_dir, str(out / name))
        try:
            hist = tr.train_sync(STEPS, progress=False)
            assert tr.data_parallel.root is None and tr.world_size == 1
            runs[name] = {"hist": hist, "policy": {k: v.clone() for k, v in policy_state_dict(tr.model).items()}}
        finally:
            tr.close()
    return runs


def _initial_weights(model_dir: str) -> dict[str, torch.Tensor]:
    (f,) = glob.glob(os.path.join(model_dir, "*.safetensors"))
    return _load(Path(f))


def _assert_adamw_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], lr: float) -> None:
    """The AdamW criterion of the module docstring."""
    assert a.keys() == b.keys()
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float(diff.max()) <= 0.1 * lr, f"max |diff| {float(diff.max()):.3g} > lr/10"
    frac = float((diff > 1e-3 * lr).float().mean())
    assert frac < 1e-3, f"{frac:.2%} of the elements differ by more than lr/1000"


# ------------------------------------------------------------------------------------------
# torchrun vs one process
# ------------------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fsdp_loss_curve_matches_one_process(name: str, dist_run: Path, one_process: dict) -> None:
    dist = json.loads((dist_run / name / "metrics.json").read_text())
    single = one_process[name]["hist"]
    assert len(dist) == len(single) == STEPS
    for step, (d, s) in enumerate(zip(dist, single, strict=False), start=1):
        assert d["dist/world_size"] == 2 and "skipped" not in d
        assert (
            d["items"] == s["items"] and d["sequences"] == s["sequences"] and d["action_tokens"] == s["action_tokens"]
        )
        assert d["tokens"] == s["tokens"], "every real token is trained exactly once over the two ranks"
        assert d["loss"] == pytest.approx(s["loss"], rel=1e-4, abs=1e-7), f"step {step} loss"
        assert d["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4), f"step {step} grad norm"
        assert d["policy_version"] == s["policy_version"] == step
    # the losses really change over the steps (the comparison is not of constants)
    assert len({round(m["loss"], 6) for m in single}) == STEPS
    if name == "per_rank":
        # lopsided per-rank sources: rank 1 ran zero-weight padding micro-batches, and still matched
        assert sum(d["dist/padding_micro_batches"] for d in dist) > 0


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fsdp_final_weights_match_one_process(
    name: str, dist_run: Path, one_process: dict, tiny_model_dir: str
) -> None:
    """The policy rank 0 gathered and published after the last step vs the one-process policy
    (for LoRA: the merged dense weights of the adapted modules)."""
    published = _load(dist_run / name / "published" / f"v{STEPS}.safetensors")
    single = one_process[name]["policy"]
    assert published.keys() == single.keys()
    sc = SCENARIOS[name]
    if sc.config.optimizer == "sgd":
        w0 = _initial_weights(tiny_model_dir)
        moved = max(float((single[k] - w0[k]).abs().max()) for k in single if k in w0)
        diff = max(float((published[k] - single[k]).abs().max()) for k in single)
        assert moved > 1e-3
        assert diff <= 1e-4 * moved, f"max |diff| {diff:.3g} vs movement {moved:.3g}"
    else:
        _assert_adamw_close(published, single, sc.config.lr)
    if sc.lora:
        assert all(".layers." in k for k in published), "LoRA publishes only the adapted linears"


@pytest.mark.distributed
def test_fsdp_checkpoint_loads_in_one_process(dist_run: Path, tiny_model_dir: str) -> None:
    """The step-2 checkpoint written under FSDP2 loads into a plain one-process trainer: the
    weights are the ones rank 0 published at step 2 (bitwise), the optimizer and schedule
    state come back, and one more step there reproduces the distributed step 3."""
    sc = SCENARIOS["full"]
    ckpt = dist_run / "full" / "ckpt" / f"step-{CHECKPOINT_STEP:08d}"
    assert (ckpt / "COMPLETE").is_file()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == CHECKPOINT_STEP and state["peft"] is False
    tr = build_trainer(sc, tiny_model_dir, str(dist_run / "reload"))
    try:
        tr.load_checkpoint(str(ckpt), publish=False)
        assert tr.step == CHECKPOINT_STEP and tr.policy_version == CHECKPOINT_STEP
        at_ckpt = _load(dist_run / "full" / "published" / f"v{CHECKPOINT_STEP}.safetensors")
        mine = policy_state_dict(tr.model)
        assert mine.keys() == at_ckpt.keys()
        for k in mine:
            assert torch.equal(mine[k], at_ckpt[k]), k
        steps = {int(s["step"]) for s in tr.optimizer.state.values()}
        assert steps == {CHECKPOINT_STEP}, "AdamW state (step counts, moments) restored"
        assert all(
            float(s["exp_avg_sq"].abs().max()) > 0
            for s in tr.optimizer.state.values()
            if s["exp_avg_sq"].numel() > 1000
        )
        tr.batch_source.served = CHECKPOINT_STEP  # the third global batch
        (m3,) = tr.train_sync(1, progress=False)
    finally:
        tr.close()
    dist3 = json.loads((dist_run / "full" / "metrics.json").read_text())[STEPS - 1]
    assert m3["loss"] == pytest.approx(dist3["loss"], rel=1e-4)
    _assert_adamw_close(
        policy_state_dict(tr.model), _load(dist_run / "full" / "published" / f"v{STEPS}.safetensors"), sc.config.lr
    )


@pytest.mark.distributed
@pytest.mark.parametrize("name", RESUMED)
def test_one_process_checkpoint_resumes_under_fsdp(name: str, dist_run: Path, one_process: dict) -> None:
    """The other direction: a checkpoint written by one process (optimizer state keyed by
    index; for LoRA the adapters as peft names them) loads into the sharded trainer, whose
    last step then matches one process's."""
    (m3,) = json.loads((dist_run / f"resume-{name}" / "metrics.json").read_text())
    single = one_process[name]
    assert m3["step"] == STEPS and m3["dist/world_size"] == 2
    assert m3["loss"] == pytest.approx(single["hist"][-1]["loss"], rel=1e-4)
    assert m3["grad_norm"] == pytest.approx(single["hist"][-1]["grad_norm"], rel=1e-4)
    published = _load(dist_run / f"resume-{name}" / "published" / f"v{STEPS}.safetensors")
    _assert_adamw_close(published, single["policy"], SCENARIOS[name].config.lr)


@pytest.mark.distributed
def test_fsdp_lora_checkpoint_and_merged_weights(dist_run: Path, tiny_model_dir: str) -> None:
    """LoRA under FSDP2: the adapter checkpoint loads in one process, and the merged weights
    rank 0 published are ``W0 + (alpha / r) * B @ A`` of those adapters, computed here by hand."""
    sc = SCENARIOS["lora"]
    ckpt = dist_run / "lora" / "ckpt" / f"step-{STEPS:08d}"
    adapters = _load(ckpt / "model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    published = _load(dist_run / "lora" / "published" / f"v{STEPS}.safetensors")
    w0 = _initial_weights(tiny_model_dir)
    scaling = sc.config.lora_alpha / sc.config.lora_r
    assert len(published) == 2 * 4  # 2 layers x (q, v, up, down)
    for name, w in published.items():
        mod = name[: -len(".weight")]
        a = adapters[f"base_model.model.{mod}.lora_A.weight"]
        b = adapters[f"base_model.model.{mod}.lora_B.weight"]
        assert float(b.abs().max()) > 0, "B starts at 0: it must have been trained"
        torch.testing.assert_close(w, w0[name] + scaling * (b @ a), rtol=0, atol=1e-6)
    tr = build_trainer(sc, tiny_model_dir, str(dist_run / "reload-lora"))
    try:
        tr.load_checkpoint(str(ckpt), publish=False)
        mine = merged_lora_weights(tr.model)
    finally:
        tr.close()
    assert mine.keys() == published.keys()
    for k in mine:
        assert torch.equal(mine[k], published[k]), k
    # save_policy under FSDP: the merged folder holds the published weights, the rest as they were,
    # and the adapter holds the checkpoint's adapters (peft's names)
    policy = dist_run / "lora" / "policy"
    merged = _load(policy / "model.safetensors")
    assert merged.keys() == w0.keys()
    assert all(torch.equal(merged[k], published[k] if k in published else w0[k]) for k in merged)
    saved_adapter = _load(policy / "adapter" / "adapter_model.safetensors")
    assert saved_adapter.keys() == adapters.keys() and all(torch.equal(saved_adapter[k], adapters[k]) for k in adapters)


@pytest.mark.distributed
def test_rank_that_raises_stops_the_run(tmp_path: Path, tiny_model_dir: str) -> None:
    """Rank 1 raises inside step 2 while rank 0 waits in a collective: torchrun must stop the
    whole run promptly, exit non-zero and show the error."""
    t0 = time.time()
    res = _torchrun(
        tmp_path, tiny_model_dir, "--scenarios", "full", "--fail-rank", "1", "--fail-step", "2", timeout=300
    )
    ended = time.time()
    output = res.stdout + res.stderr
    assert res.returncode != 0
    assert "injected failure on rank 1 at step 2" in output
    assert not (tmp_path / "done-0").exists() and not (tmp_path / "done-1").exists()
    failed_at = float((tmp_path / "failed_at.txt").read_text())
    assert t0 < failed_at < ended
    assert ended - failed_at < 60, f"the run took {ended - failed_at:.0f}s to stop after the failure"
    # the metrics of the first step were not written: the scenario never completed
    assert not (tmp_path / "full" / "metrics.json").exists()


@pytest.mark.distributed
def test_global_split_refuses_different_batches_on_ranks(tmp_path: Path, tiny_model_dir: str) -> None:
    """batch_split="global" with ranks whose sources disagree (here: the same items in another
    order) would silently train half of each batch: it stops the run with a clear error."""
    res = _torchrun(tmp_path, tiny_model_dir, "--scenarios", "full", "--mismatch", timeout=300)
    assert res.returncode != 0
    assert "batch_split='global' but the ranks' batch sources yielded different batches" in res.stdout + res.stderr
    assert not (tmp_path / "full" / "published").exists() or not list((tmp_path / "full" / "published").iterdir())


@pytest.mark.distributed
def test_tutorial_script_runs_under_torchrun(tmp_path: Path, tiny_model_dir: str) -> None:
    """tutorials/scripts/train_fsdp2.py end to end on 2 ranks (tiny model, LoRA, 2 steps):
    rank 0 samples, both ranks train, rank 0's sampler receives every new policy version."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no gloo backend")
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tutorials" / "scripts" / "train_fsdp2.py"),
        "--model",
        tiny_model_dir,
        "--steps",
        "2",
        "--lora-r",
        "4",
        "--questions-per-step",
        "3",
        "--group-size",
        "4",
        "--max-tokens",
        "6",
        "--out",
        str(out),
    ]
    res = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=TORCHRUN_TIMEOUT_S,
    )
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["dist/world_size"] == 2 and m["items"] == 12 and m["source/num_rollouts"] == 12
        # every token of the batch trained; a GRPO group's shared prompt computed once per group
        assert m["pack/shared_prompt_tokens"] > 0
        assert m["tokens"] + m["pack/shared_prompt_tokens"] == m["source/num_tokens"], "tokens lost between ranks"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 and summary["sampler_policy_version"] == 2


# ------------------------------------------------------------------------------------------
# building blocks, in one process
# ------------------------------------------------------------------------------------------


def test_split_balanced_is_deterministic_and_balanced() -> None:
    sizes = [50, 10, 40, 30, 30, 20, 5, 5]
    shares = split_balanced(sizes, 2)
    assert shares == split_balanced(sizes, 2)
    assert sorted(i for s in shares for i in s) == list(range(len(sizes)))
    totals = [sum(sizes[i] for i in s) for s in shares]
    assert totals == [95, 95]
    assert all(s == sorted(s) for s in shares)
    assert split_balanced([3, 3, 3], 4) == [[0], [1], [2], []]
    assert split_balanced([], 2) == [[], []]
    with pytest.raises(ValueError):
        split_balanced([1], 0)


def test_collective_helpers_are_identities_in_one_process() -> None:
    assert all_reduce_floats([1.5, 2.0], "max") == [1.5, 2.0]
    assert all_reduce_dict({"a": 1, "b": 2.5}) == {"a": 1.0, "b": 2.5}
    assert broadcast_bytes(b"xyz") == b"xyz"


def test_find_transformer_blocks(tiny_model_dir: str) -> None:
    from trainer_helpers import load_model

    model = load_model(tiny_model_dir)
    blocks = find_transformer_blocks(model)
    assert blocks == list(model.model.layers) and len(blocks) == 2
    assert find_transformer_blocks(model, ("Qwen2DecoderLayer",)) == blocks
    peft_model = apply_lora(load_model(tiny_model_dir), r=2, alpha=4, target_modules=("q_proj",))
    assert [type(b).__name__ for b in find_transformer_blocks(peft_model)] == ["Qwen2DecoderLayer"] * 2
    with pytest.raises(ValueError, match="NoSuchLayer"):
        find_transformer_blocks(model, ("NoSuchLayer",))
    with pytest.raises(ValueError, match="fsdp_block_classes"):
        find_transformer_blocks(torch.nn.Linear(2, 2))


def test_merged_lora_from_state_dict_equals_merged_lora(tiny_model_dir: str) -> None:
    from trainer_helpers import load_model

    torch.manual_seed(0)
    model = apply_lora(load_model(tiny_model_dir), r=4, alpha=8, target_modules=("q_proj", "v_proj", "gate_proj"))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    a, b = merged_lora_weights(model), merged_lora_weights_from_state_dict(model, full)
    assert a.keys() == b.keys() and len(a) == 6
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # checkpoint naming round trip (peft drops the adapter name; trainable_to_model_names restores it)
    saved = trainable_state_dict(model)
    named = trainable_to_model_names(model, saved)
    assert all(".default." in k for k in named) and len(named) == len(saved) == 12
    for k, v in named.items():
        assert torch.equal(full[k], v)
    with pytest.raises(KeyError, match="lacks"):
        trainable_to_model_names(model, {"base_model.model.nope.lora_A.weight": torch.zeros(1)})


def test_rank0_only_publisher_checks_the_state_dict() -> None:
    got = []

    class Sink:
        last_version = None

        def publish(self, sd: Any, version: Any = None) -> None:
            got.append((dict(sd), version))

    pub = Rank0OnlyPublisher(Sink())
    pub.publish({"w": torch.ones(1)}, 3)
    assert got and got[0][1] == 3
    assert pub.last_version is None  # the wrapped publisher's attributes stay reachable
    with pytest.raises(ValueError, match="empty state dict"):
        pub.publish({}, 4)
    with pytest.raises(TypeError):
        Rank0OnlyPublisher(object())


def test_trainer_config_distributed_fields() -> None:
    cfg = TrainerConfig(fsdp_block_classes=["LlamaDecoderLayer"])
    assert cfg.fsdp == "auto" and cfg.batch_split == "global" and cfg.fsdp_block_classes == ("LlamaDecoderLayer",)
    assert cfg.to_dict()["fsdp_block_classes"] == ["LlamaDecoderLayer"]
    for bad in ({"fsdp": "on"}, {"batch_split": "half"}, {"dist_timeout_s": 0}):
        with pytest.raises(ValueError):
            TrainerConfig(**bad)

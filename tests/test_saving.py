"""Saving a trained policy (``ludic_lab.saving``): round trips through every backend.

Two GRPO + LoRA steps on the tiny model (fp32, the digits task), then ``save_policy``. The
reference is the trainer's own policy (the peft model, adapters active), decoded greedily by a
plain forward per token: each backend loading the saved folders must give the same greedy
tokens and their logprobs within 1e-4 — transformers (merged, and base + adapter via peft),
``LocalChatClient(path)``, ``OpenAIEndpoint`` over it through the real ``openai`` client, and
the bundled vLLM server (merged folder; the adapter with ``--enable-lora``). The merged
weights are the tensors a publish sends, and differ from the base. Then full fine-tunes,
the callbacks and bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import ListBatchSource, digits_source, load_model, random_items

from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
from ludic_lab.saving import KeepBest, SavePolicy, save_policy
from ludic_lab.training import Trainer, TrainerConfig, make_grpo

ATOL = 1e-4
MAX_NEW = 12
PROMPT = [{"role": "user", "content": "Write some digits."}]


@torch.no_grad()
def greedy(model: Any, prompt: list[int], stop: set[int], n: int = MAX_NEW) -> tuple[list[int], list[float]]:
    """Greedy ids and their logprobs, one full forward per token (no cache: first principles)."""
    model.eval()
    ids, lps = list(prompt), []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        tok = int(lp.argmax())
        ids.append(tok)
        lps.append(float(lp[tok]))
        if tok in stop:
            break
    return ids[len(prompt) :], lps


@torch.no_grad()
def scored(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """The logprob of each completion token under ``model`` (one teacher-forced forward)."""
    logits = model.eval()(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return [float(lp[i, t]) for i, t in enumerate(completion)]


def assert_same(got_ids: list[int], got_lps: list[float], want: tuple[list[int], list[float]]) -> None:
    ids, lps = want
    assert list(got_ids) == ids
    diff = max(abs(a - b) for a, b in zip(got_lps, lps, strict=True))
    assert diff < ATOL, diff


@pytest.fixture(scope="module")
def trained(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two GRPO + LoRA steps on the digits task, published into a sampler, then saved."""
    from transformers import AutoTokenizer

    client = LocalChatClient(tiny_model_dir, dtype="float32")
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, prompts=4, group_size=4)
    cfg = TrainerConfig(lr=5e-2, lora_r=8, lora_alpha=16, max_seq_len=256, micro_token_budget=4096)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    trainer.train_sync(2, progress=False)
    trainer.close()
    saved = save_policy(trainer, tmp_path_factory.mktemp("saved") / "policy")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rendered = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=True)
    prompt = list(rendered["input_ids"])
    stop = set(client.chat_template.stop_token_ids)  # where every backend ends a reply
    ref = greedy(trainer.model, prompt, stop)
    return {"trainer": trainer, "saved": saved, "prompt": prompt, "stop": stop, "ref": ref, "base": tiny_model_dir}


def test_the_merged_folder_holds_the_published_weights_and_training_moved_them(trained: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    saved, trainer = trained["saved"], trained["trainer"]
    got = load_file(str(saved.merged / "model.safetensors"))
    base = load_file(str(Path(trained["base"]) / "model.safetensors"))
    published = trainer.policy_state_dict()
    assert set(got) == set(base)  # the plain model's names: no base_layer, no lora_ tensors
    assert published and all(torch.equal(got[k], v) for k, v in published.items())  # bit for bit
    assert all(not torch.equal(got[k], base[k]) for k in published)  # the training did something
    assert all(torch.equal(got[k], base[k]) for k in base if k not in published)  # the rest as it was
    info = json.loads((saved.path / "saved_policy.json").read_text())
    assert info["step"] == 2 and info["policy_version"] == 2 and info["merged"] and info["adapter"]
    tpl = (saved.merged / "chat_template.jinja").read_text()
    assert "<|im_start|>" in tpl
    ids, lps = trained["ref"]
    before = scored(load_model(trained["base"]), trained["prompt"], ids)
    assert max(abs(a - b) for a, b in zip(before, lps, strict=True)) > 1e-2  # the base policy is another one


def test_transformers_loads_the_merged_model(trained: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trained["saved"].merged, dtype=torch.float32)
    assert_same(*greedy(model, trained["prompt"], trained["stop"]), trained["ref"])


def test_peft_loads_the_adapter_over_the_base_model(trained: dict[str, Any]) -> None:
    from peft import PeftModel

    adapter = trained["saved"].adapter
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == trained["base"]
    model = PeftModel.from_pretrained(load_model(trained["base"]), str(adapter))
    assert_same(*greedy(model, trained["prompt"], trained["stop"]), trained["ref"])


def test_local_chat_client_samples_the_saved_policy(trained: dict[str, Any]) -> None:
    client = LocalChatClient(str(trained["saved"].merged), dtype="float32")
    req = ChatCompletionRequest(
        model="policy",
        messages=PROMPT,
        sampling=SamplingConfig(temperature=0.0, max_tokens=MAX_NEW),
        return_=ReturnSpec.for_training(),
    )
    resp, _ = client.complete_sync(req)
    assert list(resp.prompt_token_ids) == trained["prompt"]  # the saved chat template renders the same ids
    assert_same(list(resp.completion_token_ids), list(resp.completion_logprobs), trained["ref"])


def test_openai_endpoint_serves_the_saved_policy(trained: dict[str, Any]) -> None:
    pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
    from ludic_lab.endpoint import OpenAIEndpoint

    with OpenAIEndpoint(LocalChatClient(str(trained["saved"].merged), dtype="float32")) as ep:
        session = ep.open_session()
        client = ep.sync_client(session)
        r = client.chat.completions.create(
            model="policy", messages=PROMPT, temperature=0.0, max_tokens=MAX_NEW, logprobs=True
        )
        client.close()
    (call,) = session.calls
    assert list(call.trace.prompt_token_ids) == trained["prompt"]
    lps = [c.logprob for c in r.choices[0].logprobs.content]
    assert_same(list(call.trace.completion_token_ids), lps, trained["ref"])


@pytest.mark.slow
@pytest.mark.vllm
def test_the_bundled_vllm_server_serves_the_merged_model_and_the_adapter(trained: dict[str, Any]) -> None:
    """fp32 vLLM on CPU: the merged folder as the served model, then the base model with the
    adapter as a LoRA module (``--enable-lora``), asked for by its name."""
    from vllm_helpers import completion, shared_vllm_server, stop_vllm_server

    merged = str(trained["saved"].merged)
    server = shared_vllm_server(merged)
    try:
        choice, _ = completion(server, trained["prompt"], max_tokens=MAX_NEW)
    finally:
        stop_vllm_server(merged)
    assert_same(choice["token_ids"], choice["logprobs"]["token_logprobs"], trained["ref"])
    lora = ("--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"saved={trained['saved'].adapter}")
    server = shared_vllm_server(trained["base"], extra_args=lora)
    try:
        choice, _ = completion(server, trained["prompt"], max_tokens=MAX_NEW, model="saved")
    finally:
        stop_vllm_server(trained["base"], extra_args=lora)
    assert_same(choice["token_ids"], choice["logprobs"]["token_logprobs"], trained["ref"])


# -- full fine-tune, callbacks -------------------------------------------------------------------
def full_trainer(model_dir: str, **cfg: Any) -> Trainer:
    items = random_items(8, vocab_size=2000, seed=1)
    from ludic_lab.rollouts.saw import SAWBatch

    config = TrainerConfig(lr=1e-2, max_seq_len=64, **cfg)
    return Trainer(load_model(model_dir), make_grpo(), ListBatchSource([SAWBatch(items)]), config=config)


def test_a_full_fine_tune_saves_every_weight_and_no_adapter(tiny_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = full_trainer(tiny_model_dir)
    trainer.train_sync(1, progress=False)
    trainer.close()
    saved = save_policy(trainer, tmp_path / "p")
    assert saved.adapter is None and not (tmp_path / "p" / "adapter").exists()
    back = AutoModelForCausalLM.from_pretrained(saved.merged, dtype=torch.float32).state_dict()
    want = trainer.model.state_dict()
    assert set(back) == set(want) and all(torch.equal(back[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="adapter=True needs a LoRA model"):
        save_policy(trainer, tmp_path / "q", adapter=True)


def test_save_policy_every_n_steps_keeps_the_newest(tiny_model_dir: str, tmp_path: Path) -> None:
    trainer = full_trainer(tiny_model_dir, lora_r=4, lora_alpha=8)
    every = SavePolicy(trainer, tmp_path / "policies", every=2, keep=2, adapter=False)
    trainer.callbacks.append(every)
    trainer.train_sync(6, progress=False)
    trainer.close()
    assert [p.name for p in sorted((tmp_path / "policies").iterdir())] == ["step_4", "step_6"]
    assert [s.step for s in every.saved] == [2, 4, 6]
    info = json.loads((tmp_path / "policies" / "step_6" / "saved_policy.json").read_text())
    assert info["step"] == 6 and info["adapter"] is False


def test_keep_best_saves_when_the_metric_improves(tiny_model_dir: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    trainer = full_trainer(tiny_model_dir, lora_r=4, lora_alpha=8)
    scores = {1: 0.5, 2: 0.25, 3: None, 4: 0.75, 5: 0.75}
    weights: dict[int, dict[str, torch.Tensor]] = {}

    def evaluate(step: int, metrics: dict[str, Any]) -> None:  # an evaluation callback, before KeepBest
        weights[step] = {k: v.clone() for k, v in trainer.policy_state_dict().items()}
        if scores[step] is not None:
            metrics["eval/accuracy"] = scores[step]

    keep = KeepBest(trainer, tmp_path, metric="eval/accuracy", adapter=False)
    trainer.callbacks += [evaluate, keep]
    trainer.train_sync(5, progress=False)
    trainer.close()
    info = json.loads((tmp_path / "best" / "saved_policy.json").read_text())
    assert (keep.best, keep.best_step) == (0.75, 4)
    assert info["metric"] == "eval/accuracy" and info["value"] == 0.75 and info["step"] == 4
    got = load_file(str(tmp_path / "best" / "model.safetensors"))
    assert all(torch.equal(got[k], v) for k, v in weights[4].items())  # step 4's policy, not step 5's
    with pytest.raises(TypeError, match="must be a number"):
        keep(6, {"eval/accuracy": "high"})
    with pytest.raises(ValueError, match="'max' or 'min'"):
        KeepBest(trainer, tmp_path, metric="eval/accuracy", mode="best")
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        SavePolicy(trainer, tmp_path, every=0)


def test_train_env_saves_into_its_run_folder(tiny_model_dir: str, tmp_path: Path) -> None:
    from ludic_lab import train_env
    from ludic_lab.task import Task
    from ludic_lab.task.digits import DigitsEnv

    task = Task("digits", DigitsEnv, reject_incomplete_completions=False)
    small = {"model": tiny_model_dir, "max_tokens": 4, "group_size": 2, "prompts_per_step": 2, "progress": False}
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no saved_policy.json"):  # refused before training
        train_env(task, steps=1, out=None, save_to=tmp_path / "mine", **small)
    with pytest.raises(ValueError, match="out=None writes none"):
        train_env(task, steps=1, out=None, save_to=True, **small)
    run = train_env(task, steps=1, out=str(tmp_path / "run"), save_to=True, **small)
    info = json.loads((tmp_path / "run" / "policy" / "saved_policy.json").read_text())
    assert info["step"] == 1 and info["adapter"] and (tmp_path / "run" / "policy" / "adapter").is_dir()
    assert run.folder is not None and run.folder.path == tmp_path / "run"


# -- bad input ------------------------------------------------------------------------------------
def test_bad_destinations_are_refused_and_a_saved_policy_is_replaced(tiny_model_dir: str, tmp_path: Path) -> None:
    model = load_model(tiny_model_dir)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_policy(model, tmp_path / "notes")
    with pytest.raises(FileExistsError, match="holds no saved_policy.json"):
        save_policy(model, tmp_path / "notes", overwrite=True)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        save_policy(model, tmp_path / "file")
    first = save_policy(model, tmp_path / "p")
    assert first.step is None and first.adapter is None
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    save_policy(model, tmp_path / "p", overwrite=True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folders left
    from safetensors.torch import load_file

    again = load_file(str(tmp_path / "p" / "model.safetensors"))
    assert torch.equal(again["model.norm.weight"], model.model.norm.weight)


def test_a_model_without_a_tokenizer_and_other_bad_input(tiny_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config._name_or_path = ""
    bare = AutoModelForCausalLM.from_config(config)  # built, not loaded: no folder to take a tokenizer from
    with pytest.raises(ValueError, match="the model has no name_or_path; pass tokenizer="):
        save_policy(bare, tmp_path / "a")
    bare.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id: nothing is downloaded
    with pytest.raises(ValueError, match="SmolLM2-135M-Instruct is not a local folder; pass tokenizer="):
        save_policy(bare, tmp_path / "a")
    with pytest.raises(ValueError, match="cannot find the tokenizer: /no/such/folder"):
        save_policy(bare, tmp_path / "a", tokenizer="/no/such/folder")
    with pytest.raises(ValueError, match="cannot load a tokenizer from"):
        save_policy(bare, tmp_path / "a", tokenizer=str(tmp_path))
    saved = save_policy(bare, tmp_path / "a", tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
    assert (saved.merged / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="nothing to save"):
        save_policy(bare, tmp_path / "b", merged=False, adapter=False)
    with pytest.raises(TypeError, match="needs a Trainer or a Hugging Face model"):
        save_policy({"w": torch.zeros(1)}, tmp_path / "c")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_the_demo_refuses_a_policy_folder_it_may_not_replace(tiny_model_dir: str, tmp_path: Path) -> None:
    from ludic_lab.demo import DemoConfig

    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "mine.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that are not a saved policy.*save_policy false"):
        DemoConfig(model=tiny_model_dir, out=str(tmp_path)).preflight()
    DemoConfig(model=tiny_model_dir, out=str(tmp_path), save_policy=False).preflight()  # nothing to save: fine
    save_policy(load_model(tiny_model_dir), tmp_path / "earlier" / "policy")
    DemoConfig(model=tiny_model_dir, out=str(tmp_path / "earlier")).preflight()  # an earlier run's policy: replaced

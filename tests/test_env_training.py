"""The short path (``ludic_lab.train_env``) and the parts it composes (``Task``, ``RequestStream``).

The façade must be the explicit API, not a second implementation: the same run written out
piece by piece (as README's "The same run, piece by piece" does) samples the same rollouts
for the same seeds, step after step (the second step's rollouts come from the weights the
first step pushed, so training and publishing are compared too).
"""

from __future__ import annotations

from typing import Any

import pytest

import ludic_lab
from ludic_lab.env_training import EnvTraining, build_env_training, train_env_async
from ludic_lab.envs import SingleAgentEnv
from ludic_lab.task import RequestStream, Task, as_task
from ludic_lab.task.digits import DigitsEnv
from ludic_lab.types import StepOutcome


def _trace_rows(rollouts: list[Any]) -> list[tuple[Any, ...]]:
    """What a rollout sampled: seeds, prompt and completion ids, reward (ids and seeds are exact)."""
    rows = []
    for r in rollouts:
        t = r.steps[0].trace
        rows.append((r.env_seed, r.sampling_seed, t.prompt_token_ids, t.completion_token_ids, r.total_reward))
    return sorted(rows, key=lambda row: (row[0], row[1]))


def _recorder(source: Any, seen: list[list[tuple[Any, ...]]]) -> Any:
    def on_step(step: int, metrics: dict[str, Any]) -> None:
        seen.append(_trace_rows(source.last_rollouts))

    return on_step


def test_the_short_path_samples_what_the_explicit_api_samples(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource, RolloutEngine
    from ludic_lab.training import Trainer, TrainerConfig, make_grpo

    steps, max_tokens = 2, 8
    # the short path: a task that judges replies cut at the budget (the tiny model rarely stops)
    task = Task("digits", DigitsEnv, reject_incomplete_completions=False)
    short_seen: list[list[tuple[Any, ...]]] = []
    run = build_env_training(task, model=tiny_model_dir, max_tokens=max_tokens, config={"lr": 1e-2})
    run.trainer.callbacks.append(_recorder(run.source, short_seen))
    run.train_sync(steps, progress=False)

    # the same run, written out
    client = LocalChatClient(tiny_model_dir, max_batch_size=16)
    engine = RolloutEngine(
        {"digits": DigitsEnv},
        {
            "single_agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
        max_concurrency=64,
    )
    inference = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    requests = RequestStream("digits", "single_agent", per_step=4, size=task.size, inference=inference)
    algo = make_grpo()
    source = RolloutBatchSource(engine, requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(4, seed=0))
    policy = AutoModelForCausalLM.from_pretrained(client.model_path)
    explicit_seen: list[list[tuple[Any, ...]]] = []
    trainer = Trainer(
        policy,
        algo,
        source,
        config=TrainerConfig(lr=1e-2, lora_r=8, lora_alpha=16),
        publisher=ClientPublisher(client),
        pad_token_id=client.pad_token_id,
        callbacks=[_recorder(source, explicit_seen)],
    )
    trainer.train_sync(steps, progress=False)

    assert len(short_seen) == len(explicit_seen) == steps
    assert all(len(rows) == 16 for rows in short_seen)
    assert short_seen == explicit_seen
    assert short_seen[0] != short_seen[1]  # new questions each step
    assert run.client.policy_version == client.policy_version == steps
    assert len(run.history) == steps and run.rollouts and isinstance(run, EnvTraining)
    assert repr(run).startswith("EnvTraining(task='digits', algo='grpo', steps=2, reward_mean=")


class ShoutEnv(SingleAgentEnv):
    suggested_sysprompt = "Reply with the word only."

    def env_reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.word = ["cat", "house"][(seed or 0) % 2]
        self.obs = f"Write the word '{self.word}' in capital letters."
        return self.obs, {}

    def env_step(self, action: str) -> StepOutcome:
        ok = self.word.upper() in action
        self.obs = "Correct." if ok else "No."
        return StepOutcome(self.obs, float(ok), truncated=False, terminated=True)

    def env_current_obs(self) -> str:
        return self.obs


def test_every_part_can_be_given_ready_made(tiny_model_dir: str) -> None:
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.rollouts import IdentityStrategy
    from ludic_lab.training import TrainerConfig, make_rloo

    client = LocalChatClient(tiny_model_dir, max_batch_size=8)
    algo = make_rloo()
    run = ludic_lab.run_sync(
        train_env_async(
            ShoutEnv,
            steps=1,
            progress=False,
            model=client,
            algo=algo,
            group_size=2,
            prompts_per_step=3,
            max_tokens=4,
            config=TrainerConfig(lr=1e-3, lora_r=4, lora_alpha=8),
        )
    )
    assert run.client is client and run.algo is algo and run.task.name == "shoutenv"
    assert run.trainer.config.lora_r == 4 and len(run.rollouts) == 6
    assert {r.env_seed for r in run.rollouts} == {0, 1, 2}
    # group_size=1: no groups
    single = build_env_training(ShoutEnv, model=client, group_size=1, algo="reinforce", max_tokens=4)
    assert isinstance(single.strategy, IdentityStrategy)
    # a ready-made batch source: the run shows its engine, requests and strategy
    from ludic_lab.rollouts import RolloutBatchSource

    task = as_task(ShoutEnv)
    stream = task.requests(per_step=2)
    source = RolloutBatchSource(task.engine(client), stream, algo.credit_assigner)
    own = build_env_training(task, model=client, algo=algo, source=source)
    assert own.source is source and own.requests is stream and own.engine is source.engine


def test_a_broken_env_or_an_instance_is_refused_before_any_model_loads() -> None:
    class NoObs(ShoutEnv):
        def env_current_obs(self) -> str:
            return "something else"

    with pytest.raises(Exception, match="env_current_obs"):
        build_env_training(NoObs, model="/nonexistent")
    with pytest.raises(TypeError, match="not an instance"):
        build_env_training(ShoutEnv(), model="/nonexistent")


def test_request_stream_walks_its_rows_and_resumes_from_its_state() -> None:
    s = RequestStream("qa", per_step=3, size=10, seed=0)
    assert [r.env_seed for r in s()] == [0, 1, 2] and [r.env_seed for r in s()] == [3, 4, 5]
    state = s.state_dict()
    resumed = RequestStream("qa", per_step=3, size=10, seed=0)
    resumed.load_state_dict(state)
    assert [r.env_seed for r in resumed()] == [r.env_seed for r in s()] == [6, 7, 8]
    assert [r.env_seed for r in s()] == [9, 0, 1]  # wraps around the rows
    seeded = RequestStream("qa", per_step=2, size=100, seed=1)
    assert [r.env_seed for r in seeded()] == [7919 % 100, 7920 % 100]
    shuffled = RequestStream("qa", per_step=10, size=10, seed=3, shuffle=True)
    assert sorted(r.env_seed for r in shuffled()) == list(range(10))
    with pytest.raises(ValueError, match="another stream"):
        RequestStream("qa", size=11).load_state_dict(state)


def test_as_task_names_an_env_after_its_class() -> None:
    task = as_task(ShoutEnv)
    assert task.name == "shoutenv" and task.protocol_kind == "single_agent" and task.size is None
    assert as_task(task, name="shout").name == "shout"
    with pytest.raises(ValueError, match="non-empty"):
        Task("", ShoutEnv)


def test_train_env_runs_where_an_event_loop_is_running(tiny_model_dir: str) -> None:
    """As in a Jupyter cell: one line after the env's definition, a loop already running."""
    import asyncio

    async def cell() -> EnvTraining:
        return ludic_lab.train_env(
            ShoutEnv, steps=1, model=tiny_model_dir, max_tokens=4, group_size=2, prompts_per_step=2, progress=False
        )

    run = asyncio.run(cell())
    assert len(run.history) == 1 and run.client.policy_version == 1


def test_a_resumed_run_samples_the_requests_the_saved_run_would_have(tiny_model_dir: str, tmp_path: Any) -> None:
    """The request stream's cursor and the strategy's seed RNG go into the trainer's checkpoint."""

    def build() -> EnvTraining:
        task = Task("digits", DigitsEnv, reject_incomplete_completions=False)
        return build_env_training(task, model=tiny_model_dir, max_tokens=4, group_size=2, prompts_per_step=2)

    run = build()
    run.train_sync(1, progress=False)
    saved = run.trainer.save_checkpoint(str(tmp_path / "ckpt"))
    run.train_sync(1, progress=False)
    expected = _trace_rows(run.rollouts)
    resumed = build()
    resumed.trainer.load_checkpoint(saved.path)
    assert resumed.requests.cursor == 2  # type: ignore[attr-defined]
    resumed.train_sync(1, progress=False)
    assert [row[:2] for row in _trace_rows(resumed.rollouts)] == [row[:2] for row in expected]  # same seeds
    assert {row[0] for row in expected} == {2, 3}  # the next two questions, not the first two again


def test_a_tasks_trainer_defaults_start_the_config_and_config_overrides_them(tiny_model_dir: str) -> None:
    """``Task.trainer_defaults`` (a TextArena game's smaller micro-batches) start a run's
    ``TrainerConfig``; a ``config`` mapping overrides them, a ``TrainerConfig`` replaces them."""
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.textarena import GAME_TRAINER_DEFAULTS
    from ludic_lab.training import TrainerConfig

    client = LocalChatClient(tiny_model_dir, max_batch_size=8)
    base = as_task(ShoutEnv)
    task = Task(base.name, base.env, trainer_defaults={"micro_token_budget": 1024, "lora_r": 4})
    run = build_env_training(task, model=client, max_tokens=4)
    assert (run.trainer.config.micro_token_budget, run.trainer.config.lora_r, run.trainer.config.lr) == (1024, 4, 1e-4)
    run = build_env_training(task, model=client, max_tokens=4, config={"micro_token_budget": 2048})
    assert (run.trainer.config.micro_token_budget, run.trainer.config.lora_r) == (2048, 4)
    run = build_env_training(task, model=client, max_tokens=4, config={"max_seq_len": 2048})  # the default lifted
    assert (run.trainer.config.micro_token_budget, run.trainer.config.max_seq_len) == (2048, 2048)
    run = build_env_training(task, model=client, max_tokens=4, config=TrainerConfig(lora_r=2))
    assert (run.trainer.config.micro_token_budget, run.trainer.config.lora_r) == (TrainerConfig().micro_token_budget, 2)
    assert as_task(ShoutEnv).trainer_defaults is None and GAME_TRAINER_DEFAULTS == {
        "micro_token_budget": 1024,
        "gradient_checkpointing": True,
    }
    with pytest.raises(TypeError, match="trainer_defaults must be a mapping"):
        Task(base.name, base.env, trainer_defaults=[("lr", 1.0)])  # type: ignore[arg-type]

"""Every environment source through ludic_lab's public entry points: one table, one row per source.

The rows are in ``tests/conformance_sources.py`` (a Task builder per source: verifiers,
OpenEnv, TextArena, reasoning-gym, Gymnasium, PettingZoo, the bundled tasks). Each check runs
on every row, with the tiny model, on the package's own environments:

- ``train_env(task, steps=1, eval_every=1, ...)``, the documented one-liner, evaluates the held-out
  split before and after (``evals.jsonl``, the runs table) and trains one step; every step of
  the batch holds exactly the token ids the sampler produced (a recording sampler); each reward
  is the package's own score of that completion (its scorer called here, directly); the run
  folder loads with ``ludic_lab.runs.load_runs``;
- ``task.evaluate(client, ...)`` gives a summary;
- ``ludic-lab eval --task ...`` (the CLI, in-process) gives what ``evaluate_task`` gives;
- one episode through the notebook stepper is the one the task's protocol runs;
- an episode that fails fails alone, its cause recorded, the others unaffected.

A check a source cannot support is an ``NA`` cell in the table with its reason, and the test
checks the reason (the refusal the source gets). Adding a source is adding a row.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conformance_sources import NA, ROWS, SOURCE_IDS, Source, close
from recording_clients import RecordingClient
from verifiers_helpers import verifiers_envs_importable

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.task import Task

pytestmark = pytest.mark.timeout(300)


def _param(row: Source) -> Any:
    missing = [m for m in row.needs if importlib.util.find_spec(m) is None]
    marks = [pytest.mark.skip(reason=f"{row.id} needs {missing}: pip install -e '.[envs]'")] if missing else []
    return pytest.param(row, id=row.id, marks=marks)


ROW_PARAMS = [_param(row) for row in ROWS]


BROKEN = "conformance: the env broke on seed {seed}"


def failing_at(task: Task, seed: int) -> Task:
    """``task`` whose env raises ``RuntimeError`` in ``step`` after a reset with ``seed`` (the
    package's env itself, reset and stepped as usual for every other seed)."""

    def make(**kwargs: Any) -> Any:
        env = task.env(**kwargs)
        reset, step, current = env.reset, env.step, {"seed": None}

        def broken_reset(seed: int | None = None) -> Any:
            current["seed"] = seed
            return reset(seed=seed)

        def broken_step(actions: Any) -> Any:
            if current["seed"] == seed:
                raise RuntimeError(BROKEN.format(seed=seed))
            return step(actions)

        env.reset, env.step = broken_reset, broken_step
        return env

    return dataclasses.replace(task, env=make)


def env_step_fails(task: Task) -> tuple[Task, int, int, str, str]:
    """The default failing episode: seed 1's env raises in ``step``, seed 2's runs."""
    return failing_at(task, 1), 1, 2, "env_error", BROKEN.format(seed=1)


@dataclass
class Built:
    """Each row's task, built once per module (a builder may start a server or load a taskset)."""

    tasks: dict[str, Task] = field(default_factory=dict)

    def __call__(self, row: Source) -> Task:
        if row.id not in self.tasks:
            self.tasks[row.id] = row.build()
        return self.tasks[row.id]


@pytest.fixture(scope="module", autouse=True)
def _sources_importable() -> Iterator[None]:
    with verifiers_envs_importable():  # verifiers imports tasksets by id (tests/verifiers_envs)
        yield
    close()


@pytest.fixture(scope="module")
def built() -> Built:
    return Built()


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> Iterator[LocalChatClient]:
    """The untrained tiny model, as the CLI loads it (``Sampler``'s local client)."""
    from ludic_lab.sampler import open_client

    sampler = open_client("local", tiny_model_dir, max_batch_size=8)
    yield sampler
    _release(sampler)


def _release(client: Any) -> None:
    """What the sources' episodes started for ``client`` (verifiers' endpoint), stopped."""
    for row in ROWS:
        if row.release is not None and all(importlib.util.find_spec(m) for m in row.needs):
            row.release(client)


def _spec(max_tokens: int) -> InferenceSpec:
    return InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())


# -- train_env: one step, the sampled ids, the package's own scores, the run folder ----------------
@pytest.mark.parametrize("row", ROW_PARAMS)
def test_train_env_one_step_on_sampled_ids_and_the_packages_own_rewards(
    row: Source, built: Built, tiny_model_dir: str, tmp_path: Path
) -> None:
    from ludic_lab import train_env
    from ludic_lab.runs import load_runs

    task = built(row)
    # evaluation during training: the held-out split before the step and after it
    evaluating = not isinstance(row.evaluate, NA)
    if not evaluating:
        with pytest.raises(ValueError, match="has no held-out evaluation"):
            train_env(task, steps=1, model=tiny_model_dir, eval_every=1, out=None)
    evals = {"eval_every": 1, "eval_options": row.evaluate} if evaluating else {}
    sampler = RecordingClient(tiny_model_dir, max_batch_size=4)
    try:
        run = train_env(task, steps=1, model=sampler, group_size=2, prompts_per_step=1, max_tokens=row.max_tokens,
                        config={"lr": 1e-2}, out=str(tmp_path / "run"), progress=False, **evals)  # fmt: skip
    finally:
        if row.release is not None:
            row.release(sampler)
    assert len(run.history) == 1 and sampler.policy_version == 1, run.history
    rollouts = run.rollouts
    assert rollouts and not any(r.failed for r in rollouts), [r.error for r in rollouts]

    # token in, token out: each step's ids are a completion the sampler made, for that prompt
    sampled = set(sampler.sampled)
    traced = [s.trace for r in rollouts for s in r.steps if s.trace is not None]
    assert traced and all(t.completion_token_ids for t in traced)
    for t in traced:
        assert (tuple(t.prompt_token_ids), tuple(t.completion_token_ids)) in sampled

    # the reward is the package's own score of the same completion
    pairs = row.own_scores(task, rollouts)
    assert pairs, f"{row.id}: no reward to compare"
    assert [got for got, _ in pairs] == [own for _, own in pairs], pairs

    # the run folder reads back
    runs = load_runs([run.folder.path])
    (loaded,) = list(runs)
    assert loaded.info["kind"] == "train_env" and loaded.config["env"] == task.name
    assert list(loaded.metrics["step"]) == [1]
    assert len(loaded.rollouts()) > 0
    if evaluating:  # before and after, in evals.jsonl, and in the comparison table
        assert list(runs.evals["step"]) == [0, 1], runs.evals
        row_table = runs.table().iloc[0]
        assert row_table["eval_before"] == row_table["eval_before"], row_table  # not NaN
        assert row_table["eval_after"] == row_table["eval_after"], row_table


# -- task.evaluate ----------------------------------------------------------------------------------
@pytest.mark.parametrize("row", ROW_PARAMS)
async def test_task_evaluate_gives_a_summary(row: Source, built: Built, client: Any) -> None:
    task = built(row)
    if isinstance(row.evaluate, NA):
        row.evaluate.check(task, client)
        return
    assert task.evaluate is not None
    metrics = await task.evaluate(client, **row.evaluate)
    accuracy = metrics.get("accuracy", metrics.get("greedy_accuracy"))
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0, metrics
    if "num_samples" in metrics:
        assert metrics["num_samples"] >= 1 and metrics["accuracy_ci_low"] <= accuracy <= metrics["accuracy_ci_high"]
        assert metrics.get("num_failed", 0) == 0 and metrics.get("failure_rate", 0.0) == 0.0, metrics


# -- the CLI ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", ROW_PARAMS)
async def test_cli_eval_gives_what_evaluate_task_gives(
    row: Source, built: Built, client: Any, tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from ludic_lab.cli import main
    from ludic_lab.demos.eval_cmd import cli_tasks
    from ludic_lab.eval import evaluate_task

    argv = ["eval", "--model", tiny_model_dir, "--task", row.cli, "--seeds", str(row.eval_seed),
            "--max-tokens", str(row.max_tokens), "--out", str(tmp_path)]  # fmt: skip
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    assert code == 0, out.err
    greedy = json.loads((tmp_path / "summary.json").read_text())["passes"]["greedy"]
    table = pd.read_csv(tmp_path / "greedy.csv", keep_default_na=False)  # a row per trained seat
    assert set(table["env_seed"]) == {row.eval_seed} and greedy["num_samples"] == len(table), greedy
    assert greedy["num_failed"] == 0 and not table["failed"].any(), table

    # in Python: the row's Task itself where the CLI names a factory of it, else the same name
    target = built(row) if row.cli == f"conformance_sources:{row.build.__name__}" else row.cli
    options = dict(seeds=[row.eval_seed], max_tokens=row.max_tokens, extra_tasks=cli_tasks())  # the CLI's names
    mine = (await evaluate_task(client, target, **options)).table
    assert list(table["completion"]) == list(mine["completion"].fillna(""))
    assert list(table["reward"]) == pytest.approx(list(mine["reward"]))


# -- the notebook stepper ---------------------------------------------------------------------------
@pytest.mark.parametrize("row", ROW_PARAMS)
async def test_one_episode_through_the_stepper_is_the_protocols(row: Source, built: Built, client: Any) -> None:
    from ludic_lab.lab.stepper import RolloutStepper

    task = built(row)
    if isinstance(row.stepper, NA):
        row.stepper.check(task, client)
        return
    spec, max_steps = _spec(row.max_tokens), task.max_steps or 1
    stepper = RolloutStepper(task.env(), task.make_protocol(client).agent, env_seed=3, sampling_seed=5,
                             inference=spec, max_steps=max_steps)  # fmt: skip
    while not stepper.done:
        await stepper.step()
    stepped = stepper.to_rollout()
    [ref] = await task.make_protocol(client).run(env=task.env(), max_steps=max_steps, env_seed=3, sampling_seed=5,
                                                 inference=spec)  # fmt: skip
    assert len(stepped.steps) == len(ref.steps) >= 1
    for s, t in zip(stepped.steps, ref.steps, strict=True):
        assert (s.action, s.reward, s.next_obs, s.terminated, s.truncated) == (
            t.action, t.reward, t.next_obs, t.terminated, t.truncated)  # fmt: skip
        assert s.trace.completion_token_ids == t.trace.completion_token_ids
        assert s.trace.prompt_token_ids == t.trace.prompt_token_ids


# -- a failing episode fails alone ------------------------------------------------------------------
@pytest.mark.parametrize("row", ROW_PARAMS)
async def test_a_failing_episode_fails_alone_with_its_cause(row: Source, built: Built, client: Any) -> None:
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest

    broken, bad, good, cause, text = (row.failure or env_step_fails)(built(row))
    requests = [RolloutRequest(EnvSpec(broken.name), ProtocolSpec(broken.protocol_kind), env_seed=seed,
                               inference=_spec(row.max_tokens), max_steps=broken.max_steps or 1)
                for seed in (bad, good)]  # fmt: skip
    rollouts = await broken.engine(client).generate_rollouts(requests)
    failed = [r for r in rollouts if r.env_seed == bad]
    fine = [r for r in rollouts if r.env_seed == good]
    assert failed and fine, [(r.env_seed, r.error) for r in rollouts]
    for r in failed:
        assert r.failed and r.meta["failure_cause"] == cause, (r.meta.get("failure_cause"), r.error)
        assert text in r.error
    assert not any(r.failed for r in fine), [r.error for r in fine]
    assert all(r.steps for r in fine)


def test_every_task_builder_has_a_row() -> None:
    """A builder added to ludic_lab.task without a row here fails this test."""
    import inspect

    import ludic_lab.task.builtin as builtin
    import ludic_lab.task.external as external

    names = {
        name
        for mod in external.__path__
        for path in Path(mod).glob("*.py")
        for name in _task_builders(path.read_text(encoding="utf-8"))
    }
    sources = "".join(inspect.getsource(row.build) for row in ROWS)
    missing = sorted(n for n in names if f"{n}(" not in sources)
    assert not missing, f"Task builders without a conformance row: {missing}"
    assert {"capitals", "digits"} == set(builtin.BUILTIN_TASKS) <= set(SOURCE_IDS)
    assert all(isinstance(row.build(), Task) for row in ROWS if row.id in builtin.BUILTIN_TASKS)


def _task_builders(source: str) -> list[str]:
    """Public top-level functions of a module that return a ``Task``."""
    import re

    return re.findall(r"^def ([a-z][a-z_]*_task)\(.*?\)\s*->\s*Task\s*:", source, flags=re.MULTILINE | re.DOTALL)

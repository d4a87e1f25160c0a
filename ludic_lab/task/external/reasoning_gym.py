"""reasoning-gym's generators by name as ludic_lab tasks, scored by reasoning-gym's own scorer.

    task = reasoning_gym_task("countdown", size=1000, seed=0, heldout_size=100)
    run = train_env(task, steps=20)                     # the training rows
    metrics = await task.evaluate(run.client, k=4)      # the held-out rows: pass@k, Wilson intervals

Any generator ``reasoning_gym.create_dataset`` knows (``countdown``, ``basic_arithmetic``,
``sudoku``, ``gsm_symbolic``, ...); extra keywords are its config. Each episode is one
question; the reply's ``<answer>...</answer>`` (reasoning-gym's answer format, asked for by its
``"default"`` system prompt) goes to ``dataset.score_answer(answer, entry)`` with the full
generated entry, and that score (0..1, partial credit included) is the step's reward. A reply
without the tags is a parse error (the parser's -1, the env never sees it), as everywhere in
ludic_lab. Scoring runs inside the bubblewrap sandbox (:mod:`.reasoning_gym_scorer`): some
scorers evaluate the answer as code (``countdown``'s sympy ``parse_expr``), so model text is
scored where model-written code runs; a pathological answer is a 0 with
``info["scorer_error"]``, never a hung episode nor code run on the host.

Train and held-out rows never meet. reasoning-gym draws item ``i`` of a dataset seeded ``s``
from ``Random(s + i)``, so the two splits use disjoint ranges of those seeds: training
``[seed, seed + size)``, held-out ``[heldout_seed, heldout_seed + heldout_size)`` (default
``heldout_seed = seed + size``; overlapping ranges are refused). Small problem spaces can still
repeat a question under another seed, so a training row whose question is a held-out question
is skipped for the next training row that is not.
"""

from __future__ import annotations

import asyncio
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.extras import require_extra
from ludic_lab.parsers import Parser
from ludic_lab.task.definition import Task
from ludic_lab.task.external.reasoning_gym_scorer import ScorerSandbox
from ludic_lab.task.external.reasoning_gym_shaping import (
    TrainDemonstrator,
    check_curriculum,
    check_format_reward,
    examples_protocol,
    package_answer_parser,
    reasoning_gym_stats,
    worked_examples,
)
from ludic_lab.types import Info, StepOutcome

Split = Literal["train", "heldout"]


def _reasoning_gym() -> Any:
    require_extra("tasks", what="reasoning_gym_task")
    import reasoning_gym

    return reasoning_gym


def reasoning_gym_names() -> list[str]:
    """Every generator name reasoning-gym registers, sorted."""
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _check_name(name: str) -> None:
    names = reasoning_gym_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5) or [n for n in names if name in n][:5]
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"reasoning-gym has no generator {name!r}{hint} (reasoning_gym_names() lists all {len(names)})"
        )


class ReasoningGymData:
    """The training and held-out rows of generator ``name`` (generated on first use, cached) and
    its scorer. Splits are kept apart as the module docstring says."""

    def __init__(self, name: str, *, size: int = 1000, seed: int = 0, heldout_size: int = 100,
                 heldout_seed: int | None = None, scorer_sandbox: ScorerSandbox = "bubblewrap",
                 scorer_timeout_s: float = 10.0, curriculum: Sequence[Mapping[str, Any]] = (),
                 curriculum_rows: int = 64, **config: Any) -> None:  # fmt: skip
        _check_name(name)
        if "isolate_scorer" in config:
            raise ValueError(
                "isolate_scorer is gone: reasoning-gym answers are scored only in the bubblewrap sandbox, since "
                "some scorers run them as code; on a machine without bubblewrap, scorer_sandbox='unsafe_local' "
                "scores them in a plain child process (answers you trust only)"
            )
        for arg, value in (("size", size), ("seed", seed), ("heldout_size", heldout_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{arg} must be an int, got {value!r}")
        if heldout_seed is not None and (isinstance(heldout_seed, bool) or not isinstance(heldout_seed, int)):
            raise ValueError(f"heldout_seed must be an int or None, got {heldout_seed!r}")
        if (
            isinstance(scorer_timeout_s, bool)
            or not isinstance(scorer_timeout_s, (int, float))
            or not (math.isfinite(scorer_timeout_s) and scorer_timeout_s > 0)
        ):
            raise ValueError(f"scorer_timeout_s must be a finite number of seconds > 0, got {scorer_timeout_s!r}")
        if scorer_sandbox not in ("bubblewrap", "unsafe_local"):
            raise ValueError(f"scorer_sandbox must be 'bubblewrap' or 'unsafe_local', got {scorer_sandbox!r}")
        if size < 1 or heldout_size < 0:
            raise ValueError(f"need size >= 1 and heldout_size >= 0, got size={size}, heldout_size={heldout_size}")
        heldout_seed = seed + size if heldout_seed is None else heldout_seed
        if heldout_size and heldout_seed < seed + size and seed < heldout_seed + heldout_size:
            raise ValueError(
                f"the held-out seeds [{heldout_seed}, {heldout_seed + heldout_size}) overlap the training seeds "
                f"[{seed}, {seed + size}) (reasoning-gym draws item i of seed s from Random(s + i)); "
                f"leave heldout_seed unset or pick one >= {seed + size}"
            )
        self.name, self.config = name, dict(config)
        self.size, self.seed, self.heldout_size, self.heldout_seed = size, seed, heldout_size, heldout_seed
        self.scorer_sandbox, self.scorer_timeout_s = scorer_sandbox, float(scorer_timeout_s)
        self.curriculum, self.curriculum_rows = check_curriculum(curriculum, curriculum_rows)
        self._datasets = {"train": self._create(size, seed)}
        if heldout_size:
            self._datasets["heldout"] = self._create(heldout_size, heldout_seed)
        self._stages = [self._create(self.curriculum_rows, self._stage_seed(k), **stage)
                        for k, stage in enumerate(self.curriculum)]  # fmt: skip
        self._entries: dict[tuple[str, int], dict[str, Any]] = {}
        self._train_index: dict[int, int] = {}
        self._heldout_questions: frozenset[str] | None = None

    def _stage_seed(self, stage: int) -> int:
        """The dataset seed of curriculum stage ``stage``: its rows keep their training seeds."""
        return self.seed + stage * self.curriculum_rows

    def _create(self, size: int, seed: int, **stage: Any) -> Any:
        try:
            return _reasoning_gym().create_dataset(self.name, size=size, seed=seed, **{**self.config, **stage})
        except (TypeError, AssertionError, ValueError) as e:
            from reasoning_gym.factory import DATASETS

            fields = sorted(getattr(DATASETS[self.name][1], "__dataclass_fields__", {}))
            raise ValueError(
                f"reasoning-gym rejected the config {dict(self.config, **stage)} of {self.name!r}: "
                f"{type(e).__name__}: {e} "
                f"(its config fields: {fields})"
            ) from e

    def __len__(self) -> int:
        return self.size

    def split_size(self, split: Split) -> int:
        """Rows of ``split``."""
        return self.size if split == "train" else self.heldout_size

    def dataset_kwargs(self, split: Split) -> dict[str, Any]:
        """``create_dataset`` keywords of ``split`` (besides the name), curriculum stages aside."""
        size, seed = (self.size, self.seed) if split == "train" else (self.heldout_size, self.heldout_seed)
        return {"size": size, "seed": seed, **self.config}

    def stage(self, split: Split, generator_index: int) -> int | None:
        """The curriculum stage a row is generated at (``None``: the task's own config). Training
        row ``i`` is at stage ``i // curriculum_rows`` while stages last; held-out rows never are."""
        k = generator_index // self.curriculum_rows
        return k if split == "train" and k < len(self.curriculum) else None

    def _source(self, split: Split, generator_index: int) -> tuple[dict[str, Any], int]:
        """``(create_dataset keywords, item index)`` that generate a row (what the scorer rebuilds)."""
        k = self.stage(split, generator_index)
        if k is None:
            return self.dataset_kwargs(split), generator_index
        kwargs = {"size": self.curriculum_rows, "seed": self._stage_seed(k), **self.config, **self.curriculum[k]}
        return kwargs, generator_index - k * self.curriculum_rows

    def _generate(self, split: Split, index: int) -> dict[str, Any]:
        key = (split, index)
        if key not in self._entries:
            k = self.stage(split, index)
            dataset = self._datasets[split] if k is None else self._stages[k]
            self._entries[key] = dataset[self._source(split, index)[1]]
        return self._entries[key]

    def heldout_questions(self) -> frozenset[str]:
        """The questions of the held-out rows (generated on the first call)."""
        if self._heldout_questions is None:
            self._heldout_questions = frozenset(
                str(self._generate("heldout", i)["question"]) for i in range(self.heldout_size)
            )
        return self._heldout_questions

    def row_index(self, split: Split, index: int) -> int:
        """The generator index served for row ``index`` of ``split`` (``index % rows``; a training
        row repeating a held-out question moves on to the next one that does not)."""
        n = self.split_size(split)
        if n == 0:
            raise ValueError(f"{self.name}: there are no {split} rows (heldout_size=0)")
        i = int(index) % n
        if split == "heldout":
            return i
        if i not in self._train_index:
            banned = self.heldout_questions()
            for j in range(i, i + n):
                if str(self._generate("train", j % n)["question"]) not in banned:
                    self._train_index[i] = j % n
                    break
            else:
                raise ValueError(f"{self.name}: every training question is also a held-out one; raise size")
        return self._train_index[i]

    def entry(self, split: Split, index: int) -> dict[str, Any]:
        """reasoning-gym's own entry (``question``, ``answer``, ``metadata``) of row ``index``."""
        return self._generate(split, self.row_index(split, index))

    def row_id(self, split: Split, index: int) -> str:
        """A stable id of row ``index``: ``<name>-<dataset seed>-<generator index>``."""
        return f"{self.name}-{self.dataset_kwargs(split)['seed']}-{self.row_index(split, index)}"

    def rows(self, split: Split) -> list[dict[str, Any]]:
        """Every row of ``split`` as ``{"id", "question", "answer"}`` (generates them all)."""
        out = []
        for i in range(self.split_size(split)):
            e = self.entry(split, i)
            out.append({"id": self.row_id(split, i), "question": str(e["question"]), "answer": str(e["answer"])})
        return out

    async def score(self, split: Split, answer: str | None, index: int) -> tuple[float, str | None]:
        """``(score, error)``: reasoning-gym's ``score_answer(answer, entry)`` of row ``index`` of
        ``split``, run in the sandboxed scorer; ``(0.0, why)`` when the scorer raised or ran past
        ``scorer_timeout_s``. A sandbox that cannot start raises (the episode fails with it)."""
        from ludic_lab.task.external.reasoning_gym_scorer import ScorerError, ScorerTimeout, shared_scorer

        generator_index = self.row_index(split, index)
        question = str(self._generate(split, generator_index)["question"])
        kwargs, item = self._source(split, generator_index)
        scorer = shared_scorer(self.scorer_sandbox)
        try:
            score = await asyncio.to_thread(scorer.score, self.name, kwargs, item, question, answer,
                                            timeout_s=self.scorer_timeout_s)  # fmt: skip
            return score, None
        except (ScorerTimeout, ScorerError) as e:  # model text that chokes the scorer scores 0, with the reason
            return 0.0, str(e)


class ReasoningGymEnv(SingleAgentEnv):
    """One question of ``data``'s ``split`` per episode (env seed ``i``: row ``i % rows``; ``None``:
    the next row). Reward: reasoning-gym's score of the (parsed) answer; step info holds
    ``index``, ``id``, ``target``, ``answer``, ``score``, ``correct`` (score >= ``threshold``)."""

    def __init__(self, data: ReasoningGymData, split: Split = "train", *, system_prompt: str | None = "default",
                 threshold: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        data.row_index(split, 0)  # no rows: a clear error now
        self.data, self.split, self.threshold = data, split, float(threshold)
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self._system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        self._cursor = 0
        self._index: int | None = None
        self._obs = ""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as on SingleAgentEnv
        return self._system_prompt

    @classmethod
    def recommended_parser(cls, *, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
        """The text inside the last ``<answer>...</answer>``, read by reasoning-gym's own ``extract_answer``."""
        return package_answer_parser(success_reward=success_reward, error_reward=error_reward)

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        if seed is None:
            seed, self._cursor = self._cursor, self._cursor + 1
        self._index = int(seed) % self.data.split_size(self.split)
        self._obs = str(self.data.entry(self.split, self._index)["question"])
        return self._obs, {"index": self._index, "id": self.data.row_id(self.split, self._index), "split": self.split}

    async def env_step(self, action: str) -> StepOutcome:
        if self._index is None:
            raise RuntimeError("ReasoningGymEnv.env_step called before env_reset(); reset the env first")
        entry = self.data.entry(self.split, self._index)
        answer = action if isinstance(action, str) else str(action)
        score, error = await self.data.score(self.split, answer, self._index)
        target = str(entry["answer"])
        info: Info = {"index": self._index, "id": self.data.row_id(self.split, self._index), "target": target,
                      "answer": answer, "score": score, "correct": score >= self.threshold}  # fmt: skip
        if error is not None:
            info["scorer_error"] = error
        self._obs = f"Score {score:g}." + ("" if info["correct"] else f" A correct answer is {target}.")
        return StepOutcome(obs=self._obs, reward=score, truncated=False, terminated=True, info=info)

    def env_current_obs(self) -> str:
        return self._obs


@dataclass(frozen=True)
class ReasoningGymEnvFactory:
    """``factory()`` -> a fresh :class:`ReasoningGymEnv` over ``data``'s ``split`` (a task's ``env``)."""

    data: ReasoningGymData
    split: Split = "train"
    system_prompt: str | None = "default"
    threshold: float = 1.0

    @property
    def __name__(self) -> str:  # as a class would have one: as_task / logs name the env by it
        return f"reasoning_gym_{self.data.name}"

    def __call__(self) -> ReasoningGymEnv:
        return ReasoningGymEnv(self.data, self.split, system_prompt=self.system_prompt, threshold=self.threshold)


def reasoning_gym_task(name: str, *, size: int = 1000, seed: int = 0, heldout_size: int = 100,
                       heldout_seed: int | None = None, system_prompt: str | None = "default",
                       parser: Parser | None = None, threshold: float = 1.0,
                       reject_incomplete_completions: bool = True, scorer_sandbox: ScorerSandbox = "bubblewrap",
                       scorer_timeout_s: float = 10.0, few_shot: int = 0, format_reward: float = 0.0,
                       curriculum: Sequence[Mapping[str, Any]] | None = None, curriculum_rows: int = 64,
                       **config: Any) -> Task:  # fmt: skip
    """reasoning-gym's generator ``name`` as a :class:`Task` (env kind ``name``; env seed ``i``:
    training row ``i``; request streams walk a seeded shuffle). ``config`` goes to
    ``reasoning_gym.create_dataset``; ``system_prompt`` is one of reasoning-gym's
    ``SYSTEM_PROMPTS`` keys or a text; ``parser`` defaults to the ``<answer>`` tag parser (-1 when
    absent); ``threshold``: the score that counts as correct; answers are scored in the bubblewrap
    sandbox (``scorer_sandbox="unsafe_local"``: a plain child process, for trusted answers only).
    ``task.evaluate(client, k=...)`` runs :func:`evaluate_reasoning_gym` on the held-out rows;
    ``task.env.data`` holds the rows.

    For a small model (:mod:`.reasoning_gym_shaping`; none changes the package's score):
    ``few_shot=n`` starts every episode, training and held-out alike, with ``n`` worked examples
    in the answer format; ``format_reward=r`` adds ``r`` to the training reward of a reply in the
    answer format (``Step.format_reward``; the evaluation leaves it out); ``curriculum`` (a list of
    configs, easiest first, e.g. ``package_curriculum(name)``) generates training rows
    ``[k * curriculum_rows, (k + 1) * curriculum_rows)`` at stage ``k``, later rows and the
    held-out ones at ``config``; training rows are then walked in order, not shuffled."""
    data = ReasoningGymData(name, size=size, seed=seed, heldout_size=heldout_size, heldout_seed=heldout_seed,
                            scorer_sandbox=scorer_sandbox, scorer_timeout_s=scorer_timeout_s,
                            curriculum=curriculum or (), curriculum_rows=curriculum_rows, **config)  # fmt: skip
    format_reward = check_format_reward(format_reward)
    if parser is not None and format_reward:
        raise ValueError("give either parser= or format_reward= (the default parser's reward for the answer format)")
    read = parser if parser is not None else ReasoningGymEnv.recommended_parser(success_reward=float(format_reward))
    scored = parser if parser is not None else ReasoningGymEnv.recommended_parser()
    examples = tuple(worked_examples(data, few_shot))
    factory = ReasoningGymEnvFactory(data, "train", system_prompt, threshold)
    heldout = ReasoningGymEnvFactory(data, "heldout", system_prompt, threshold)

    async def evaluate(client: Any, **options: Any) -> dict[str, Any]:
        """Held-out metrics (``evaluate_reasoning_gym``'s options): summary and pass@k intervals."""
        incomplete = reject_incomplete_completions
        result = await evaluate_reasoning_gym(
            client, heldout, parser=scored, reject_incomplete_completions=incomplete, examples=examples, **options
        )
        return eval_summary(result)

    return Task(name, factory, parser=read, size=size, shuffle=not data.curriculum, evaluate=evaluate,
                protocol=examples_protocol(read, examples, reject_incomplete_completions) if examples else None,
                reject_incomplete_completions=reject_incomplete_completions, stats=reasoning_gym_stats,
                demonstrate=TrainDemonstrator(data))  # fmt: skip


async def evaluate_reasoning_gym(client: Any, env: Callable[[], ReasoningGymEnv], *, k: int = 1,
                                 limit: int | None = None, temperature: float | None = None, max_tokens: int = 256,
                                 parser: Parser | None = None, reject_incomplete_completions: bool = True,
                                 sampling_seed: int = 0, concurrency: int = 32, timeout_s: float | None = None,
                                 progress: bool | None = None, name: str = "heldout",
                                 examples: Sequence[Any] = ()) -> Any:  # fmt: skip
    """:func:`ludic_lab.eval.evaluate` of ``client`` on every row of ``env``'s split (or the first
    ``limit``), ``k`` samples each (after the worked ``examples``, chat turns); success is
    ``info["correct"]``. Returns the
    :class:`~ludic_lab.eval.EvalResult` (``summary()``: accuracy with its Wilson interval, pass@1..k)."""
    from ludic_lab.eval.evaluator import evaluate
    from ludic_lab.eval.success import InfoKeySuccess
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec

    probe = env()
    n = probe.data.split_size(probe.split)
    read, reject = parser or ReasoningGymEnv.recommended_parser(), reject_incomplete_completions
    task = Task("reasoning_gym_eval", env, parser=read, reject_incomplete_completions=reject,
                protocol=examples_protocol(read, examples, reject) if examples else None)  # fmt: skip
    engine = task.engine(client, max_concurrency=concurrency)
    seeds = range(n if limit is None else min(int(limit), n))
    return await evaluate(engine, EnvSpec(task.name), ProtocolSpec(task.protocol_kind), seeds, k=k,
                          temperature=temperature, max_tokens=max_tokens, success=InfoKeySuccess("correct"),
                          sampling_seed=sampling_seed, timeout_s=timeout_s, progress=progress, name=name)  # fmt: skip


def eval_summary(result: Any) -> dict[str, Any]:
    """``result.summary()`` plus ``pass@k_ci_low`` / ``pass@k_ci_high`` (the Wilson interval of the
    share of items solved at least once in their ``k`` samples, which pass@k is when n = k) and
    ``score_mean``: reasoning-gym's mean score per sample (a reply out of the answer format: 0)."""
    from ludic_lab.eval.metrics import wilson_interval

    out = dict(result.summary())
    scores = [float(r.steps[-1].info.get("score", 0.0)) if r.steps else 0.0 for r in result.rollouts]
    out["score_mean"] = sum(scores) / len(scores) if scores else math.nan
    items = result.per_item()
    if result.k > 1 and len(items):
        lo, hi = wilson_interval(int((items["c"] > 0).sum()), len(items))
        out[f"pass@{result.k}_ci_low"], out[f"pass@{result.k}_ci_high"] = lo, hi
    return out

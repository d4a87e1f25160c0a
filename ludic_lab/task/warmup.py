"""An SFT warm-up before RL: a few supervised steps on a task's demonstrated episodes.

A small model that never writes a task's format (``<answer>...</answer>``, a move ``[4]``, a
tool call) gives GRPO groups of zeros: no signal. A short warm-up on demonstrations teaches the
format first (SFT, then RL, as agents are usually trained); what is scored never changes.

A demonstration is an episode of the task's own env, protocol and agent whose model replies are
written, not sampled: :class:`DemonstrationClient` answers each request with ``reply(messages)``
(a task's :attr:`~ludic_lab.task.Task.demonstrate`: reasoning-gym's reference answer of the
training row asked, a scripted TicTacToe move, ...) as the token ids the chat template gives that
reply. The episodes are scored like any other; :func:`warm_up` trains on them with the ``sft``
algorithm (masked cross-entropy on the reply tokens) inside a
:func:`~ludic_lab.training.phase.training_phase`, so the trainer then goes on with its own
algorithm, source and learning rate from the warmed-up weights. Only training rows are asked for
(``task.requests``); ``train_env(task, sft_warmup_steps=N)`` runs it before the first RL step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.types import ChatResponse, Message

ReplyFn = Callable[[Sequence[Message]], str]
"""``reply(messages) -> text``: the demonstrated reply to a conversation."""

DEFAULT_WARMUP_LR = 1e-3
"""The warm-up's learning rate unless told (the workspace demo's measured setting)."""
WARMUP_MICRO_TOKENS = 2048
"""Tokens of a warm-up micro-batch at most (at least the trainer's ``max_seq_len``): a warm-up step
trains on distinct prompts, which no GRPO group shares, so at a budget of 8192 (the trainer's
default on an accelerator) its activations held 16-21 GB on SmolLM2 (``bench/env_signal.py``)."""


class DemonstrationClient:
    """A chat client whose replies are ``reply(messages)``, as token ids: the prompt as ``client``
    renders it and the reply as its chat template renders an assistant turn (ending with the
    end-of-turn token). Behaviour logprobs are 0 (nothing was sampled): train on its episodes with
    the ``sft`` algorithm only. Weight updates go to ``client``."""

    def __init__(self, client: Any, reply: ReplyFn) -> None:
        if not callable(reply):
            raise TypeError(f"DemonstrationClient: reply must be a callable messages -> str, got {reply!r}")
        self.client, self.reply = client, reply
        self.chat_template = client.chat_template

    @property
    def pad_token_id(self) -> int:
        return int(self.client.pad_token_id)

    @property
    def policy_version(self) -> int:
        return int(self.client.policy_version)

    async def complete(self, request: Any) -> tuple[ChatResponse, dict[str, Any]]:
        from ludic_lab.inference.local.response import RowState, build_response
        from ludic_lab.training.batching.chat_sft import _assistant_turn_ids

        prompt = self.client.prompt_ids(request)
        messages = list(request.messages)
        text = self.reply(messages)
        if not isinstance(text, str):
            raise TypeError(f"DemonstrationClient: reply(messages) must return a str, got {type(text).__name__}")
        turn: Message = {"role": "assistant", "content": text}
        row = RowState(request.sampling, 0)
        row.ids = _assistant_turn_ids(self.chat_template, messages, turn)
        row.logprobs = [0.0] * len(row.ids)
        row.finish = "stop"
        return build_response(request, prompt, row, self.chat_template, version=self.policy_version, info={})

    def sync_weights(self, params: Mapping[str, Any], **kwargs: Any) -> str:
        return str(self.client.sync_weights(params, **kwargs))


def check_warmup(task: Any, steps: Any, lr: Any, per_step: Any = None) -> tuple[int, float, int | None]:
    """``(steps, lr, per_step)`` of a warm-up on ``task``, checked before anything loads: ``steps``
    an int >= 0, ``lr`` a finite number > 0, ``per_step`` None or an int >= 1; a task without
    :attr:`~ludic_lab.task.Task.demonstrate` is refused when ``steps`` > 0 (``task`` None: not asked)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"sft_warmup_steps must be an int >= 0 (SFT steps before RL; 0: none), got {steps!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"sft_warmup_lr must be a finite number > 0, got {lr!r}")
    if per_step is not None and (isinstance(per_step, bool) or not isinstance(per_step, int) or per_step < 1):
        raise ValueError(f"sft_warmup_per_step must be an int >= 1 (demonstrated episodes a step), got {per_step!r}")
    if steps and task is not None and getattr(task, "demonstrate", None) is None:
        raise _no_demonstrator(task)
    return steps, float(lr), per_step


def _no_demonstrator(task: Any) -> ValueError:
    return ValueError(
        f"task {getattr(task, 'name', task)!r} has no demonstrator (Task.demonstrate is None), so there is "
        "nothing to warm up on: give the task demonstrate=reply(messages) -> the correct reply "
        "(reasoning_gym_task and textarena_task('TicTacToe-v0') have one), or leave sft_warmup_steps at 0"
    )


async def warm_up(trainer: Any, client: Any, task: Any, *, steps: int, per_step: int, seed: int = 0,
                  max_tokens: int = 256, lr: float = DEFAULT_WARMUP_LR, episode_timeout_s: float = 3600.0,
                  reply: ReplyFn | None = None,
                  micro_token_budget: int | None = WARMUP_MICRO_TOKENS) -> list[dict[str, Any]]:  # fmt: skip
    """``steps`` SFT steps of ``trainer`` (``lr``, plain logits, no loggers) on episodes of
    ``task``'s training rows demonstrated by :class:`DemonstrationClient` over ``client``
    (``per_step`` episodes a step; ``reply``: default ``task.demonstrate``; micro-batches of at most
    ``micro_token_budget`` tokens, None: the trainer's own); then the trainer has
    its own algorithm, source, scoring temperature, loggers and learning rate back and goes on
    from the warmed-up weights (already pushed to ``client``). Returns the warm-up steps' metrics;
    a warm-up whose every step was skipped (nothing to train on, e.g. too long) raises."""
    from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training.algorithm import make_sft
    from ludic_lab.training.phase import training_phase

    check_warmup(None, steps, lr, per_step)
    reply = reply if reply is not None else getattr(task, "demonstrate", None)
    if reply is None:
        raise _no_demonstrator(task)
    sft = make_sft()
    inference = InferenceSpec(SamplingConfig(max_tokens=max_tokens), ReturnSpec.for_training())
    source = RolloutBatchSource(task.engine(DemonstrationClient(client, reply), episode_timeout_s=episode_timeout_s),
                                task.requests(per_step=per_step, seed=seed, inference=inference), sft.credit_assigner,
                                request_strategy=GRPORequestStrategy(1, seed=seed))  # fmt: skip
    if steps == 0:
        return []
    cfg = trainer.config
    budget = micro_token_budget and max(cfg.max_seq_len, min(cfg.effective_micro_token_budget, micro_token_budget))
    with training_phase(trainer, algo=sft, batch_source=source, lr=lr, scoring_temperature=1.0, loggers=[],
                        micro_token_budget=budget):  # fmt: skip
        metrics = list(await trainer.train(steps, progress=False))
    skipped = [m for m in metrics if m.get("skipped")]
    if len(skipped) == len(metrics):
        reasons = sorted({str(m.get("skip_reason")) for m in skipped})
        raise RuntimeError(
            f"the SFT warm-up on task {getattr(task, 'name', task)!r} trained on nothing: its {steps} step(s) were "
            f"skipped ({'; '.join(reasons)}; {sum(int(m.get('pack/dropped_items', 0)) for m in skipped)} demonstrated "
            "step(s) dropped in packing); raise TrainerConfig.max_seq_len if they were too long"
        )
    import warnings

    if skipped:
        warnings.warn(f"SFT warm-up: {len(skipped)} of {steps} steps were skipped "
                      f"({skipped[0].get('skip_reason')})", stacklevel=2)  # fmt: skip
    dropped = sum(int(m.get("pack/dropped_items", 0)) for m in metrics)
    if dropped:  # e.g. a game's later turns: the warm-up would teach openings only
        total = sum(int(m.get("items", 0)) for m in metrics)
        warnings.warn(f"SFT warm-up: {dropped} of {total} demonstrated turns were longer than max_seq_len="
                      f"{trainer.config.max_seq_len} and dropped, so it trained on the shorter ones only; "
                      "raise TrainerConfig.max_seq_len", stacklevel=2)  # fmt: skip
    return metrics


def run_warmup(run: Any, *, steps: int, lr: float, per_step: int | None, options: Mapping[str, Any]) -> Any:
    """``await warmup()``: :func:`warm_up` of a ``train_env`` run (an ``EnvTraining``: its
    trainer, client and task), its steps' metrics appended to ``run.warmup``; None when ``steps``
    is 0. ``options``: the run's ``build_env_training`` keywords (``seed``, ``max_tokens``,
    ``prompts_per_step * group_size``: ``per_step``'s default). The run folder's ``run.json``
    records ``sft_warmup_steps``, ``sft_warmup_lr`` and ``sft_warmup_per_step`` (0, None, None without one)."""
    per_step = (per_step or int(options["prompts_per_step"]) * int(options["group_size"])) if steps else None
    if getattr(run, "folder", None) is not None:
        run.folder.update_config(sft_warmup_steps=steps, sft_warmup_lr=lr if steps else None,
                                 sft_warmup_per_step=per_step)  # fmt: skip
    if not steps:
        return None

    seed, max_tokens, n = int(options["seed"]), int(options["max_tokens"]), int(per_step or 1)

    async def warmup() -> None:
        run.warmup.extend(await warm_up(run.trainer, run.client, run.task, steps=steps, per_step=n, seed=seed,
                                        max_tokens=max_tokens, lr=lr))  # fmt: skip

    return warmup

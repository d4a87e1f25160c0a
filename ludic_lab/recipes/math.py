"""GSM8K-format math for the examples: data, the task (:func:`math_task`) and its engine, and
saving the trained policy as a model folder that an evaluation (or a vLLM server) loads.

``load_math(data, split)``: ``"shipped"`` (the 400 word problems shipped with ludic_lab,
80 held out), ``"gsm_symbolic"`` (reasoning-gym's GSM8K-style generator, offline), or a
JSONL file / ``datasets`` folder in GSM8K's own format (``question``, ``answer`` ending in
``#### 42``; the number after ``####`` is the target).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ludic_lab.envs import DatasetQAEnv
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.parsers import Parser, ParseResult
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine
from ludic_lab.task import RequestStream, Task

SYSTEM_PROMPT = (
    "Solve the math problem. Think briefly if you need to, then give the final number inside "
    "<answer></answer> tags, for example <answer>42</answer>."
)
ENV, PROTOCOL = "math", "single_agent"
_FINAL = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"(?:(?<![\w)])[-+])?\d[\d,]*(?:\.\d+)?")  # a sign only where it is not a minus
AnswerFormat = Literal["tags", "lenient"]


def answer_parser(answer_format: AnswerFormat = "tags", *, error_reward: float = -1.0) -> Parser:
    """``"tags"``: the text inside ``<answer>..</answer>`` (the system prompt asks for it).
    ``"lenient"``: that, or else the last number in the reply (commas dropped). SmolLM2-135M
    greedily ends with "The answer is 24." and never writes the tags (16 of 16 held-out
    replies here), so with ``"tags"`` every answer scores -1 and GRPO has no signal. A reply
    with no number at all is a parse error (``error_reward``)."""
    strict = DatasetQAEnv.recommended_parser(error_reward=error_reward)
    if answer_format == "tags":
        return strict
    if answer_format != "lenient":
        raise ValueError(f"answer_format must be 'tags' or 'lenient', got {answer_format!r}")

    def lenient(text: str) -> ParseResult:
        r = strict(text)
        if r.action is not None:
            return r
        numbers = _NUMBER.findall(text or "")
        return ParseResult(numbers[-1].replace(",", "").lstrip("+"), 0.0) if numbers else r

    lenient.__name__ = "lenient_answer_parser"
    return lenient


def gsm8k_target(answer: str) -> str:
    """The number after ``####`` in a GSM8K answer (commas dropped); the text itself otherwise."""
    m = _FINAL.search(str(answer))
    return m.group(1).replace(",", "") if m else str(answer).strip()


def load_math(data: str = "shipped", split: Literal["train", "test"] = "train", *, size: int = 400,
              seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Rows with ``question`` and ``answer`` (the target number as a string); see the module doc."""
    if data == "shipped":
        from ludic_lab.data import load_math_word_problems

        return load_math_word_problems(split)
    if data == "gsm_symbolic":
        from ludic_lab.data import reasoning_gym_dataset

        # train and test come from disjoint generator seeds
        return reasoning_gym_dataset("gsm_symbolic", size=size, seed=seed + (0 if split == "train" else 10_000))
    path = Path(data)
    if path.is_dir():  # a datasets folder (save_to_disk) holding the split
        import datasets

        ds = datasets.load_from_disk(str(path))
        rows = [dict(r) for r in (ds[split] if isinstance(ds, datasets.DatasetDict) else ds)]
    elif path.is_file():
        from ludic_lab.envs.dataset_qa_env import load_jsonl

        rows = load_jsonl(path)
        if rows and "split" in rows[0]:
            rows = [r for r in rows if r.get("split") == split]
    else:
        raise FileNotFoundError(f"--data {data!r}: not 'shipped', 'gsm_symbolic', a JSONL file or a datasets folder")
    return [{**r, "id": r.get("id", f"{split}-{i}"), "answer": gsm8k_target(r["answer"])} for i, r in enumerate(rows)]


def math_verifier(data: str = "shipped") -> Callable[[str, str], bool]:
    """The verifier of ``data``: reasoning-gym's own scorer for ``gsm_symbolic``, else a numeric match."""
    if data == "gsm_symbolic":
        from ludic_lab.data import reasoning_gym_verifier

        return reasoning_gym_verifier("gsm_symbolic")
    from ludic_lab.envs.verifiers import numeric_match

    return numeric_match


def math_task(rows: list[dict[str, Any]], verifier: Callable[[str, str], bool], *,
              answer_format: AnswerFormat = "tags") -> Task:  # fmt: skip
    """The math task over ``rows``: env ``"math"`` (a :class:`DatasetQAEnv`; env seed = row),
    read by :func:`answer_parser` of ``answer_format`` (-1 for a reply it cannot read);
    request streams walk a seeded shuffle of the rows."""

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(rows, verifier=verifier, system_prompt=SYSTEM_PROMPT)

    return Task(ENV, make_env, parser=answer_parser(answer_format), size=len(rows), shuffle=True,
                protocol_kind=PROTOCOL)  # fmt: skip


def math_engine(client: Any, rows: list[dict[str, Any]], verifier: Callable[[str, str], bool], *,
                concurrency: int = 64, episode_timeout_s: float = 600.0,
                answer_format: AnswerFormat = "tags") -> RolloutEngine:  # fmt: skip
    """The :func:`math_task`'s engine (env ``"math"``, protocol ``"single_agent"``) sampling
    through ``client``; an episode still running after ``episode_timeout_s`` is recorded as failed."""
    task = math_task(rows, verifier, answer_format=answer_format)
    return task.engine(client, max_concurrency=concurrency, episode_timeout_s=episode_timeout_s)


class QuestionRequests(RequestStream):
    """``requests_fn``: ``questions`` rows per call, walking through a seeded shuffle of them
    (a :class:`~ludic_lab.task.RequestStream`: ``state_dict()`` says where it is)."""

    def __init__(self, num_rows: int, questions: int, inference: InferenceSpec, *, seed: int = 0) -> None:
        super().__init__(ENV, PROTOCOL, per_step=questions, size=num_rows, seed=seed, shuffle=True, inference=inference)


def training_sampling(temperature: float, max_tokens: int) -> InferenceSpec:
    """Sampling for training: ``temperature``, ``max_tokens``, token ids and logprobs returned."""
    return InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())


async def held_out_accuracy(engine: RolloutEngine, n: int, max_tokens: int) -> dict[str, float]:
    """Greedy accuracy of ``engine`` (a :func:`math_engine`) on its first ``n`` rows."""
    from ludic_lab.eval import evaluate

    res = await evaluate(engine, EnvSpec(ENV), ProtocolSpec(PROTOCOL), range(n), k=1, max_tokens=max_tokens)
    return accuracy_summary(res)


def accuracy_summary(result: Any, k: int | None = None) -> dict[str, float]:
    """``accuracy``, ``parse_error_rate``, ``failure_rate`` (and ``pass@k``) of an
    :class:`~ludic_lab.eval.EvalResult`, as floats."""
    s = result.summary()
    out = {"accuracy": float(s["accuracy"]), "parse_error_rate": float(s.get("parse_error_rate", 0.0)),
           "num_items": float(s["num_items"]),
           # episodes that raised or hit the engine's episode timeout count as wrong: say how many
           "failure_rate": float(s.get("failure_rate", 0.0))}  # fmt: skip
    if k and k > 1 and f"pass@{k}" in s:
        out[f"pass@{k}"] = float(s[f"pass@{k}"])
    return out

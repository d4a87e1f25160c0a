"""``DatasetQAEnv``: single-turn question answering over a dataset, graded by a verifier.

Each episode shows one question; the agent's (parsed) answer is graded by ``verifier`` and
the episode ends. The sample comes from the reset seed: ``seed % len(dataset)`` (so seeds
``0..n-1`` enumerate the dataset exactly once); ``seed=None`` walks the dataset in order,
one sample per reset, wrapping around.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.verifiers import Verifier, numeric_match
from ludic_lab.jsonl import read_jsonl
from ludic_lab.parsers import Parser, xml_tag_parser
from ludic_lab.types import Info, StepOutcome

Sample = Mapping[str, Any]
PromptBuilder = Callable[[Sample], str]

DEFAULT_QA_SYSPROMPT = (
    "Solve the problem. You may think step by step first. "
    "Then write only the final answer, a number, inside <answer></answer> tags, "
    "for example: <answer>42</answer>"
)


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSONL file into a list of dicts; a bad line is an error naming file and line."""
    return read_jsonl(path, what="JSONL dataset (pass a list of dicts, a JSONL path or a datasets.Dataset)")


def _is_hf_dataset(data: object) -> bool:
    return type(data).__module__.split(".")[0] == "datasets" and type(data).__name__ == "Dataset"


class DatasetQAEnv(SingleAgentEnv):
    """One question per episode from ``data``; reward ``correct_reward`` if ``verifier`` accepts.

    ``data``: a list of dicts, one dict (a single-sample env, as in Ludic), a JSONL path or a
    ``datasets.Dataset``. ``env_step`` info holds ``correct``, ``target``, ``index``, ``id``.
    The recommended parser (:meth:`recommended_parser`) matches :attr:`suggested_sysprompt`.
    """

    ANSWER_TAG = "answer"

    def __init__(
        self,
        data: Sequence[Sample] | Sample | str | os.PathLike | Any,
        *,
        question_key: str = "question",
        answer_key: str = "answer",
        id_key: str = "id",
        verifier: Verifier = numeric_match,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        system_prompt: str | None = DEFAULT_QA_SYSPROMPT,
        prompt_builder: PromptBuilder | None = None,
    ) -> None:
        super().__init__()
        if not callable(verifier):
            raise TypeError(f"verifier must be a callable (prediction, target) -> bool, got {verifier!r}")
        self.question_key, self.answer_key, self.id_key = question_key, answer_key, id_key
        self.verifier = verifier
        self.correct_reward, self.incorrect_reward = float(correct_reward), float(incorrect_reward)
        self._system_prompt = system_prompt
        self._prompt_builder = prompt_builder
        self._data = self._load(data)
        if len(self._data) == 0:
            raise ValueError("DatasetQAEnv: the dataset is empty; pass at least one sample")
        self._validate_keys()
        self._cursor = 0
        self._index: int | None = None
        self._obs = ""

    # -- data ---------------------------------------------------------------------------
    def _load(self, data: Any) -> Any:
        if isinstance(data, (str, os.PathLike)):
            return load_jsonl(data)
        if type(data).__module__.split(".")[0] == "datasets":
            kind = type(data).__name__
            if kind == "Dataset":
                return data
            if "Dict" in kind:
                raise TypeError(f"DatasetQAEnv got a {kind} with splits {sorted(data)}; pick one, e.g. data['train']")
            raise TypeError(f"DatasetQAEnv needs random access; {kind} is not supported, use a datasets.Dataset")
        if isinstance(data, Mapping):
            return [dict(data)]
        if isinstance(data, Iterable):
            rows = list(data)
            for i, r in enumerate(rows):
                if not isinstance(r, Mapping):
                    raise TypeError(f"DatasetQAEnv: sample {i} is a {type(r).__name__}, expected a dict")
            return rows
        raise TypeError(
            f"DatasetQAEnv: unsupported data {type(data).__name__}; "
            "pass a list of dicts, a JSONL path or a datasets.Dataset"
        )

    def _validate_keys(self) -> None:
        needed = [self.answer_key] + ([] if self._prompt_builder else [self.question_key])
        if _is_hf_dataset(self._data):
            cols = list(self._data.column_names)
            for key in needed:
                if key not in cols:
                    raise KeyError(f"DatasetQAEnv: key {key!r} is not a dataset column; columns are {cols}")
            return
        for i, row in enumerate(self._data):
            for key in needed:
                if key not in row:
                    raise KeyError(
                        f"DatasetQAEnv: sample {i} has no key {key!r} (keys: {sorted(row)}); "
                        f"set question_key=/answer_key= to the right field names"
                    )

    def __len__(self) -> int:
        return len(self._data)

    def sample(self, index: int) -> dict[str, Any]:
        """The raw sample at ``index`` (a copy)."""
        return dict(self._data[int(index)])

    # -- SingleAgentEnv -------------------------------------------------------------------
    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as on SingleAgentEnv
        return self._system_prompt

    @classmethod
    def recommended_parser(cls, *, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
        """The parser matching the default system prompt: the text inside ``<answer>...</answer>``."""
        return xml_tag_parser(cls.ANSWER_TAG, success_reward=success_reward, error_reward=error_reward)

    @property
    def current_index(self) -> int | None:
        """Index of the current sample (``None`` before the first reset)."""
        return self._index

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        n = len(self._data)
        if seed is None:
            index = self._cursor % n
            self._cursor = index + 1
        else:
            index = int(seed) % n
        self._index = index
        row = self._data[index]
        self._obs = self._prompt_builder(row) if self._prompt_builder else str(row[self.question_key])
        return self._obs, {"index": index, "id": self._sample_id(row, index)}

    def env_step(self, action: str) -> StepOutcome:
        if self._index is None:
            raise RuntimeError("DatasetQAEnv.env_step called before env_reset(); reset the env first")
        row = self._data[self._index]
        target = str(row[self.answer_key])
        info: Info = {"index": self._index, "id": self._sample_id(row, self._index), "target": target}
        try:
            correct = bool(self.verifier(action if isinstance(action, str) else str(action), target))
        except Exception as e:  # noqa: BLE001 - a verifier bug must not kill the rollout
            correct = False
            info["verifier_error"] = f"{type(e).__name__}: {e}"
        info["correct"] = correct
        self._obs = "Correct." if correct else f"Incorrect. The correct answer is {target}."
        reward = self.correct_reward if correct else self.incorrect_reward
        return StepOutcome(obs=self._obs, reward=reward, truncated=False, terminated=True, info=info)

    def env_current_obs(self) -> str:
        return self._obs

    def _sample_id(self, row: Sample, index: int) -> Any:
        v = row.get(self.id_key) if hasattr(row, "get") else None
        return v if isinstance(v, (str, int)) and not isinstance(v, bool) else index

"""Offline task data shipped with ludic_lab, and converters from task generators.

``math_word_problems.jsonl`` (made by ``scripts/make_math_dataset.py``) holds 400 small
templated word problems (320 train / 80 test) with ``question`` and ``answer`` (a number as
a string), ready for :class:`~ludic_lab.envs.DatasetQAEnv`; ``capitals.jsonl`` the countries of
the demo and tutorials; ``multiplication.jsonl`` the products of the tool-use task. No
network is ever needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

DATA_DIR = Path(__file__).resolve().parent
MATH_WORD_PROBLEMS_PATH = DATA_DIR / "math_word_problems.jsonl"
"""Path of the shipped math word-problem dataset (JSONL)."""

Split = Literal["train", "test", "all"]


def load_math_word_problems(split: Split = "train") -> list[dict[str, Any]]:
    """The shipped word problems of ``split`` (``"train"``, ``"test"`` or ``"all"``) as dicts.

    Each dict has ``id``, ``question``, ``answer`` (str), ``split``, ``op``, ``a``, ``b``;
    order is the file's, so the result is the same on every call.
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    if not MATH_WORD_PROBLEMS_PATH.is_file():
        raise FileNotFoundError(
            f"{MATH_WORD_PROBLEMS_PATH} is missing; regenerate it with `python scripts/make_math_dataset.py`"
        )
    with MATH_WORD_PROBLEMS_PATH.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows if split == "all" else [r for r in rows if r["split"] == split]


CAPITALS_PATH = DATA_DIR / "capitals.jsonl"
"""Path of the shipped country -> capital dataset (JSONL, made by ``scripts/make_capitals_dataset.py``)."""


def load_capitals(split: Split = "train") -> list[dict[str, Any]]:
    """Country/capital questions of ``split`` (105 train / 26 test) as dicts with ``id``,
    ``country``, ``question`` ("What is the capital of X?"), ``answer``, ``aliases`` (other
    spellings of the answer :func:`capital_verifier` accepts, e.g. ``["Kiev"]``) and ``split``."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    with CAPITALS_PATH.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows if split == "all" else [r for r in rows if r["split"] == split]


def capital_verifier(capitals: Any = None) -> Callable[[str, str], bool]:
    """``(reply, capital) -> bool``: the reply names the right capital and no other capital.

    Naming several cities (a way to game a plain "contains" check) is wrong. Matching is
    case-, accent- and punctuation-insensitive on whole words. A capital's ``aliases`` in the
    data (other transliterations or a former name: Kiev for Kyiv, Peking for Beijing) name it too.
    """
    import re
    import unicodedata

    def norm(t: str) -> str:
        t = unicodedata.normalize("NFKD", t).encode("ascii", "ignore").decode().lower()
        return " " + re.sub(r"[^a-z]+", " ", t).strip() + " "

    spellings: dict[str, set[str]] = {}  # a capital (normalised) -> its name and its aliases (normalised)
    for r in capitals if capitals is not None else load_capitals("all"):
        spellings.setdefault(norm(r["answer"]), {norm(r["answer"])}).update(norm(a) for a in r.get("aliases", ()))
    groups = {n: forms for forms in spellings.values() for n in forms}  # any spelling -> all of them

    def verify(reply: str, target: str) -> bool:
        text, want = norm(reply), norm(target)
        forms = groups.get(want, {want})
        if not any(f in text for f in forms):
            return False
        return not any(other in text and not any(other in f for f in forms) for other in groups)

    return verify


MULTIPLICATION_PATH = DATA_DIR / "multiplication.jsonl"
"""Path of the shipped 3-digit x 2-digit products (JSONL, made by ``scripts/make_multiplication_dataset.py``)."""


def load_multiplication(split: Split = "train") -> list[dict[str, Any]]:
    """Products of ``split`` (300 train / 40 test) as dicts with ``id``, ``question`` ("What is
    347 * 29?" or "What is 347 times 29?"), ``answer`` (str), ``split``, ``a`` and ``b``: the
    task of ``ludic-lab demo --task tools``, which a 135M model solves only with a calculator."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    with MULTIPLICATION_PATH.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows if split == "all" else [r for r in rows if r["split"] == split]


EXPLAIN_CONCEPTS_PATH = DATA_DIR / "explain_concepts.jsonl"
"""Path of the shipped concepts to explain to a child (JSONL): the judged task of ``tutorials/11_judges``."""


def load_explain_concepts(split: Split = "train") -> list[dict[str, Any]]:
    """Concepts of ``split`` (36 train / 12 test) as dicts with ``id``, ``concept`` ("a magnet"),
    ``question`` ("Explain a magnet in one sentence a young child understands.") and ``split``.
    There is no reference answer: a judge scores the replies (:mod:`ludic_lab.demos.explain_task`)."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    with EXPLAIN_CONCEPTS_PATH.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows if split == "all" else [r for r in rows if r["split"] == split]


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("reasoning-gym is not installed: pip install 'ludic_lab[tasks]' (or reasoning-gym)") from e
    return reasoning_gym


def _json_safe(x: Any) -> Any:
    """``x`` as plain JSON data (tuples become lists, unknown objects their ``str``)."""
    return json.loads(json.dumps(x, default=str))


def reasoning_gym_dataset(name: str, size: int = 100, seed: int = 0, **config: Any) -> list[dict[str, Any]]:
    """``size`` problems of the reasoning-gym task ``name`` (e.g. ``"basic_arithmetic"``,
    ``"gsm_symbolic"``) as dicts with ``id``, ``question``, ``answer`` (str), ``source`` and
    JSON-safe ``metadata``; generated offline, deterministic in ``seed``. ``config`` goes to
    ``reasoning_gym.create_dataset``."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    ds = _reasoning_gym().create_dataset(name, size=size, seed=seed, **config)
    return [
        {
            "id": f"{name}-{seed}-{i}",
            "question": str(e["question"]),
            "answer": str(e["answer"]),
            "source": name,
            "metadata": _json_safe(e.get("metadata", {})),
        }
        for i, e in enumerate(ds)
    ]


EVALUATING_SCORERS = frozenset({
    "binary_matrix", "countdown", "intermediate_integration", "n_queens", "polynomial_multiplication",
    "puzzle24", "simple_integration", "spiral_matrix", "string_insertion",
})  # fmt: skip
"""reasoning-gym generators (0.1.25) whose ``score_answer`` runs the answer as Python: ``eval``
(``binary_matrix``, ``n_queens``, ``spiral_matrix``, ``string_insertion``) or sympy's
``parse_expr`` (the others). Model text reaches them only in the sandboxed scorer
(``reasoning_gym_task``); ``tests/test_evaluator_audit.py`` checks the list against the
installed package."""


def reasoning_gym_verifier(name: str, *, threshold: float = 1.0, **config: Any) -> Callable[[str, str], bool]:
    """A ``(prediction, target) -> bool`` verifier using task ``name``'s own ``score_answer``.

    Correct means score >= ``threshold``. Only the target answer is passed to the scorer, so
    this suits tasks scored from the answer alone (the arithmetic ones, ``gsm_symbolic``, ...).
    The scorer runs in this process, so a generator whose scorer evaluates the answer as code
    (:data:`EVALUATING_SCORERS`) is refused: score it with ``reasoning_gym_task`` (sandboxed).
    """
    if name in EVALUATING_SCORERS:
        raise ValueError(
            f"reasoning-gym's {name!r} scorer runs the answer as Python (eval / sympy parse_expr), and this "
            "verifier would run it in this process; model text is scored that way only in the sandbox: use "
            f"ludic_lab.task.external.reasoning_gym.reasoning_gym_task({name!r}) (docs/code_exec.md)"
        )
    ds = _reasoning_gym().create_dataset(name, size=1, seed=0, **config)

    def verify(prediction: str, target: str) -> bool:
        try:
            return float(ds.score_answer(prediction, {"answer": str(target), "metadata": {}})) >= threshold
        except Exception:  # noqa: BLE001 - a scorer that chokes on model text means "wrong"
            return False

    verify.__name__ = f"reasoning_gym_verifier_{name}"
    return verify


__all__ = [
    "load_explain_concepts",
    "load_math_word_problems",
    "load_multiplication",
    "reasoning_gym_dataset",
    "reasoning_gym_verifier",
]

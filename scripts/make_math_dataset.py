"""Generate ``ludic_lab/data/math_word_problems.jsonl``: small templated math word problems.

Each line is ``{"id", "question", "answer", "split", "op", "a", "b"}``: one addition,
subtraction or multiplication of small integers told as a short story (apples, coins,
trains, ...), with several phrasings per operation, so that a 135M-parameter chat model has
a chance to learn them with RL. ``answer`` is the result as a string. The output is a pure
function of ``--seed`` (same seed, same bytes); questions are unique across both splits.

    python scripts/make_math_dataset.py                 # rewrite the shipped file
    python scripts/make_math_dataset.py --out /tmp/x.jsonl --seed 1 --n-train 100 --n-test 20
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "ludic_lab" / "data" / "math_word_problems.jsonl"

NAMES = [
    ("Tom", "he"), ("Anna", "she"), ("Sam", "he"), ("Lily", "she"), ("Ben", "he"), ("Mia", "she"),
    ("Leo", "he"), ("Emma", "she"), ("Max", "he"), ("Zoe", "she"), ("Omar", "he"), ("Nina", "she"),
]  # fmt: skip

ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "cards", "balloons", "shells"]

# Each template: (op, text). {n}/{p}/{P} = name / pronoun / capitalised pronoun; {x} = item;
# {a}, {b} = operands. For "sub" a > b; the answer is a+b, a-b or a*b.
TEMPLATES: list[tuple[str, str]] = [
    ("add", "{n} has {a} {x}. {P} gets {b} more {x}. How many {x} does {n} have now?"),
    ("add", "{n} had {a} {x} and then found {b} more. How many {x} does {n} have in total?"),
    ("add", "There are {a} {x} in a box and {b} {x} on the table. How many {x} are there altogether?"),
    (
        "add",
        "A train has {a} passengers. At the next station {b} more passengers get on. "
        "How many passengers are on the train now?",
    ),
    ("add", "{n} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {p} read in all?"),
    ("add", "There are {a} birds on a tree. Then {b} more birds land on it. How many birds are on the tree?"),
    ("add", "What is {a} plus {b}?"),
    ("add", "{n} saved {a} coins last week and {b} coins this week. How many coins did {n} save?"),
    ("sub", "{n} has {a} {x}. {P} gives away {b} of them. How many {x} does {n} have left?"),
    ("sub", "{n} had {a} coins and spent {b} coins. How many coins are left?"),
    (
        "sub",
        "A train has {a} passengers. At the station {b} passengers get off. "
        "How many passengers are still on the train?",
    ),
    ("sub", "A baker made {a} cookies and sold {b} of them. How many cookies are left?"),
    ("sub", "There are {a} {x} in a bag. {n} takes out {b}. How many {x} are still in the bag?"),
    ("sub", "What is {a} minus {b}?"),
    ("sub", "{n} is {a} years old. How old was {p} {b} years ago?"),
    ("sub", "A class has {a} students. {b} of them are at home today. How many students are in class?"),
    ("mul", "{n} has {a} boxes. Each box holds {b} {x}. How many {x} does {n} have?"),
    ("mul", "A train has {a} cars and each car carries {b} people. How many people are on the train?"),
    ("mul", "One ticket costs {b} dollars. {n} buys {a} tickets. How many dollars does {n} spend?"),
    ("mul", "There are {a} rows of chairs with {b} chairs in each row. How many chairs are there?"),
    ("mul", "{n} reads {b} pages every day for {a} days. How many pages does {p} read?"),
    ("mul", "What is {a} times {b}?"),
    ("mul", "A farmer has {a} baskets with {b} eggs in each. How many eggs does the farmer have?"),
    ("mul", "{n} gives {b} {x} to each of {a} friends. How many {x} does {n} give away?"),
]

RANGES = {"add": ((1, 20), (1, 20)), "sub": ((3, 20), (1, 19)), "mul": ((2, 9), (2, 9))}


def _operands(op: str, rng: random.Random) -> tuple[int, int]:
    (lo_a, hi_a), (lo_b, hi_b) = RANGES[op]
    a = rng.randint(lo_a, hi_a)
    b = rng.randint(lo_b, hi_b if op != "sub" else min(hi_b, a - 1))
    return a, b


def _answer(op: str, a: int, b: int) -> int:
    return {"add": a + b, "sub": a - b, "mul": a * b}[op]


def generate(seed: int = 0, n_train: int = 320, n_test: int = 80) -> list[dict]:
    """``n_train + n_test`` unique problems, deterministic in ``seed``; each has a ``split``.

    Templates are used round-robin, so every phrasing is equally common;
    the test split is the last ``n_test`` items of a seeded shuffle.
    """
    rng = random.Random(seed)
    total = n_train + n_test
    seen: set[str] = set()
    rows: list[dict] = []
    misses = 0  # consecutive duplicates: many in a row means a template ran out of combinations
    while len(rows) < total:
        if misses > 2000:
            raise RuntimeError(f"could not make {total} unique problems (stuck at {len(rows)}); ask for fewer")
        op, text = TEMPLATES[len(rows) % len(TEMPLATES)]
        a, b = _operands(op, rng)
        name, pron = rng.choice(NAMES)
        q = text.format(n=name, p=pron, P=pron.capitalize(), x=rng.choice(ITEMS), a=a, b=b)
        if q in seen:
            misses += 1
            continue
        misses = 0
        seen.add(q)
        rows.append({"question": q, "answer": str(_answer(op, a, b)), "op": op, "a": a, "b": b})
    rng.shuffle(rows)
    out = []
    for i, r in enumerate(rows):
        split = "train" if i < n_train else "test"
        out.append({"id": f"mwp-{i:04d}", "question": r["question"], "answer": r["answer"], "split": split,
                    "op": r["op"], "a": r["a"], "b": r["b"]})  # fmt: skip
    return out


def write_jsonl(rows: list[dict], path: Path) -> None:
    """Write ``rows`` one JSON object per line (UTF-8, ``\\n`` endings, stable key order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=320)
    ap.add_argument("--n-test", type=int, default=80)
    args = ap.parse_args(argv)
    rows = generate(args.seed, args.n_train, args.n_test)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

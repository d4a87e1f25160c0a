"""Write ``ludic_lab/data/multiplication.jsonl``: 3-digit x 2-digit products (offline).

The tool-use task (``ludic-lab demo --task tools``): SmolLM2-135M cannot multiply 347 by 29
in its head (0 of 24 greedy answers were right) but can copy a calculator's result.
Deterministic (seed 0); 300 train and 40 test questions, no pair in both splits; half say
"*", half "times". Run: ``python scripts/make_multiplication_dataset.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "ludic_lab" / "data" / "multiplication.jsonl"
N_TRAIN, N_TEST = 300, 40
TEMPLATES = ("What is {a} * {b}?", "What is {a} times {b}?")


def rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < N_TRAIN + N_TEST:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        if (a, b) in seen or b % 10 == 0:  # distinct, and no trivial "x 10"-style products
            continue
        seen.add((a, b))
        pairs.append((a, b))
    out = []
    for i, (a, b) in enumerate(pairs):
        split = "test" if i >= N_TRAIN else "train"
        out.append(
            {
                "id": f"mul-{i:03d}",
                "question": TEMPLATES[i % 2].format(a=a, b=b),
                "answer": str(a * b),
                "split": split,
                "a": a,
                "b": b,
            }
        )
    return out


def main() -> None:
    data = rows()
    with OUT.open("w", encoding="utf-8") as f:
        for r in data:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(data)} questions to {OUT}")


if __name__ == "__main__":
    main()

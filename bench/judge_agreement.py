"""How often does a small local judge agree with a human on "explain X to a child"?

A hand-labelled set (``LABELLED``): for each of 6 concepts, 2 good answers (one correct,
simple sentence) and 2 bad ones (off-topic, wrong, or too technical / too long), 24 in all,
12 good and 12 bad. Each judge setup scores every answer; printed per setup:

- ``acc``: share of answers where ``score >= 0.5`` matches the label (chance 0.50);
- ``pair``: share of the 24 (good, bad) pairs *of the same concept* where the good answer
  scores higher (ties count half; chance 0.50). GRPO only uses the order of scores inside a
  group, so this is the number that says whether a judge can teach;
- ``failed``: answers without a score (unreadable verdicts).

Setups: SmolLM2-135M (``default``) and Gemma 3 270M (``gemma3-270m``, when installed), each
asked one yes/no question ("a correct explanation a young child understands?") read from the
reply text (``RubricJudge(ask="per_criterion")``) or from the probability of "yes" against
"no" at the reply's first token (``ask="logprob"``), with and without four worked examples
as earlier turns (``Criterion(examples=...)``); ``PairwiseJudge`` on each concept's four
answers (win rate as the score); and the deterministic checks of the worked task's rubric
(``ludic_lab.demos.explain_task``: one sentence, short, names the concept, plain words).

Run: ``python bench/judge_agreement.py [--models default,gemma3-270m]`` (about 2-4 min on 2
busy cores). Results measured here are in docs/judges.md ("Which judge agrees with a human").
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from ludic_lab.demos.explain_task import EXPLAIN_PROMPT, code_rubric, explain_judge, model_rubric
from ludic_lab.inference import LocalChatClient
from ludic_lab.judges import PairwiseJudge, RubricJudge
from ludic_lab.rewards import RewardResult
from ludic_lab.types import Rollout, Step

# (concept, answer, good?) -- written and labelled by hand
LABELLED: tuple[tuple[str, str, bool], ...] = (
    ("rain", "Rain is water that falls from clouds when the tiny drops in them get too heavy.", True),
    ("rain", "Clouds are full of little water drops, and when they get big they fall down as rain.", True),
    ("rain", "I like to play outside with my friends on sunny days.", False),
    ("rain", "Rain is when the sun gets very hot and melts into little drops of sunshine.", False),
    ("a magnet", "A magnet is a special rock or metal that pulls some other metal things toward it.", True),
    ("a magnet", "A magnet can stick to the fridge because it pulls on the metal door.", True),
    (
        "a magnet",
        "Magnetism arises from the alignment of electron spins in ferromagnetic domains, producing a macroscopic "
        "dipole moment whose field exerts forces on other dipoles and moving charges.",
        False,
    ),
    ("a magnet", "A magnet is a kind of fruit that grows on trees in the summer.", False),
    ("why we sleep", "We sleep so our body and brain can rest and grow and feel ready for a new day.", True),
    ("why we sleep", "Sleeping gives your body a break so you wake up with lots of energy to play.", True),
    ("why we sleep", "The capital of France is Paris, which is a big city.", False),
    ("why we sleep", "We sleep because the moon tells our eyes to close.", False),
    ("a rainbow", "A rainbow happens when sunlight shines through raindrops and splits into many colors.", True),
    ("a rainbow", "When the sun shines through rain, the light bends and makes a colorful arc in the sky.", True),
    (
        "a rainbow",
        "Dispersion of polychromatic light through spherical water droplets, via refraction and internal "
        "reflection at wavelength-dependent angles near 42 degrees, yields the spectral arc.",
        False,
    ),
    ("a rainbow", "Rainbows are painted in the sky by birds every morning.", False),
    ("a shadow", "A shadow is the dark shape you see when something blocks the light.", True),
    (
        "a shadow",
        "When you stand in the sun your body blocks the light, so a dark shape of you is on the ground.",
        True,
    ),
    ("a shadow", "Dogs are good pets because they are friendly and like to play fetch.", False),
    ("a shadow", "A shadow is a small animal that follows you everywhere and eats the light.", False),
    ("the wind", "Wind is air that moves from one place to another, and you can feel it push on you.", True),
    ("the wind", "Wind is moving air, like when you blow on your hand but much bigger.", True),
    (
        "the wind",
        "Atmospheric pressure gradients resulting from differential solar heating, modulated by the Coriolis "
        "effect, drive horizontal air mass advection. Further, boundary-layer friction alters it. It is complex.",
        False,
    ),
    ("the wind", "My favourite color is blue and I have a red bike.", False),
)


def labelled_rollouts() -> list[Rollout]:
    """One single-step rollout per labelled answer, grouped by concept (group id = the concept)."""
    out = []
    for i, (concept, answer, _good) in enumerate(LABELLED):
        prompt = EXPLAIN_PROMPT.format(concept=concept)
        step = Step(index=0, prev_obs=prompt, action=answer, parsed_action=answer, next_obs=None, reward=0.0)
        out.append(Rollout(id=f"a{i}", steps=(step,), group_id=concept))
    return out


def agreement(scores: Sequence[float | None]) -> dict[str, float]:
    """``acc`` (threshold 0.5), ``pair`` (same-concept good > bad, ties half), ``failed`` (no score)."""
    labels = [good for _c, _a, good in LABELLED]
    hits = [(s >= 0.5) == good for s, good in zip(scores, labels, strict=True) if s is not None]
    pairs = []
    for i, (ci, _a, gi) in enumerate(LABELLED):
        for j, (cj, _b, gj) in enumerate(LABELLED):
            if ci == cj and gi and not gj:
                si, sj = scores[i], scores[j]
                if si is not None and sj is not None:
                    pairs.append(1.0 if si > sj else 0.5 if si == sj else 0.0)
    return {
        "acc": sum(hits) / len(hits) if hits else float("nan"),
        "pair": sum(pairs) / len(pairs) if pairs else float("nan"),
        "failed": float(sum(s is None for s in scores)),
    }


def _scores(results: Sequence[RewardResult]) -> list[float | None]:
    return [r.score for r in results]


async def _pairwise(client: LocalChatClient, rollouts: list[Rollout]) -> list[float | None]:
    goal = "Which answer explains it better to a young child, correctly and simply?"
    judge = PairwiseJudge(client, goal=goal, timeout_s=None)  # a busy CPU serves 48 calls slowly
    by_concept: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        by_concept.setdefault(str(r.group_id), []).append(i)
    out: list[float | None] = [None] * len(rollouts)
    groups = await asyncio.gather(*(judge.score_group([rollouts[i] for i in idx]) for idx in by_concept.values()))
    for idx, res in zip(by_concept.values(), groups, strict=True):
        for i, r in zip(idx, res, strict=True):
            out[i] = r.score
    return out


async def run(models: Sequence[str]) -> dict[str, dict[str, float]]:
    """Every setup's agreement with the labels (see the module docstring)."""
    rollouts = labelled_rollouts()
    table: dict[str, dict[str, float]] = {}
    code = code_rubric()  # code criteria only: no model call
    texts = [(r.steps[0].prev_obs, r.steps[-1].action) for r in rollouts]
    table["code checks only"] = agreement([code.score(code.check_verdicts(str(p), a)) for p, a in texts])
    for model in models:
        client = LocalChatClient(model, max_batch_size=64)  # no judge timeout below: a loaded CPU is slow
        setups = (
            ("per_criterion, zero-shot (text)", "per_criterion", False),
            ("logprob, zero-shot", "logprob", False),
            ("per_criterion, 4 examples (text)", "per_criterion", True),
            ("logprob, 4 examples", "logprob", True),
        )
        for label, ask, examples in setups:
            t0 = time.perf_counter()
            judge = RubricJudge(client, model_rubric(examples=examples), ask=ask, timeout_s=None)  # type: ignore[arg-type]
            table[f"{model} {label}"] = {
                **agreement(_scores(await judge.score(rollouts))),
                "s": time.perf_counter() - t0,
            }
            print(f"{model} {label}: {table[f'{model} {label}']}", flush=True)
        hybrid = explain_judge(
            client, timeout_s=None
        )  # the worked task's rubric: code checks + this model, logprob, 4 examples
        table[f"{model} explain_rubric (code checks + logprob, 4 ex.)"] = agreement(
            _scores(await hybrid.score(rollouts))
        )
        t0 = time.perf_counter()
        table[f"{model} pairwise"] = {**agreement(await _pairwise(client, rollouts)), "s": time.perf_counter() - t0}
        print(f"{model} pairwise: {table[f'{model} pairwise']}", flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,gemma3-270m", help="comma-separated model names or folders")
    args = ap.parse_args()
    table = asyncio.run(run([m for m in args.models.split(",") if m]))
    print(f"\n{len(LABELLED)} answers (12 good, 12 bad), 24 same-concept (good, bad) pairs; chance = 0.50")
    print(f"{'setup':48s} {'acc':>5s} {'pair':>5s} {'failed':>6s} {'s':>6s}")
    for name, row in table.items():
        print(f"{name:48s} {row['acc']:5.2f} {row['pair']:5.2f} {row['failed']:6.0f} {row.get('s', 0.0):6.1f}")


if __name__ == "__main__":
    main()

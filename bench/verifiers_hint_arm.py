"""The Env-driven taskset of ``bench/verifiers_harness.py`` (``--taskset hint``): its scripted
backend, its agent program and the env that scores that program's answer.

``tests/verifiers_envs/vf_hint``: an ``Env`` of the taskset's own (``HintEnv``) plays the user
of its one seat: the model answers "What is N * 7?", the env sends a hint, the model answers
again (verifiers relaunches the seat's chat program on the conversation for that second
segment). The reward is ``correct`` (the last reply holds the product) + 0.5 ``answered_twice``.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")


def _product(text: str) -> int:
    a, b = (int(x) for x in _NUMBER.findall(text)[:2])
    return a * b


def hint_text(product: int) -> str:
    """What ``HintEnv`` sends as the user's second turn (its own wording)."""
    return f"Hint: it is a multiple of 7 with {len(str(product))} digits."


class ScriptedHint:
    """A zero-cost ``ChatClient`` for vf_hint: a wrong first answer, the product after the hint."""

    model_name = "scripted"

    def __init__(self, template: Any) -> None:
        self.chat_template = template
        self.policy_version = 0
        self._stop = min(template.stop_token_ids)

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        from ludic_lab.types import ChatResponse

        users = [m["content"] for m in request.messages if m.get("role") == "user"]
        product = _product(users[0])
        text = f"It is {product}." if len(users) > 1 else f"I think {product - 7}."
        ids = (*self.chat_template.encode_text(text), self._stop)
        prompt = request.prompt_token_ids or tuple(self.chat_template.render_ids(request.messages))
        return ChatResponse(text=text, completion_token_ids=ids, prompt_token_ids=prompt,
                            completion_logprobs=(-0.5,) * len(ids), finish_reason="stop",
                            policy_version=self.policy_version), {}  # fmt: skip


async def hint_program(client: Any, task: str) -> str:
    """The same exchange as an ``openai``-SDK program: answer, take the env's hint, answer again."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    r = await client.chat.completions.create(model="policy", messages=messages)
    messages += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": hint_text(_product(task))}]  # fmt: skip
    r = await client.chat.completions.create(model="policy", messages=messages)
    return r.choices[0].message.content or ""


def hint_env(source: Any) -> Any:
    """vf_hint's tasks as an env an agent program steps: the same prompts, ``HintEnv``'s reward
    for a program that answered twice (``correct`` + 0.5)."""
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv
    from ludic_lab.types import StepOutcome

    class HintTaskEnv(VerifiersTaskEnv):
        def env_step(self, action: str) -> StepOutcome:
            ok = str(self.task.data.answer) in action
            return StepOutcome(obs="", reward=float(ok) + 0.5, truncated=False, terminated=True, info={})

    return HintTaskEnv(source)

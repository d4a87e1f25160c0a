"""Test helpers: a real ChatML tokenizer, a scripted ChatClient and tiny test environments.

``ScriptedChatClient`` is a genuine :class:`~ludic_lab.inference.ChatClient`: it returns
pre-scripted completion texts, but its prompt and completion token ids come from a real
:class:`~ludic_lab.inference.chat_template.ChatTemplate` over a real byte-level BPE tokenizer
(trained in well under a second by the ``tokenizers`` library), and it honours
``request.prompt_token_ids`` exactly as a token-in backend must.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.types import ChatResponse, Info, StepOutcome

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "You are a helpful assistant. Answer with <move>3</move> or <answer>42</answer>.",
    "<think>Let me think about the board. The centre is free.</think> <move>5</move>",
    "What is 2 + 3? The answer is 5. Good job, try again, invalid action.",
    "user assistant system tool the a an of to in is it you that he was for on are",
    "Board: X O . / . X . / O . . Your turn. Reply with a cell number from 1 to 9.",
    "0123456789 +-*/=()[]{}<>.,;:!?'\"\n\t",
]


@functools.lru_cache(maxsize=1)
def chatml_tokenizer() -> Any:
    """A small byte-level BPE ``PreTrainedTokenizerFast`` with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def chatml_template() -> ChatTemplate:
    """A ChatTemplate over :func:`chatml_tokenizer` (stop ids: ``<|im_end|>``)."""
    return ChatTemplate(chatml_tokenizer())


def raw_decode(template: ChatTemplate, ids: Sequence[int]) -> str:
    """Decode ids keeping special tokens: equals the rendered template text exactly."""
    return template.tokenizer.decode(list(ids), skip_special_tokens=False)


@dataclass(frozen=True)
class Reply:
    """One scripted completion; ``error`` makes that call raise instead.

    ``per_char=True`` tokenizes the text one character at a time: a valid but
    non-canonical tokenization, as samplers often produce, which re-tokenizing would lose.
    """

    text: str = ""
    finish_reason: str = "stop"
    error: BaseException | None = None
    delay_s: float = 0.0
    per_char: bool = False


Script = Sequence[str | Reply] | Callable[[ChatCompletionRequest], str | Reply]


class ScriptedChatClient:
    """A ChatClient returning scripted completions with real token ids.

    ``script`` is a list consumed in order (running out is an error naming the call) or a
    function of the request. With ``chat_template=None`` the client behaves like a backend
    that cannot tokenize: no ``chat_template`` attribute and no ids in responses.
    """

    def __init__(
        self,
        script: Script,
        *,
        chat_template: ChatTemplate | None = None,
        policy_version: int | None = None,
    ) -> None:
        self._script = script
        self._calls = 0
        self._template = chat_template
        if chat_template is not None:
            self.chat_template = chat_template
        self.policy_version = policy_version
        self.requests: list[ChatCompletionRequest] = []

    def _next(self, request: ChatCompletionRequest) -> Reply:
        if callable(self._script):
            r = self._script(request)
        else:
            if self._calls >= len(self._script):
                raise RuntimeError(f"ScriptedChatClient: script exhausted at call {self._calls}")
            r = self._script[self._calls]
        return r if isinstance(r, Reply) else Reply(text=r)

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        self.requests.append(request)
        reply = self._next(request)
        self._calls += 1
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.error is not None:
            raise reply.error
        if self._template is None:
            return ChatResponse(text=reply.text, finish_reason=reply.finish_reason), {"call": self._calls - 1}
        t = self._template
        prompt = (
            list(request.prompt_token_ids) if request.prompt_token_ids is not None else t.render_ids(request.messages)
        )
        if reply.per_char:
            completion = [i for ch in reply.text for i in t.encode_text(ch)]
        else:
            completion = t.encode_text(reply.text)
        if reply.finish_reason == "stop":
            completion.append(t.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        logprobs = [-0.5] * len(completion)
        resp = ChatResponse(
            text=reply.text,
            completion_token_ids=completion,
            prompt_token_ids=prompt,
            completion_logprobs=logprobs,
            finish_reason=reply.finish_reason,
            policy_version=self.policy_version,
        )
        return resp, {"call": self._calls - 1}

    def sync_weights(self, params: Mapping[str, Any], *, timeout_s: float = 600.0, version: Any = None) -> str:
        self.policy_version = int(version) if version is not None else (self.policy_version or 0) + 1
        return str(self.policy_version)


# ---------------------------------------------------------------------------------------
# Test environments
# ---------------------------------------------------------------------------------------


class CountingEnv(SingleAgentEnv):
    """Guess-the-word env that counts ``env_step`` calls.

    Action ``"win"`` terminates with reward 1; ``"boom"`` raises; anything else gives
    reward ``-0.1`` and the observation ``"try again (n)"``. ``reset_raises`` makes reset fail.
    """

    def __init__(self, *, reset_raises: bool = False, sysprompt: str | None = "Guess the word.") -> None:
        super().__init__()
        self.step_calls = 0
        self.reset_seeds: list[int | None] = []
        self.actions: list[str] = []
        self._reset_raises = reset_raises
        self._sysprompt = sysprompt
        self._obs = ""

    @property
    def suggested_sysprompt(self) -> str | None:
        return self._sysprompt

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        if self._reset_raises:
            raise OSError("dataset file missing")
        self.reset_seeds.append(seed)
        self._obs = f"Guess the secret word (seed={seed})."
        return self._obs, {"seed": seed}

    def env_step(self, action: str) -> StepOutcome:
        self.step_calls += 1
        self.actions.append(action)
        if action == "boom":
            raise ValueError("env exploded on 'boom'")
        if action == "win":
            self._obs = "Correct!"
            return StepOutcome(obs=self._obs, reward=1.0, truncated=False, terminated=True, info={"correct": True})
        self._obs = f"try again ({self.step_calls})"
        return StepOutcome(obs=self._obs, reward=-0.1, truncated=False, terminated=False, info={"correct": False})

    def env_current_obs(self) -> str:
        return self._obs


class TurnGameEnv(LudicEnv[str, str, str]):
    """Two players alternate (``"A"`` then ``"B"``); a player saying ``"win"`` wins.

    The winner's outcome is returned with the loser's (``terminated``, reward ``-1``), even
    though the loser did not act. A non-winning move returns an outcome for the mover and
    an observation update for the other player. ``"boom"`` raises. Counts ``step`` calls.
    """

    def __init__(self, *, simultaneous: bool = False) -> None:
        self.simultaneous = simultaneous
        self.step_calls = 0
        self.step_actions: list[dict[str, str]] = []
        self._turn = 0
        self._done = True

    @property
    def agent_ids(self) -> list[str]:
        return ["A", "B"]

    @property
    def active_agents(self) -> list[str]:
        if self._done:
            return []
        return ["A", "B"] if self.simultaneous else [self.agent_ids[self._turn % 2]]

    def suggested_sysprompt(self, agent_id: str | None = None) -> str | None:
        return f"You are player {agent_id}."

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        self._turn = 0
        self._done = False
        return {a: (f"new game (seed={seed}), you are {a}", {}) for a in self.agent_ids}

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        self.step_calls += 1
        self.step_actions.append(dict(actions))
        if self._done:
            raise RuntimeError("step after game over")
        out: dict[str, StepOutcome] = {}
        for a, act in actions.items():
            if act == "boom":
                raise ValueError(f"player {a} broke the game")
            if act == "win":
                other = "B" if a == "A" else "A"
                self._done = True
                out[a] = StepOutcome(obs="you won", reward=1.0, truncated=False, terminated=True)
                out[other] = StepOutcome(
                    obs="you lost", reward=-1.0, truncated=False, terminated=True, info={"winner": a}
                )
                return out
        for a, act in actions.items():
            out[a] = StepOutcome(obs=f"you played {act}", reward=0.0, truncated=False, terminated=False)
            if not self.simultaneous:
                other = "B" if a == "A" else "A"
                out[other] = StepOutcome(
                    obs=f"{a} played {act}, your turn", reward=0.0, truncated=False, terminated=False
                )
        self._turn += 1
        return out

"""Fixed opponents for TextArena games: players the env moves itself (``env_driven_agents``).

An opponent is any callable ``obs -> action`` (sync or ``async``): ``obs`` is everything the
game has shown that player so far, as TextArena's ``LLMObservationWrapper`` writes it (what
TextArena's own agents are given), and the action is the raw reply the game judges. Ready-made:

- ``"random"`` (:func:`random_move`): a random move among those the game last listed as
  available / valid / legal, else among the bracketed actions its text shows (the rules'
  examples); seeded per episode by the env seed, so a held-out seed is a held-out opponent;
- a :class:`~ludic_lab.inference.ChatClient` (:func:`chat_opponent`): a model that is not trained,
  asked as TextArena's own LLM agents ask (its system prompt, the observation as one message).
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig

STANDARD_GAME_PROMPT = (
    "You are a competitive game player. Make sure you read the game instructions carefully, "
    "and always follow the required format."
)
"""TextArena's system prompt for its LLM agents (``textarena.agents.basic_agents``)."""

Opponent = Callable[[str], "str | Awaitable[str]"]
"""``obs -> action`` (or an awaitable of it): a player the env moves itself."""

_LISTED = re.compile(r"(available|valid|legal|possible)\s+(moves|actions)", re.IGNORECASE)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
_MESSAGE = re.compile(r"^\[(?:GAME|Player \d+)\] ", re.MULTILINE)


def legal_moves(obs: str) -> list[str]:
    """The bracketed moves in the last message of ``obs`` that lists available / valid / legal
    moves, from that phrase on (``"Available Moves: '[0]', '[4]'"`` -> ``["[0]", "[4]"]``); if no
    message lists them, every distinct bracketed action ``obs`` shows. Role tags are not moves."""
    bodies = [b for b in _MESSAGE.split(obs) if b.strip()]
    for body in reversed(bodies):
        m = _LISTED.search(body)
        if m:
            found = _moves(body[m.end() :])
            if found:
                return found
    return _moves(obs)


def _moves(text: str) -> list[str]:
    tags = {"[GAME]"} | {m.group(0) for m in re.finditer(r"\[Player \d+\]", text)}
    return list(dict.fromkeys(t for t in _BRACKETED.findall(text) if t not in tags))


def random_move(obs: str, rng: random.Random) -> str:
    """One of :func:`legal_moves` of ``obs``, drawn with ``rng`` (``"[0]"`` when it finds none:
    the game then judges an invalid move, as it would any player's)."""
    moves = legal_moves(obs)
    return rng.choice(moves) if moves else "[0]"


def random_move_opponent(seed: int = 0) -> Opponent:
    """An opponent playing :func:`random_move` with its own ``random.Random(seed)`` (the env's
    ``"random"`` opponent is reseeded every episode instead)."""
    rng = random.Random(seed)

    def opponent(obs: str) -> str:
        return random_move(obs, rng)

    return opponent


def chat_opponent(
    client: Any,
    *,
    system_prompt: str | None = STANDARD_GAME_PROMPT,
    max_tokens: int = 64,
    temperature: float = 0.0,
    model: str = "default",
) -> Opponent:
    """An opponent played by ``client`` (any ChatClient; not trained): each move is one
    completion of ``[system_prompt, obs]`` (TextArena's agents send the same), greedy by default."""
    if not callable(getattr(client, "complete", None)):
        raise TypeError(f"chat_opponent needs a ChatClient (with async complete), got {type(client).__name__}")
    sampling = SamplingConfig(temperature=temperature, max_tokens=max_tokens)

    async def opponent(obs: str) -> str:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": obs}
        ]
        response, _ = await client.complete(
            ChatCompletionRequest(model=model, messages=tuple(messages), sampling=sampling)
        )
        return str(response.text)

    return opponent


OpponentSpec = Any
"""``"random"``, a ChatClient, or an :data:`Opponent` callable."""


def resolve_opponent(spec: OpponentSpec, rng: Callable[[], random.Random]) -> Opponent:
    """The opponent callable for ``spec``: ``"random"`` draws with ``rng()`` (the env's
    per-episode generator), a ChatClient becomes :func:`chat_opponent`, a callable stays itself."""
    if isinstance(spec, str):
        if spec != "random":
            raise ValueError(f"unknown opponent {spec!r}: use 'random', a ChatClient or a callable obs -> action")
        return lambda obs: random_move(obs, rng())
    if callable(getattr(spec, "complete", None)):
        return chat_opponent(spec)
    if callable(spec):
        return spec
    raise TypeError(f"an opponent is 'random', a ChatClient or a callable obs -> action, got {type(spec).__name__}")

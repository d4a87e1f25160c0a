"""The word environment: ``reset(seed)`` picks a word, the agent has two attempts to reply with it.

Reward 1.0 for a reply that holds the word (case ignored), else 0.0; the episode ends on a
right reply or after the second attempt. ``reset(delay_s=...)`` makes every step of that
episode take ``delay_s`` seconds (a slow environment, for timeout tests); ``reset(hold_while=path)``
makes each step wait while the file ``path`` exists (at most two minutes), so a test decides
when the steps in flight answer; a step that waits first creates ``<path>.held-<episode id>``,
so the test knows which steps the server holds.
"""

import os
import time
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ..models import WordAction, WordObservation

WORDS = ("apple", "river", "cloud", "stone", "tiger", "music", "bread", "light")
ATTEMPTS = 2


class WordEnvironment(Environment):
    """Repeat the word (module docstring); one instance per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._word = WORDS[0]
        self._attempts = ATTEMPTS
        self._delay_s = 0.0
        self._hold_while: str | None = None

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        delay_s: float = 0.0,
        hold_while: str | None = None,
        **kwargs: Any,
    ) -> WordObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._word = WORDS[(seed or 0) % len(WORDS)]
        self._attempts, self._delay_s, self._hold_while = ATTEMPTS, float(delay_s), hold_while
        return WordObservation(prompt=f"Repeat the word: {self._word}", attempts_left=ATTEMPTS, done=False, reward=0.0)

    def step(self, action: WordAction, timeout_s: float | None = None, **kwargs: Any) -> WordObservation:  # type: ignore[override]
        if self._delay_s:
            time.sleep(self._delay_s)
        deadline = time.monotonic() + 120
        if self._hold_while and os.path.exists(self._hold_while):
            open(f"{self._hold_while}.held-{self._state.episode_id}", "w").close()
        while self._hold_while and os.path.exists(self._hold_while) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._state.step_count += 1
        self._attempts -= 1
        if self._word in action.message.lower():
            return WordObservation(prompt="Correct.", attempts_left=self._attempts, done=True, reward=1.0)
        done = self._attempts <= 0
        prompt = "Wrong." if done else f"Not quite. Repeat the word: {self._word}"
        return WordObservation(prompt=prompt, attempts_left=self._attempts, done=done, reward=0.0)

    @property
    def state(self) -> State:
        return self._state

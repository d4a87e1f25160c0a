"""An OpenAI-compatible endpoint over any ``ChatClient`` that records token-exact episodes.

Agent programs written against the ``openai`` SDK (or a framework on top of it) call
``/v1/chat/completions``; each episode's calls are recorded in its own :class:`Session` with
their exact token traces, ready to become a :class:`~ludic_lab.types.Rollout`
(:class:`~ludic_lab.interaction.AgentProgramProtocol`). Needs the ``openai`` extra
(``pip install -e '.[openai]'``: fastapi, uvicorn, openai).
"""

from ludic_lab.extras import require_extra

require_extra("openai", what="ludic_lab.endpoint")  # fastapi, uvicorn, openai: one line naming the install

from ludic_lab.endpoint.server import DEFAULT_MODEL_NAME, OpenAIEndpoint  # noqa: E402
from ludic_lab.endpoint.sessions import RecordedCall, Session, SessionError  # noqa: E402

__all__ = ["DEFAULT_MODEL_NAME", "OpenAIEndpoint", "RecordedCall", "Session", "SessionError"]

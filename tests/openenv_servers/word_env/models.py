"""Data models of the word environment (as ``openenv init``'s template writes them)."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class WordAction(Action):
    """The agent's reply."""

    message: str = Field(..., description="The reply that should hold the word")


class WordObservation(Observation):
    """What the agent is asked, and how many attempts it has left."""

    prompt: str = Field(default="", description="The instruction, or the verdict on the last reply")
    attempts_left: int = Field(default=0, description="Replies the agent may still send")

"""Data models of the code environment."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class CodeAction(Action):
    """Python source the environment runs."""

    code: str = Field(..., description="Python code; set `result` to return a value")


class CodeObservation(Observation):
    """What the code left in ``result``, or the error it raised."""

    output: str = Field(default="", description="repr of `result`, or the error")

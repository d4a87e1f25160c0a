"""FastAPI app of the code environment (``uvicorn code_env.server.app:app``)."""

from openenv.core.env_server.http_server import create_app

from ..models import CodeAction, CodeObservation
from .code_environment import CodeEnvironment

app = create_app(CodeEnvironment, CodeAction, CodeObservation, env_name="code_env", max_concurrent_envs=8)

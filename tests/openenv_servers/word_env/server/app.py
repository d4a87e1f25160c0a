"""FastAPI app of the word environment (``uvicorn openenv_servers.word_env.server.app:app``)."""

from openenv.core.env_server.http_server import create_app

from ..models import WordAction, WordObservation
from .word_environment import WordEnvironment

app = create_app(WordEnvironment, WordAction, WordObservation, env_name="word_env", max_concurrent_envs=8)

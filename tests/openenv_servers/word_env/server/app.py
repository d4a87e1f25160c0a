"""FastAPI app of the word environment (``uvicorn openenv_servers.word_env.server.app:app``).

With ``WORD_ENV_START_ONCE=path`` in its environment the app starts only once: it writes
``path`` on its first start and refuses to import when ``path`` exists (a server that cannot
be started again, for the restart tests).
"""

import os

from openenv.core.env_server.http_server import create_app

from ..models import WordAction, WordObservation
from .word_environment import WordEnvironment

_once = os.environ.get("WORD_ENV_START_ONCE")
if _once:
    if os.path.exists(_once):
        raise SystemExit(f"word_env: {_once} exists: this server was started once already and refuses to start again")
    open(_once, "w").close()

app = create_app(WordEnvironment, WordAction, WordObservation, env_name="word_env", max_concurrent_envs=8)

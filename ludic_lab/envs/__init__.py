"""Environments (layer 2): the :class:`LudicEnv` kernel, :class:`SingleAgentEnv`, shipped envs
(:class:`DatasetQAEnv`, :class:`TicTacToeEnv`, :class:`TicTacToeMultiAgentEnv`, the sandboxed
:class:`CodeExecEnv` of ``envs.code_exec``), answer verifiers and the :func:`check_env`
conformance checker (:func:`check_env_async` in a running event loop)."""

from ludic_lab.envs.checker import EnvCheckReport, check_env, check_env_async
from ludic_lab.envs.checker_calls import EnvCheckError
from ludic_lab.envs.code_exec import (
    CodeExecConfig as CodeExecConfig,
    CodeExecEnv as CodeExecEnv,
    SandboxPool as SandboxPool,
)
from ludic_lab.envs.dataset_qa_env import DatasetQAEnv
from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.tic_tac_toe import TicTacToeEnv, TicTacToeGame, TicTacToeRewards
from ludic_lab.envs.tic_tac_toe_multi import TicTacToeMultiAgentEnv
from ludic_lab.envs.verifiers import Verifier, exact_match, numeric_match

__all__ = [
    "LudicEnv",
    "SingleAgentEnv",
    "DatasetQAEnv",
    "TicTacToeEnv",
    "TicTacToeMultiAgentEnv",
    "TicTacToeGame",
    "TicTacToeRewards",
    "Verifier",
    "exact_match",
    "numeric_match",
    "check_env",
    "check_env_async",
    "EnvCheckError",
    "EnvCheckReport",
]

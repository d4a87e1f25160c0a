"""Evaluation (layer 6): run a policy over held-out env seeds, ``k`` samples each, and score it.

``await evaluate(engine, env_spec, protocol_spec, seeds, k=...)`` runs through
:class:`~ludic_lab.rollouts.RolloutEngine` and returns an :class:`EvalResult` (a per-rollout
DataFrame, accuracy, pass@k, parse-error rate, failures); :func:`evaluate_qa` does the
wiring for :class:`~ludic_lab.envs.DatasetQAEnv`; :func:`evaluate_task` takes a model (a client
or a saved folder) and any task, env or agent program (:mod:`ludic_lab.eval.task_eval`).
``*_sync`` variants block (scripts and Jupyter cells alike).
"""

from ludic_lab.eval.evaluator import (
    EngineEvaluator,
    Evaluator,
    eval_inference as eval_inference,
    eval_requests as eval_requests,
    evaluate,
    evaluate_sync,
)
from ludic_lab.eval.metrics import mean_pass_at_k, pass_at_k, pass_at_k_curve, wilson_interval
from ludic_lab.eval.qa import evaluate_qa, evaluate_qa_sync, qa_engine as qa_engine
from ludic_lab.eval.result import TABLE_COLUMNS as TABLE_COLUMNS, EvalResult, eval_table as eval_table
from ludic_lab.eval.success import DefaultSuccess, InfoKeySuccess, RewardThresholdSuccess, SuccessFn
from ludic_lab.eval.task_eval import evaluate_task, evaluate_task_sync as evaluate_task_sync

__all__ = [
    "Evaluator",
    "EngineEvaluator",
    "EvalResult",
    "SuccessFn",
    "DefaultSuccess",
    "InfoKeySuccess",
    "RewardThresholdSuccess",
    "evaluate",
    "evaluate_sync",
    "evaluate_qa",
    "evaluate_qa_sync",
    "evaluate_task",
    "pass_at_k",
    "mean_pass_at_k",
    "pass_at_k_curve",
    "wilson_interval",
]

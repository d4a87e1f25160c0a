"""Losses under the reference's import path (``ludic.training.loss``); they live in
:mod:`ludic_lab.training.losses`, one small file per family, and token logprobs in
:mod:`ludic_lab.training.logprobs`."""

from ludic_lab.training.logprobs import model_token_logprobs as model_token_logprobs, token_logprobs as token_logprobs
from ludic_lab.training.losses import *  # noqa: F403 - the reference import path re-exports every loss

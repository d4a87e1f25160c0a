"""Saving a trained policy (layer 6): a merged model folder and a PEFT adapter that every backend
loads as they are (:func:`save_policy`), and trainer callbacks that save every N steps
(:class:`SavePolicy`) or keep the best by an evaluation metric (:class:`KeepBest`).

Saved policies are for using (sampling, serving, evaluating); checkpoints
(:mod:`ludic_lab.training.checkpoint`) are for resuming training. See ``docs/saving.md``.
"""

from ludic_lab.saving.callbacks import KeepBest as KeepBest, SavePolicy as SavePolicy
from ludic_lab.saving.policy import SavedPolicy as SavedPolicy, save_policy as save_policy

"""Environments from other packages as ludic_lab envs, protocols and rewards (layer 3).

One module per package, each behind its own extra (a missing package is one line naming the
``pip install``, never an ImportError from deep inside a stack); see docs/environments.md:

- :mod:`ludic_lab.integrations.verifiers_env`: verifiers (v1) environments run through
  ludic_lab's OpenAI-compatible endpoint, scored by their own rewards (extra ``verifiers``);
- :mod:`ludic_lab.integrations.openenv_env`: OpenEnv environment servers (extra ``openenv``);
- :mod:`ludic_lab.integrations.textarena_env`: TextArena games, one and two players (extra ``textarena``);
- :mod:`ludic_lab.integrations.gym_env`: Gymnasium and PettingZoo environments with text spaces (extra ``gym``).

The :class:`~ludic_lab.task.Task` of each (rows, held-out split, evaluation) is in
:mod:`ludic_lab.task.external`, with reasoning-gym's generators by name. Nothing here is
imported by this package's ``__init__``: importing ``ludic_lab.integrations`` needs none of
the packages.
"""

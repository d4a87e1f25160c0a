"""Tasks over environments from other packages (layer 6): reasoning-gym generators by name,
verifiers environments, OpenEnv servers, TextArena games and Gymnasium environments, each a
:class:`~ludic_lab.task.Task` with its own held-out split and evaluation. One module per
package (see :mod:`ludic_lab.integrations` for the envs and protocols they build on); none is
imported here, so this package needs none of them.
"""

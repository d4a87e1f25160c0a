"""Credit assigners under the reference's path (``ludic.training.credit_assignment``).

Re-exports :mod:`ludic_lab.rollouts.credit`; see its modules for the formulas and rules.
"""

from ludic_lab.rollouts.credit import *  # noqa: F403 - the module the reference's map names

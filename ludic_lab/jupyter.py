"""Where this code runs: an IPython shell, a Jupyter kernel, or neither.

Checked through ``sys.modules`` so that nothing here imports IPython: outside a notebook
these return ``None``/``False`` at no cost.
"""

from __future__ import annotations

import sys
from typing import Any


def ipython_shell() -> Any | None:
    """The running IPython shell (terminal IPython or a Jupyter kernel), or None."""
    ipy = sys.modules.get("IPython")
    return ipy.get_ipython() if ipy is not None else None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (a shell with a kernel attached), False elsewhere."""
    shell = ipython_shell()
    return shell is not None and getattr(shell, "kernel", None) is not None

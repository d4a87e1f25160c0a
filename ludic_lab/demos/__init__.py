"""The demos ``ludic-lab demo`` runs besides the capitals one (:mod:`ludic_lab.demo`):
:mod:`~ludic_lab.demos.tool_task` (multiplication with a calculator tool: env, agents,
evaluation, statistics) and :mod:`~ludic_lab.demos.tool_demo` (``ludic-lab demo --task
tools``: GRPO with the tool, then a no-tool control)."""

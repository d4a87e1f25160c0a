from vf_exec_tool.taskset import ExecTaskset

__all__ = ["ExecTaskset"]

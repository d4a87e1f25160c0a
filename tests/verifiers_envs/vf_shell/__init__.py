from vf_shell.taskset import ShellTaskset

__all__ = ["ShellTaskset"]

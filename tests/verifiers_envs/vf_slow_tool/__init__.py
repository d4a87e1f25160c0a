from vf_slow_tool.taskset import SlowToolTaskset

__all__ = ["SlowToolTaskset"]

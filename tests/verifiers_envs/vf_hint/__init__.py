from vf_hint.taskset import HintEnv, HintTaskset

__all__ = ["HintEnv", "HintTaskset"]

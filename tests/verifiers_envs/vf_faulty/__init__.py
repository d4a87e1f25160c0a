from vf_faulty.taskset import FaultyTaskset

__all__ = ["FaultyTaskset"]

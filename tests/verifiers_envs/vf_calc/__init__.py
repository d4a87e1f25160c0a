from vf_calc.taskset import CalcTaskset

__all__ = ["CalcTaskset"]

from vf_runs_reply.taskset import RunsReplyTaskset

__all__ = ["RunsReplyTaskset"]

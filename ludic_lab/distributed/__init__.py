"""Distribution (layer 4): pushing policy weights to inference runtimes."""

from ludic_lab.distributed.interfaces import PolicyPublisher
from ludic_lab.distributed.publisher import ClientPublisher, Rank0OnlyPublisher

__all__ = ["PolicyPublisher", "ClientPublisher", "Rank0OnlyPublisher"]

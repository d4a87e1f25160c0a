"""Containers: a stack, a ring-buffer queue and a binary min-heap."""

from stackq.heap import MinHeap, heapsort
from stackq.queue import RingQueue
from stackq.stack import Stack

__all__ = ["MinHeap", "RingQueue", "Stack", "heapsort"]

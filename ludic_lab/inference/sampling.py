"""``SamplingConfig`` at the reference's module path (Ludic's ``inference/sampling.py``).

The config itself is one of the request types (:mod:`ludic_lab.inference.request`); the
in-process sampler that applies it to logits is :mod:`ludic_lab.inference.local.sampling`.
No torch import here.
"""

from ludic_lab.inference.request import SamplingConfig as SamplingConfig

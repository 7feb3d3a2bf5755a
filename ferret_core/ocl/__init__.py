"""OCL algorithms as small plugins over the engine's hooks (:mod:`ferret_core.engine.steps`): ``vanilla``,
``er`` (Chaudhry et al. 2019), ``mir`` (Aljundi et al. 2019), ``lwf`` (Li & Hoiem 2017), ``mas``
(Aljundi et al. 2018). How each composes with a P-stage, N-worker pipeline: docs/ocl.md."""

from ferret_core.ocl.algorithm_registry import ALGORITHM_NAMES, make_algorithm
from ferret_core.ocl.settings import AlgorithmSettings

__all__ = ["ALGORITHM_NAMES", "AlgorithmSettings", "make_algorithm"]

"""``ferret bench``: the paper's experiments (Zhou et al., CVPR 2025, §Experiments) as declarative specs.

An experiment is settings × arms (a method at a budget, with an OCL algorithm and a compensator) × seeds
(:mod:`services.bench.specs`); each run is an independent ``ferret simulate`` process
(:mod:`services.bench.runner`), its result one CSV row (:mod:`services.bench.results_csv`); tables
(:mod:`services.bench.tables`) and plots (:mod:`services.bench.plots`) are made from the rows. Methods,
algorithms and compensators are addressed by their registry names; :mod:`services.bench.capabilities`
refuses a name this checkout's ``ferret simulate`` does not offer, naming it.
"""

from services.bench.specs import Arm, ExperimentSpec, RunSpec, Setting

__all__ = ["Arm", "ExperimentSpec", "RunSpec", "Setting"]

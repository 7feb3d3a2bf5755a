"""``ferret demo``: the whole service on one machine (DESIGN §6).

Modules: ``options`` (what a run does, its defaults), ``commands`` (the children's command lines),
``orchestrator`` (process life cycle), ``live_view`` (the terminal), ``collect`` (the independent
read-back), ``record`` / ``report`` / ``plot`` (summary.json, report.md, the PNG), ``accuracy_curve``
(the online accuracy over time that report.md's PNG draws).
"""

from services.demo.options import DemoOptions
from services.demo.orchestrator import DemoError, DemoRun

__all__ = ["DemoError", "DemoOptions", "DemoRun"]

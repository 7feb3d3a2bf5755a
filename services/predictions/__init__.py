"""Downstream readers of ``<prefix>.predictions`` (docs/predictions.md): typed records, an iterator over
the topic, and a pandas DataFrame helper.

    from services.predictions import iter_predictions, to_dataframe
    frame = to_dataframe(iter_predictions("127.0.0.1:9092", "ferret"))
"""

from services.predictions.frame import MissingExtra, to_dataframe
from services.predictions.reader import iter_predictions
from services.predictions.records import CONTENT_TYPE, ClassProbability, PredictionReadError, PredictionRecord

__all__ = [
    "CONTENT_TYPE",
    "ClassProbability",
    "MissingExtra",
    "PredictionReadError",
    "PredictionRecord",
    "iter_predictions",
    "to_dataframe",
]

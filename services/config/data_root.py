"""The data root: the folder the datasets are read from (``MNIST/raw`` and the others under it;
:func:`ferret_core.data.load_dataset` takes it explicitly). Where no ``--data-root`` (nor
``producer.data_root``) names it, it is ``../shared/data`` next to the repository when that folder exists,
else ``$XDG_CACHE_HOME/ferret/data`` (``~/.cache/ferret/data`` when the variable is unset or empty)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_HOME_ENV = "XDG_CACHE_HOME"


def default_data_root() -> Path:
    """``../shared/data`` next to the repository when it exists, else ``$XDG_CACHE_HOME/ferret/data``
    (``~/.cache/ferret/data``). Only the services resolve this default; the core takes the root explicitly."""
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"
    if shared.is_dir():
        return shared
    cache = os.environ.get(CACHE_HOME_ENV) or str(Path.home() / ".cache")
    return Path(cache) / "ferret" / "data"

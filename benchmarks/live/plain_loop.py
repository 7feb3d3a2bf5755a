"""The plain reference consumer, as the live benchmarks run it: ``python -m benchmarks.live.plain_loop`` is
``python -m services.plain_consumer`` (moved to ``services/`` so that ``ferret demo`` runs the same loop live
beside Ferret; the flags and the JSON line are unchanged)."""

from services.plain_consumer.consumer import (
    MAX_AGE_MS,
    HopTrace,
    PlainLoop,
    consume,
    main,
    saturation,
    trainer_settings,
)

__all__ = ["MAX_AGE_MS", "HopTrace", "PlainLoop", "consume", "main", "saturation", "trainer_settings"]

if __name__ == "__main__":
    raise SystemExit(main())

"""Guarded updates (a last-good shadow, a sequential test, rollback and promotion) and drift detection
around the trainer's learner: :class:`~services.trainer.guard.learner.GuardedLearner`."""

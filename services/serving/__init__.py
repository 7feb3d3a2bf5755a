"""The learned model outside the trainer: export files, the versioned model stream and ``ferret serve``.

- :mod:`.model_card`: what rebuilds a model (spec, input shape, classes, input contract).
- :mod:`.export_files`: ``ferret export``'s safetensors weights + JSON manifest, and :func:`load_export`,
  which rebuilds the model without Redis, Kafka or the trainer.
- :mod:`.model_stream`: the trainer's model updates on a Redis stream, written and followed.
- :mod:`.holder`, :mod:`.follower`, :mod:`.servicer`, :mod:`.server`: the ``ferret.v1.Serving`` process.
"""

"""``ferret.v1.Serving``'s Predict: a batch of samples → classes, probabilities, the model version.

Inputs go through the trainer's own :class:`~services.kafka.record_codec.SampleDecoder` for the model's
card, one sample at a time, so serving accepts exactly what the record path accepts (dtype, shape,
finite values, the input range and normaliser) and normalises it the same way (``uint8`` / 255): the same
weights then give the trainer's predictions. A request that does not fit gets INVALID_ARGUMENT naming the
sample and what was expected; before the first model, UNAVAILABLE.
"""

from __future__ import annotations

import math
import time

import grpc
import numpy as np
import torch

from services.kafka.record_codec import ALLOWED_DTYPES, Rejection
from services.proto_gen.ferret.v1 import messages_pb2, serving_pb2, serving_pb2_grpc
from services.serving.errors import InvalidInput, NoModelYet
from services.serving.holder import ModelHolder, ServedModel
from services.serving.metrics import ServingMetrics
from services.serving.model_card import predict_probabilities


class ServingServicer(serving_pb2_grpc.ServingServicer):
    """Answers Predict from the :class:`ModelHolder`'s model in force."""

    def __init__(self, holder: ModelHolder, metrics: ServingMetrics, max_batch: int = 1024) -> None:
        self._holder = holder
        self._metrics = metrics
        self._max_batch = max_batch

    def Predict(self, request: serving_pb2.PredictRequest, context: grpc.ServicerContext) -> serving_pb2.PredictReply:
        began = time.perf_counter()
        try:
            served = self._holder.get()
            xs = self.inputs(request, served)
            reply = answer(served, xs)
        except NoModelYet as exc:
            self._metrics.errors.labels("UNAVAILABLE").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except InvalidInput as exc:
            self._metrics.errors.labels("INVALID_ARGUMENT").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._metrics.latency.observe(time.perf_counter() - began)
        self._metrics.predictions.inc(xs.shape[0])
        return reply

    def inputs(self, request: serving_pb2.PredictRequest, served: ServedModel) -> torch.Tensor:
        """The batch as the trainer's decoder makes each sample (float32, normalised), or InvalidInput."""
        card = served.card
        expected = f"[B, {', '.join(map(str, card.input_shape))}] with 1 <= B <= {self._max_batch}"
        if not request.HasField("inputs"):
            raise InvalidInput(f"the request has no inputs tensor: expected shape {expected}")
        tensor = request.inputs
        shape = tuple(int(s) for s in tensor.shape)
        if tensor.dtype not in ALLOWED_DTYPES:
            raise InvalidInput(f"inputs dtype {tensor.dtype!r}: expected one of {', '.join(ALLOWED_DTYPES)}")
        fits = len(shape) == len(card.input_shape) + 1 and shape[1:] == card.input_shape
        if not fits or not 1 <= shape[0] <= self._max_batch:
            raise InvalidInput(
                f"inputs shape {list(shape)}: expected {expected} (model {card.model!r} takes samples of shape "
                f"{list(card.input_shape)}; serving does not resize)"
            )
        itemsize = ALLOWED_DTYPES[tensor.dtype].itemsize
        per_sample = math.prod(card.input_shape) * itemsize
        if len(tensor.data) != shape[0] * per_sample:
            raise InvalidInput(
                f"inputs hold {len(tensor.data)} data bytes, expected {shape[0] * per_sample} for shape {list(shape)} "
                f"of {tensor.dtype}"
            )
        rows = []
        data = memoryview(tensor.data)
        for i in range(shape[0]):
            sample = messages_pb2.Sample(id=f"predict/{i}", sequence=i)
            sample.tensor.shape.extend(card.input_shape)
            sample.tensor.dtype = tensor.dtype
            sample.tensor.data = bytes(data[i * per_sample : (i + 1) * per_sample])
            decoded = served.decoder.decode(sample.SerializeToString())
            if isinstance(decoded, Rejection):
                raise InvalidInput(f"sample {i} of the batch is invalid ({decoded.reason}): {decoded.detail}")
            rows.append(decoded.x)
        return torch.stack(rows)


def answer(served: ServedModel, xs: torch.Tensor) -> serving_pb2.PredictReply:
    """The reply for a decoded batch: top class and its probability per sample, every probability."""
    probs = predict_probabilities(served.model, xs)
    confidences, classes = probs.max(dim=1)  # the first of equal maxima, as the trainer's stable sort
    reply = serving_pb2.PredictReply(
        classes=classes.tolist(),
        confidences=confidences.tolist(),
        model_version=served.version,
        model_update_time_ms=served.update_ms,
        model_received_time_ms=served.received_ms,
        model_lineage=served.lineage,
    )
    reply.probabilities.shape.extend(probs.shape)
    reply.probabilities.dtype = "float32"
    reply.probabilities.data = probs.numpy().astype(np.dtype("<f4"), copy=False).tobytes()
    return reply

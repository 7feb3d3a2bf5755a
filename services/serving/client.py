"""A small client of ``ferret.v1.Serving`` (``ferret serve --predict``, the tests and the benchmark)."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import grpc
import numpy as np

from services.control.auth import channel_credentials, token_metadata
from services.proto_gen.ferret.v1 import serving_pb2, serving_pb2_grpc
from services.serving.errors import ModelStreamError

DEFAULT_TARGET = "127.0.0.1:50061"


class PredictCallError(ModelStreamError):
    """A Predict call failed; ``code`` is the gRPC status, ``details`` the server's reason."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details
        super().__init__(f"Predict: {code.name}: {details}")


def predict_request(xs: np.ndarray) -> serving_pb2.PredictRequest:
    """A request for the batch ``xs`` (first dimension: samples; uint8 or float, sent little-endian)."""
    array = np.ascontiguousarray(xs)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    request = serving_pb2.PredictRequest()
    request.inputs.shape.extend(array.shape)
    request.inputs.dtype = array.dtype.name
    request.inputs.data = array.tobytes()
    return request


def probabilities(reply: serving_pb2.PredictReply) -> np.ndarray:
    """The reply's [B, classes] float32 probabilities."""
    tensor = reply.probabilities
    return np.frombuffer(tensor.data, dtype="<f4").reshape(tuple(tensor.shape))


class ServingClient:
    """One channel to a serving process (``tls_ca`` turns TLS on; ``token``: bearer token)."""

    def __init__(
        self, target: str = DEFAULT_TARGET, *, token: str | None = None, tls_ca: Path | None = None,
        timeout_s: float = 30.0,
    ) -> None:  # fmt: skip
        if tls_ca is not None:
            self._channel = grpc.secure_channel(target, channel_credentials(tls_ca))
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = serving_pb2_grpc.ServingStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = token_metadata(token)
        self.timeout_s = timeout_s

    def predict(self, xs: np.ndarray) -> serving_pb2.PredictReply:
        try:
            reply: serving_pb2.PredictReply = self._stub.Predict(
                predict_request(xs), timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            raise PredictCallError(code, (exc.details() if hasattr(exc, "details") else "") or code.name) from None
        return reply

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

from services.proto_gen.ferret.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictRequest(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _messages_pb2.Tensor
    def __init__(self, inputs: _Optional[_Union[_messages_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PredictReply(_message.Message):
    __slots__ = ("classes", "confidences", "probabilities", "model_version", "model_update_time_ms", "model_received_time_ms", "model_lineage")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCES_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_UPDATE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_RECEIVED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[int]
    confidences: _containers.RepeatedScalarFieldContainer[float]
    probabilities: _messages_pb2.Tensor
    model_version: int
    model_update_time_ms: int
    model_received_time_ms: int
    model_lineage: int
    def __init__(self, classes: _Optional[_Iterable[int]] = ..., confidences: _Optional[_Iterable[float]] = ..., probabilities: _Optional[_Union[_messages_pb2.Tensor, _Mapping]] = ..., model_version: _Optional[int] = ..., model_update_time_ms: _Optional[int] = ..., model_received_time_ms: _Optional[int] = ..., model_lineage: _Optional[int] = ...) -> None: ...

"""The ``content-type`` record header that names the protobuf message of a Kafka record's value.

Every record Ferret writes carries it (docs/predictions.md "Record headers")::

    content-type: application/x-protobuf; messageType=ferret.v1.Prediction

The header name is CloudEvents' Kafka binding's (``content-type``, lower case); the value is the media
type protobuf-over-HTTP services commonly use, with the message's full name (package included) as the
``messageType`` parameter. A reader decodes the value with that message and refuses a record naming
another one (a producer wrote to the wrong topic) instead of misreading its bytes; a record without the
header (written before it existed) is read as the topic's message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

HEADER = "content-type"
MEDIA_TYPE = "application/x-protobuf"

Headers = Sequence[tuple[str, bytes | str | None]]


def content_type(message: type[Message] | Message) -> str:
    """``application/x-protobuf; messageType=<full name>`` of a generated message class (or instance)."""
    return f"{MEDIA_TYPE}; messageType={message.DESCRIPTOR.full_name}"


def header(message: type[Message] | Message) -> tuple[str, bytes]:
    """The ``(name, value)`` record header naming ``message``, as the Kafka clients take it."""
    return HEADER, content_type(message).encode()


@dataclass(frozen=True, slots=True)
class ContentType:
    """A parsed ``content-type`` header: the media type and its ``messageType`` parameter (or None)."""

    media_type: str
    message_type: str | None

    def names(self, message: type[Message] | Message) -> bool:
        """Whether this is protobuf of exactly ``message``."""
        return self.media_type == MEDIA_TYPE and self.message_type == message.DESCRIPTOR.full_name

    def __str__(self) -> str:
        return self.media_type if self.message_type is None else f"{self.media_type}; messageType={self.message_type}"


def parse(headers: Headers | Mapping[str, bytes | str | None] | None) -> ContentType | None:
    """The ``content-type`` among a record's headers, or None when it has none. Names compare
    case-insensitively (as HTTP's); the last such header wins."""
    value: bytes | str | None = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()  # confluent-kafka gives either
    for name, data in pairs:
        if name.lower() == HEADER:
            value = data
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    media, *params = (part.strip() for part in text.split(";"))
    message = None
    for param in params:
        key, _, val = param.partition("=")
        if key.strip().lower() == "messagetype":
            message = val.strip().strip('"')
    return ContentType(media.lower(), message)

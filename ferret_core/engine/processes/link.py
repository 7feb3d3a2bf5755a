"""Messages between two ranks of a job over ``torch.distributed`` point-to-point: the control channel
between the coordinator of a process clock and the hosts that own some of its stages (:mod:`.hosts`).

Across hosts there is no pipe and no shared memory, so the coordinator's messages to a remote executor
(its next action, a question, a re-plan's settings) and the answers travel over the job's process group
(gloo, joined through ``torchrun``'s c10d rendezvous): each message is pickled and sent as a length
(one int64) and its bytes (uint8), with the link's tag, so the two directions never match each other's
receives; a message that fits in FRAME bytes (every control message but a stage-0 input of a large
image) is one send. One sender thread per link drains a queue, so :meth:`Link.send` never blocks its caller (the
clock sends under its lock); one thread of the owner receives. A failure of either direction (the peer
gone, the group broken) closes the link: later sends raise :class:`BrokenPipeError`, as a dead pipe's do,
so the clock treats a lost host as it treats a lost executor process.
"""

from __future__ import annotations

import pickle
import queue
import threading
from typing import Any

import torch
import torch.distributed as dist

TAG_DOWN = 11  # coordinator → host
TAG_UP = 12  # host → coordinator: executors' answers, exits, replies
TAG_MASTER = 13  # host → coordinator: the newest master of an owned stage (the follower copy, :mod:`.hosts`)

_STOP = object()


FRAME = 4096  # bytes of a message's first send: its length (8 bytes) and as much of it as fits
_HEADER = 8


def send_object(obj: Any, dst: int, tag: int, group: Any = None) -> None:
    """Send ``obj`` (pickled) to rank ``dst`` (blocks until received): one frame of FRAME bytes holding
    its length and its first bytes (a control message fits: one send), then the rest if any."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    frame = bytearray(FRAME)
    frame[:_HEADER] = len(data).to_bytes(_HEADER, "little")
    head = data[: FRAME - _HEADER]
    frame[_HEADER : _HEADER + len(head)] = head
    dist.send(torch.frombuffer(frame, dtype=torch.uint8), dst, group=group, tag=tag)
    if len(data) > len(head):
        rest = torch.frombuffer(bytearray(data[len(head) :]), dtype=torch.uint8)
        dist.send(rest, dst, group=group, tag=tag)


def recv_object(src: int, tag: int, group: Any = None) -> Any:
    """Receive one :func:`send_object` message from rank ``src``."""
    frame = torch.empty(FRAME, dtype=torch.uint8)
    dist.recv(frame, src, group=group, tag=tag)
    raw = frame.numpy().tobytes()
    size = int.from_bytes(raw[:_HEADER], "little")
    data = raw[_HEADER : _HEADER + size]
    if size > FRAME - _HEADER:
        rest = torch.empty(size - (FRAME - _HEADER), dtype=torch.uint8)
        dist.recv(rest, src, group=group, tag=tag)
        data += rest.numpy().tobytes()
    return pickle.loads(data)


class Link:
    """One direction out (queued, sent by a thread of its own) and one in, with rank ``peer``."""

    def __init__(self, peer: int, *, send_tag: int, recv_tag: int, group: Any = None, name: str = "link") -> None:
        self.peer = peer
        self.send_tag = send_tag
        self.recv_tag = recv_tag
        self.group = group
        self.error: BaseException | None = None  # the first failure (either direction)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name=f"ferret-{name}-send", daemon=True)
        self._sender.start()

    def send(self, obj: Any) -> None:
        """Queue ``obj`` for the peer; raises :class:`BrokenPipeError` once the link has failed."""
        if self.error is not None:
            raise BrokenPipeError(f"the link to rank {self.peer} is closed: {self.error}")
        self._queue.put(obj)

    def recv(self) -> Any:
        """The peer's next message (blocks); a failure closes the link and is raised."""
        try:
            return recv_object(self.peer, self.recv_tag, self.group)
        except BaseException as exc:
            self.fail(exc)
            raise

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the sender thread."""
        self._queue.put(_STOP)
        self._sender.join(timeout)

    def _send_loop(self) -> None:
        while True:
            obj = self._queue.get()
            if obj is _STOP:
                return
            if self.error is not None:
                continue  # the link failed: drop what was queued (the clock learns it from the error)
            try:
                send_object(obj, self.peer, self.send_tag, self.group)
            except BaseException as exc:
                self.fail(exc)

"""NATS JetStream: streams, de-duplicated publishing and durable pull consumers.

    bus = await Bus.connect(settings.nats_servers, name="executor",
                            credentials=settings.nats_credentials, inbox=inbox_prefix("executor"))
    await bus.ensure_stream("ORDERS", ["order.placed", "order.paid"])
    await bus.publish("order.placed", payload, msg_id=order_id)
    consumer = bus.consumer("ORDERS", durable="billing", subject="order.placed", handler=handle)

(Dispo's own streams, subjects and message ids are declared in dispo.libs.contracts.)
    await consumer.run()        # until consumer.stop()

A handler returns :data:`ACK`, :class:`Nak` (redeliver, optionally after a delay) or
:class:`Term` (never redeliver: malformed or meaningless). An exception is logged and
treated as ``Nak(delay=error_delay)``. While a handler runs, the message's ack deadline is
extended, so long work is not redelivered to another consumer.

A message larger than the server's ``max_payload`` (from its INFO; headers count) is never
sent: :meth:`Bus.publish` and :meth:`Bus.publish_many` raise :class:`MessageTooLarge` before
writing anything (the server would close the connection on it). A publisher whose payload
size depends on its caller checks :meth:`Bus.message_size` against :attr:`Bus.max_payload`
where it can still refuse the caller.

A consumer's ``subject`` is one filter or several (``("task.status.*.failed",
"task.status.*.succeeded")``): the server delivers only what they match. At start the
durable is created, or brought to this configuration (filters, ack wait, max deliveries) if
it exists with another one; what it already acknowledged stays acknowledged. A consumer
that names ``max_ack_pending`` (the most messages in flight across every replica sharing
the durable) brings the durable to that too.

:meth:`Bus.read_subject` reads back what a stream holds on one subject (a task's status
snapshots, say), in stream order from a sequence, bounded by a count and a deadline, with an
ephemeral consumer it deletes after the read.

A process proves who it is with :class:`BusCredentials` (a user and password, a token, a
credentials file or an NKey seed file; ``DISPO_NATS_*``). Credentials the server refuses
raise :class:`BusCredentialsRefused` at once, naming who was refused, rather than retrying
for ever; a publish or subscribe the server's permissions refuse is logged as an error.

A message whose headers carry a trace context (``traceparent``; :mod:`dispo.libs.tracing`)
is handled in a span continuing it.

What happens to a message that keeps failing is the service's quarantine's business
(:mod:`dispo.libs.quarantine`), which wraps the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import nats
from dispo.libs.logging import get_logger
from dispo.libs.tracing import continued
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    PubAck,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

log = get_logger(__name__)


@dataclass(frozen=True)
class Ack:
    pass


@dataclass(frozen=True)
class Nak:
    delay: float | None = None


@dataclass(frozen=True)
class Term:
    reason: str


ACK = Ack()
Disposition = Ack | Nak | Term
Handler = Callable[[Msg], Awaitable[Disposition]]

MSG_ID_HEADER = "Nats-Msg-Id"

# JetStream's answer to creating a consumer that exists with another configuration.
CONSUMER_EXISTS = 10148


def inbox_prefix(service: str) -> str:
    """The reply subjects of ``service``'s connections, ``_INBOX.<service>``: its bus user
    may subscribe to these and to no other service's replies."""
    return f"_INBOX.{service}"


@dataclass(frozen=True)
class BusCredentials:
    """How a process proves who it is to NATS: a user and password, a token, a credentials
    file (a user JWT with its NKey seed) or an NKey seed file; all empty is anonymous."""

    user: str = ""
    password: str = ""
    token: str = ""
    creds_file: str = ""
    nkey_seed_file: str = ""

    def describe(self) -> str:
        """Who these credentials say the process is, without their secret."""
        if self.user:
            return f"user {self.user!r}"
        if self.creds_file:
            return f"the credentials file {self.creds_file}"
        if self.nkey_seed_file:
            return f"the NKey seed file {self.nkey_seed_file}"
        return "a token" if self.token else "an anonymous client"

    def options(self) -> dict[str, Any]:
        """Their options of ``nats.connect``."""
        options: dict[str, Any] = {}
        if self.user:
            options.update(user=self.user, password=self.password)
        if self.token:
            options["token"] = self.token
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        return options


class BusCredentialsRefused(Exception):
    """The server refused this process's credentials (or their absence)."""


def _refusal(error: Exception) -> bool:
    return isinstance(error, nats.errors.AuthorizationError) or (
        "authorization violation" in str(error).lower()
    )


class StreamUnavailable(Exception):
    """JetStream could not serve a request now (no server answering for it, a cluster
    without a leader for the stream, the connection down); the same request may succeed
    later."""


# What JetStream answers while it cannot serve a request (a leader election in a cluster,
# the server restarting, the connection lost): a later try may succeed.
_UNAVAILABLE = (
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
)


@contextlib.contextmanager
def _unavailable_as(stream: str) -> Iterator[None]:
    """A stream request's failure that a later try may overcome (:data:`_UNAVAILABLE`, or a
    JetStream API error of code 500 and above) raised as :class:`StreamUnavailable`; any
    other as it is."""
    try:
        yield
    except _UNAVAILABLE as error:
        raise StreamUnavailable(f"{stream}: {error!r}") from error
    except nats.js.errors.APIError as error:
        if error.code is not None and error.code >= 500:
            raise StreamUnavailable(f"{stream}: {error!r}") from error
        raise


class MessageTooLarge(Exception):
    """A message over the server's ``max_payload``: refused before anything was sent."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"a message of {size} bytes on {subject} is over the bus's limit of {limit} bytes"
        )
        self.subject = subject
        self.size = size
        self.limit = limit


# The header block around the lines (``NATS/1.0`` and its line end, the closing empty
# line), what each ``Key: value`` line adds besides its key and value, and the message id's
# whole line but its value: a message that carries only its id weighs that and the id.
_HEADER_BLOCK = len(b"NATS/1.0\r\n") + len(b"\r\n")
_HEADER_LINE = len(b": ") + len(b"\r\n")
_MSG_ID_ONLY = _HEADER_BLOCK + len(MSG_ID_HEADER) + _HEADER_LINE


def header_size(headers: dict[str, str]) -> int:
    """What ``headers`` add to a message's size as the server counts it against
    ``max_payload``: the header block (``NATS/1.0``, one ``Key: value`` line per header, an
    empty line)."""
    if not headers:
        return 0
    block = _HEADER_BLOCK
    for key, value in headers.items():
        block += len(key.strip().encode()) + _HEADER_LINE + len(value.strip().encode())
    return block


class Bus:
    def __init__(self, nc: NATS, replicas: int = 1) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.replicas = replicas
        # publish_many's acks: one reply subscription, a future per message in flight.
        self._ack_prefix: str | None = None
        self._acks: dict[str, asyncio.Future[PubAck]] = {}
        self._ack_count = 0
        # Every consumer made on this connection (its backlog is read for the metrics).
        self.consumers: list[Consumer] = []

    @classmethod
    async def connect(
        cls,
        servers: list[str] | str,
        *,
        name: str = "dispo",
        credentials: BusCredentials | None = None,
        inbox: str | None = None,
        replicas: int = 1,
        connect_timeout: float = 2.0,
        max_reconnect_attempts: int = -1,
    ) -> Bus:
        """Connect as ``credentials`` (anonymous without), its replies on ``inbox`` (see
        :func:`inbox_prefix`), retrying for ever after a lost connection (reconnects are
        automatic). :class:`BusCredentialsRefused` if the server refuses the credentials."""
        credentials = credentials or BusCredentials()
        refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

        async def on_disconnect() -> None:
            log.warning("nats disconnected")

        async def on_reconnect() -> None:
            log.info("nats reconnected")

        async def on_error(error: Exception) -> None:
            if _refusal(error):
                if not refused.done():
                    refused.set_result(error)
                log.error("nats refused the credentials", who=credentials.describe())
            elif "permissions violation" in str(error).lower():
                log.error("nats refused a publish or subscribe", error=str(error))
            else:
                log.debug("nats error", error=str(error))

        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            "connect_timeout": connect_timeout,
            "reconnect_time_wait": 0.5,
            "max_reconnect_attempts": max_reconnect_attempts,
            "allow_reconnect": True,
            "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
            "error_cb": on_error,
            "inbox_prefix": inbox or "_INBOX",
            **credentials.options(),
        }
        nc = NATS()
        connecting: asyncio.Future[Any] = asyncio.ensure_future(nc.connect(**options))
        await asyncio.wait([connecting, refused], return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():  # the client would try again for ever
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            with contextlib.suppress(Exception):
                await nc.close()
            where = ", ".join([servers] if isinstance(servers, str) else servers)
            raise BusCredentialsRefused(
                f"NATS ({where}) refused {credentials.describe()}: {refused.result()}."
                " Give the process its bus user's credentials (DISPO_NATS_USER and"
                " DISPO_NATS_PASSWORD, DISPO_NATS_TOKEN, DISPO_NATS_CREDS_FILE or"
                " DISPO_NATS_NKEY_SEED_FILE); `dispo up` hands them to what it starts"
            )
        connecting.result()
        return cls(nc, replicas)

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_age: float | None = None,
        duplicate_window: float = 120.0,
        retention: RetentionPolicy = RetentionPolicy.LIMITS,
        max_bytes: int | None = None,
        discard: DiscardPolicy = DiscardPolicy.OLD,
        durables: Sequence[tuple[str, Sequence[str]]] = (),
        update: bool = True,
        patience: float = 60.0,
    ) -> None:
        """Create the stream, or bring its subjects, retention and limits to this
        configuration (``update``; a service that may not change the stream passes False and
        only adds what is missing), and create each of ``durables`` (a name and its filters)
        that does not exist yet. Durables are made before the stream's retention changes, so
        an interest stream never drops a message for want of the consumers that must see it;
        a durable that exists is left as its service configured it.

        A byte limit below what the stream holds now is not applied (the server would make
        room by deleting the oldest messages, acknowledged or not): it is logged, and the
        stream keeps its limit until it holds less.

        A cluster still placing a stream's replicas, or one whose meta leader is moving,
        leaves a JetStream request unanswered or answers 503; those are tried again until
        ``patience`` seconds have passed (every step is safe to repeat)."""
        config = StreamConfig(
            name=name,
            subjects=subjects,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=duplicate_window,
            max_age=max_age,
            retention=retention,
            max_bytes=max_bytes if max_bytes else -1,
            discard=discard,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while True:
            try:
                return await self._ensure_stream(name, config, durables, update)
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as error:
                if loop.time() >= deadline:
                    raise
                log.warning("stream not settled yet; trying again", stream=name, error=repr(error))
                await asyncio.sleep(0.5)

    async def _ensure_stream(
        self,
        name: str,
        config: StreamConfig,
        durables: Sequence[tuple[str, Sequence[str]]],
        update: bool,
    ) -> None:
        try:
            current = await self.js.stream_info(name)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                current = None
            except nats.js.errors.BadRequestError:
                current = await self.js.stream_info(name)  # a replica created it first
        for durable, filters in durables:
            await self.ensure_durable(name, durable, filters)
        if current is None:
            return
        wanted = sorted(set(current.config.subjects or []) | set(config.subjects or []))
        held = current.state.bytes or 0
        if config.max_bytes not in (None, -1) and held > config.max_bytes:
            log.error(
                "stream holds more than its byte limit would keep; limit not lowered",
                stream=name,
                held=held,
                limit=config.max_bytes,
            )
            config.max_bytes = current.config.max_bytes
        if wanted == sorted(current.config.subjects or []) and _limits(current.config) == _limits(
            config
        ):
            return
        if not update:
            log.warning(
                "stream configured otherwise; left to its publishers",
                stream=name,
                current=_limits(current.config),
                wanted=_limits(config),
            )
            if wanted == sorted(current.config.subjects or []):
                return
            config = current.config  # only the subjects are this process's to add
        config.subjects = wanted
        await self.js.update_stream(config)
        log.info("stream configuration updated", stream=name, limits=_limits(config))

    async def ensure_durable(
        self, stream: str, durable: str, filters: Sequence[str], timeout: float = 5.0
    ) -> bool:
        """Create the durable pull consumer ``durable`` of ``stream`` on ``filters`` (explicit
        acks, from the first message) unless it exists, however it is configured then (its
        service brings it to its own ack wait and limits when it starts consuming). True when
        it was created."""
        one = len(filters) == 1
        config = ConsumerConfig(
            name=durable,
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=filters[0] if one else None,
            filter_subjects=None if one else list(filters),
        )
        request = {"stream_name": stream, "config": config.as_dict(), "action": "create"}
        answer = await self.nc.request(
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
            json.dumps(request).encode(),
            timeout=timeout,
        )
        error = json.loads(answer.data).get("error")
        if error is None:
            return True
        if error.get("err_code") == CONSUMER_EXISTS:
            return False
        raise _api_error(error)

    @property
    def max_payload(self) -> int:
        """The largest message the server accepts, in bytes (payload and headers), as its
        INFO announced it (1 MiB by default)."""
        return int(self.nc.max_payload)

    @staticmethod
    def message_size(
        data: bytes | int, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> int:
        """What ``data`` (or that many bytes) published with ``msg_id`` (and ``headers``)
        weighs against :attr:`max_payload`."""
        size = data if isinstance(data, int) else len(data)
        if headers:
            return size + header_size({**headers, MSG_ID_HEADER: msg_id})
        # The message id alone (every outbox row, every envelope): no header dict to build.
        return size + _MSG_ID_ONLY + len(msg_id.strip().encode())

    def check_size(
        self, subject: str, data: bytes, *, msg_id: str, headers: dict[str, str] | None = None
    ) -> None:
        """Raise :class:`MessageTooLarge` if the message would be over :attr:`max_payload`."""
        size = self.message_size(data, msg_id=msg_id, headers=headers)
        if size > self.max_payload:
            raise MessageTooLarge(subject, size, self.max_payload)

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str,
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
    ) -> PubAck:
        """Publish once per ``msg_id`` within the stream's duplicate window
        (:class:`MessageTooLarge` if over the server's limit, and nothing sent)."""
        self.check_size(subject, data, msg_id=msg_id, headers=headers)
        return await self.js.publish(
            subject, data, timeout=timeout, headers={**(headers or {}), MSG_ID_HEADER: msg_id}
        )

    async def publish_many(
        self,
        messages: Sequence[tuple[str, bytes, str]],
        *,
        headers: Sequence[dict[str, str] | None] | None = None,
        timeout: float = 5.0,
    ) -> list[PubAck]:
        """Publish ``(subject, data, msg_id)`` messages at once and wait for every ack:
        one pipelined write, the acks gathered on one reply subscription (rather than a
        request each). ``headers``, where given, are each message's own (a trace context),
        in the same order. Raises the first refusal (the server's APIError for that message,
        NoStreamResponseError), or TimeoutError if any is not answered within ``timeout``;
        raises
        :class:`MessageTooLarge` for the first message over the server's limit before
        sending any."""
        limit = self.max_payload
        extra: Sequence[dict[str, str] | None] = headers or [None] * len(messages)
        for (subject, data, msg_id), more in zip(messages, extra, strict=True):
            size = self.message_size(data, msg_id=msg_id, headers=more)
            if size > limit:
                raise MessageTooLarge(subject, size, limit)
        prefix = await self._ack_inbox()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[PubAck]] = []
        replies: list[str] = []
        try:
            for (subject, data, msg_id), more in zip(messages, extra, strict=True):
                self._ack_count += 1
                reply = f"{prefix}.{self._ack_count}"
                future: asyncio.Future[PubAck] = loop.create_future()
                self._acks[reply] = future
                futures.append(future)
                replies.append(reply)
                sent = {**more, MSG_ID_HEADER: msg_id} if more else {MSG_ID_HEADER: msg_id}
                await self.nc.publish(subject, data, reply=reply, headers=sent)
            return list(await asyncio.wait_for(asyncio.gather(*futures), timeout))
        finally:
            for future in futures:
                future.cancel()  # no-op once done
            for reply in replies:  # answered ones are gone already; late answers are dropped
                self._acks.pop(reply, None)

    async def _ack_inbox(self) -> str:
        """The prefix of publish_many's reply subjects, subscribed once (kept across
        reconnects by the client)."""
        if self._ack_prefix is None:
            prefix = self.nc.new_inbox()
            await self.nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._ack_prefix = prefix
        return self._ack_prefix

    async def _on_ack(self, msg: Msg) -> None:
        """A stream's answer to one message of publish_many: its ack, or its refusal as the
        APIError it names (the server's own words: a stream's size limit, a bad request),
        or no stream for the subject."""
        future = self._acks.pop(msg.subject, None)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                future.set_exception(_api_error(answer["error"]))
            else:
                future.set_result(PubAck.from_response(answer))
        except Exception as error:  # an answer that is not one
            future.set_exception(error)

    async def purge_subject(self, stream: str, subject: str) -> None:
        """Delete every message ``stream`` holds on ``subject`` (a subject or a filter).
        Raises :class:`StreamUnavailable` if JetStream cannot do it now (worth another try)."""
        with _unavailable_as(stream):
            await self.js.purge_stream(stream, subject=subject)

    async def read_subject(
        self,
        stream: str,
        subject: str,
        *,
        start_sequence: int = 1,
        limit: int,
        timeout: float = 5.0,
    ) -> list[StoredMessage]:
        """The messages ``stream`` holds on ``subject`` (a subject or a filter), in stream
        order from ``start_sequence`` (inclusive), at most ``limit``; nothing is acknowledged
        and nothing stays behind. One ephemeral consumer is created for the read (filtered by
        the server, in memory, no acks) and deleted after it; should this process die in the
        middle, the server drops it once idle for a few seconds. Raises TimeoutError if the
        server has not delivered them within ``timeout``, :class:`StreamUnavailable` if
        JetStream cannot serve the read now (both worth another try)."""
        config = ConsumerConfig(
            name=f"read-{uuid.uuid4().hex}",
            filter_subject=subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, start_sequence),
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(timeout, 5.0),
        )
        with _unavailable_as(stream):
            return await self._read_with(stream, config, limit, timeout)

    async def _read_with(
        self, stream: str, config: ConsumerConfig, limit: int, timeout: float
    ) -> list[StoredMessage]:
        async with asyncio.timeout(timeout):
            info = await self.js.add_consumer(stream, config=config)
            name = info.name
            try:
                wanted = min(limit, info.num_pending or 0)
                out: list[StoredMessage] = []
                if wanted:
                    sub = await self.js.pull_subscribe_bind(consumer=name, stream=stream)
                    try:
                        while len(out) < wanted:
                            for message in await sub.fetch(wanted - len(out), timeout=timeout):
                                out.append(StoredMessage.of(message))
                    finally:
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()
                return out
            finally:
                with contextlib.suppress(Exception):
                    await self.js.delete_consumer(stream, name)

    def consumer(
        self,
        stream: str,
        *,
        durable: str,
        subject: str | Sequence[str],
        handler: Handler,
        batch: int = 64,
        ack_wait: float = 30.0,
        max_deliver: int = -1,
        error_delay: float = 1.0,
        max_ack_pending: int | None = None,
        gather: float = 0.0,
    ) -> Consumer:
        consumer = Consumer(
            self,
            stream,
            durable,
            subject,
            handler,
            batch,
            ack_wait,
            max_deliver,
            error_delay,
            max_ack_pending,
            gather,
        )
        self.consumers.append(consumer)
        return consumer

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()


@dataclass(frozen=True)
class StoredMessage:
    """One message as a stream stored it (:meth:`Bus.read_subject`)."""

    sequence: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: datetime

    @property
    def msg_id(self) -> str:
        """The id it was published with (empty without one)."""
        return self.headers.get(MSG_ID_HEADER, "")

    @classmethod
    def of(cls, message: Msg) -> StoredMessage:
        meta = message.metadata
        return cls(
            meta.sequence.stream,
            message.subject,
            message.data,
            dict(message.headers or {}),
            meta.timestamp,
        )


class ConsumerBacklog(NamedTuple):
    """A durable consumer's messages not delivered yet, delivered and not acknowledged, and
    in hand after more than one delivery."""

    pending: int
    ack_pending: int
    redelivered: int


class Consumer:
    """A durable pull consumer handling up to ``batch`` messages concurrently. It fetches
    again once a quarter of its slots are free (for as many as there are free slots), so
    one slow message does not hold back the messages behind it, and a busy consumer pulls
    in batches rather than one message per pull.

    A busy consumer (its last pull brought as many messages as it asked for) takes what the
    stream holds with one request that does not wait (:class:`_GatheredPull`), reading the
    answer off the subscription's queue: nats-py's ``fetch`` makes an asyncio task, a
    ``wait_for`` and a random name for every message it reads.

    While it keeps up (its last pull brought fewer messages than it asked for), it leaves
    one pull request standing on the server instead (:class:`_StandingPull`): each message
    is then delivered as it is stored, with no request and no "no messages" answer of its
    own, which at a steady rate were two of the few NATS messages a task costs.

    With ``gather`` seconds (a consumer off the caller's path), a consumer that keeps up
    leaves no request standing: after a pull that brought fewer messages than it asked for,
    it waits that long and then takes what the stream stored meanwhile with one request
    (:class:`_GatheredPull`), so at a steady rate the process wakes once per ``gather``
    rather than once per message, and acknowledges the messages of a pull together. A
    message that comes to an idle consumer is taken at once; the wait only gathers the ones
    behind it.

    One keepalive loop per consumer extends the ack deadline of every message in hand for
    longer than a third of ``ack_wait`` (a message handled sooner costs nothing)."""

    def __init__(
        self,
        bus: Bus,
        stream: str,
        durable: str,
        subject: str | Sequence[str],
        handler: Handler,
        batch: int,
        ack_wait: float,
        max_deliver: int,
        error_delay: float,
        max_ack_pending: int | None = None,
        gather: float = 0.0,
    ) -> None:
        if batch < 1 or ack_wait <= 0 or gather < 0:
            raise ValueError("need batch >= 1, ack_wait > 0 and gather >= 0")
        self.bus = bus
        self.stream = stream
        self.durable = durable
        self.subjects = (subject,) if isinstance(subject, str) else tuple(subject)
        if not self.subjects:
            raise ValueError("a consumer needs a subject")
        self.handler = handler
        self.batch = batch
        self.refill = max(1, batch // 4)
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.error_delay = error_delay
        self.max_ack_pending = max_ack_pending
        self.gather = gather
        self._stopping = asyncio.Event()
        # Messages in hand: id(message) -> (message, loop time it was taken or last extended).
        self._in_hand: dict[int, tuple[Msg, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()

    @property
    def in_hand(self) -> int:
        return len(self._in_hand)

    async def backlog(self) -> ConsumerBacklog:
        """The durable's counts on the server (one JetStream API call)."""
        info = await self.bus.js.consumer_info(self.stream, self.durable)
        return ConsumerBacklog(
            info.num_pending or 0, info.num_ack_pending or 0, info.num_redelivered or 0
        )

    def stop(self) -> None:
        """Finish the messages in hand, then return from :meth:`run`."""
        self._stopping.set()
        self._slot_freed.set()

    async def run(self) -> None:
        one = len(self.subjects) == 1
        config = ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_ack_pending,
            filter_subject=self.subjects[0] if one else None,
            filter_subjects=None if one else list(self.subjects),
        )
        keepalive = asyncio.create_task(self._keep_alive(), name=f"{self.durable} keepalive")
        try:
            await self._consume(config)
        except asyncio.CancelledError:  # cancelled rather than stopped: so are the messages in hand
            for handling in self._tasks:
                handling.cancel()
            raise
        finally:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive

    async def _consume(self, config: ConsumerConfig) -> None:
        standing: _StandingPull | None = None  # its subscription, bound to the durable
        short = False  # the last pull brought fewer messages than it asked for
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            free = self.batch - len(self._tasks)
            if free < self.refill:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                if standing is None:
                    standing = _StandingPull(await self._subscribe(config))
                if short and not self.gather:
                    messages = await standing.take(free, PULL_EXPIRES)
                else:  # busy, or gathering after its wait: what the stream holds now
                    messages = await standing.take_stored(free, PULL_EXPIRES)
                short = len(messages) < free
            except TimeoutError:
                short = True
                continue
            except Exception as error:  # NATS down or restarting: wait and try again
                log.warning("fetch failed", durable=self.durable, error=repr(error))
                standing, short = None, False
                await self._pause(0.5)
                continue
            now = loop.time()
            for message in messages:
                self._in_hand[id(message)] = (message, now)
                handling = loop.create_task(self._handle(message))
                self._tasks.add(handling)
                handling.add_done_callback(self._done)
            if short and self.gather:
                await self._pause(self.gather)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if standing is not None:
            with contextlib.suppress(Exception):
                await standing.subscription.unsubscribe()

    def _done(self, handling: asyncio.Task[None]) -> None:
        self._tasks.discard(handling)
        self._slot_freed.set()

    async def _subscribe(self, config: ConsumerConfig) -> JetStreamContext.PullSubscription:
        """Bind to the durable, creating it or updating its configuration first if needed."""
        js = self.bus.js
        try:
            current: ConsumerConfig | None = (
                await js.consumer_info(self.stream, self.durable)
            ).config
        except NotFoundError:
            current = None
        if current is None or _settings(current, config) != _settings(config, config):
            try:
                await js.add_consumer(self.stream, config=config)  # creates or updates
            except nats.js.errors.BadRequestError:
                if current is not None:
                    raise
                # a replica created it first, with this configuration
        return await js.pull_subscribe_bind(durable=self.durable, stream=self.stream)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _handle(self, message: Msg) -> None:
        try:
            with continued(message.headers, message.subject):
                outcome: Disposition = await self.handler(message)
        except Exception:
            log.exception("handler failed", subject=message.subject, durable=self.durable)
            outcome = Nak(self.error_delay)
        finally:
            del self._in_hand[id(message)]
        try:
            match outcome:
                case Ack():
                    await message.ack()
                case Nak(delay=delay):
                    await message.nak(delay=delay)
                case Term(reason=reason):
                    log.warning("message terminated", subject=message.subject, reason=reason)
                    await message.term()
        except Exception as error:  # the message will be redelivered after ack_wait
            log.warning("ack failed", subject=message.subject, error=repr(error))

    async def _keep_alive(self) -> None:
        """Every third of ``ack_wait``: extend the messages in hand for that long already."""
        period = self.ack_wait / 3
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period / 2)
            now = loop.time()
            due = [m for m, since in self._in_hand.values() if now - since >= period]
            for message in due:
                key = id(message)
                if key in self._in_hand:
                    self._in_hand[key] = (message, now)
                with contextlib.suppress(Exception):
                    await message.in_progress()


# How long one pull request waits on the server for messages (then it is asked again).
PULL_EXPIRES = 1.0


class _StandingPull:
    """One pull request left standing on the server for a bound pull subscription, asked
    for again once it expired or was filled: messages come as they are stored, each with
    no request of its own. nats-py (pinned) has no such call, so this sends the request
    and reads the subscription's queue as its ``fetch`` does. Messages that earlier
    ``fetch`` requests left coming are taken too; an answer ending a request (expired,
    filled, interrupted) asks for a new one."""

    def __init__(self, subscription: JetStreamContext.PullSubscription) -> None:
        self.subscription = subscription
        self.wanted = 0  # messages the standing request may still bring
        self.until = 0.0  # loop time it expires at
        self._stored = _GatheredPull(subscription)

    async def take_stored(self, free: int, expires: float) -> list[Msg]:
        """What the stream holds now (:class:`_GatheredPull`). It may take what the
        standing request brought too, so the next :meth:`take` asks for a new one."""
        messages = await self._stored.take(free, expires)
        self.wanted = 0
        return messages

    async def take(self, free: int, expires: float) -> list[Msg]:
        """The messages waiting, or else the next one to come within ``expires`` seconds
        (then any that came with it); raises ``TimeoutError`` when none came."""
        messages = self._waiting()
        if messages:
            self.wanted -= len(messages)
            return messages
        loop = asyncio.get_running_loop()
        if self.wanted <= 0 or loop.time() >= self.until - 0.05:
            sub: Any = self.subscription
            request = {"batch": free, "expires": int(expires * 1e9)}
            await sub._nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
            self.wanted, self.until = free, loop.time() + expires
        first = await self.subscription._sub.next_msg(timeout=max(0.01, self.until - loop.time()))
        if JetStreamContext.is_status_msg(first):
            self.wanted = 0  # an answer that ends a request (or a heartbeat): ask again
            return []
        messages = [first, *self._waiting()]
        self.wanted -= len(messages)
        return messages

    def _waiting(self) -> list[Msg]:
        """The messages already in the subscription's queue (status answers dropped: they
        end requests that were asked for again since)."""
        sub: Any = self.subscription._sub
        queue = sub._pending_queue
        messages = []
        while not queue.empty():
            message = queue.get_nowait()
            queue.task_done()
            sub._pending_size -= len(message.data)
            if not JetStreamContext.is_status_msg(message):
                messages.append(message)
        return messages


class _GatheredPull:
    """The pulls of a busy consumer, and of a gathering one (:attr:`Consumer.gather`) after
    its wait: what the stream holds now, by one request that does not wait (``no_wait``);
    if it holds nothing, the next message alone, by one request for a single message that
    waits up to ``expires``. No request stays open after either, so the server sends nothing
    until the next pull."""

    def __init__(self, subscription: JetStreamContext.PullSubscription) -> None:
        self.subscription = subscription

    async def take(self, free: int, expires: float) -> list[Msg]:
        """Up to ``free`` stored messages, or else the next one within ``expires`` seconds;
        raises ``TimeoutError`` when none came."""
        messages = await self._request({"batch": free, "no_wait": True}, free, expires)
        if messages:
            return messages
        return await self._request(
            {"batch": 1, "expires": int(expires * 1e9)}, 1, expires, quiet=False
        )

    async def _request(
        self, request: dict[str, Any], wanted: int, expires: float, quiet: bool = True
    ) -> list[Msg]:
        """Send one pull request and read its answer: up to ``wanted`` messages, ended early
        by a status (no messages, expired). No message within ``expires``: none if
        ``quiet``, else ``TimeoutError``."""
        sub: Any = self.subscription
        await sub._nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
        queue = sub._sub._pending_queue
        messages: list[Msg] = []
        loop = asyncio.get_running_loop()
        until = loop.time() + expires
        while len(messages) < wanted:
            if queue.empty():  # wait for the next (one task per wait: not once a message)
                try:
                    message = await sub._sub.next_msg(timeout=max(0.01, until - loop.time()))
                except TimeoutError:
                    if messages or quiet:
                        break
                    raise
            else:
                message = queue.get_nowait()
                queue.task_done()
                sub._sub._pending_size -= len(message.data)
            if JetStreamContext.is_status_msg(message):
                break
            messages.append(message)
        return messages


def _api_error(error: dict[str, Any]) -> APIError:
    """The APIError of a JetStream error answer (nats-py raises it rather than return it)."""
    try:
        APIError.from_error(error)
    except APIError as raised:
        return raised
    return APIError(**error)  # pragma: no cover - from_error always raises


def _limits(config: StreamConfig) -> tuple[str, str, float, int]:
    """What :meth:`Bus.ensure_stream` keeps a stream to besides its subjects: retention,
    discard policy, age limit (0: none) and byte limit (-1: none)."""
    retention = config.retention or RetentionPolicy.LIMITS
    discard = config.discard or DiscardPolicy.OLD
    return (
        str(getattr(retention, "value", retention)),
        str(getattr(discard, "value", discard)),
        round(config.max_age or 0.0, 3),
        config.max_bytes if config.max_bytes not in (None, 0) else -1,
    )


def _settings(
    config: ConsumerConfig, wanted: ConsumerConfig
) -> tuple[tuple[str, ...], float, int, int | None]:
    """What :class:`Consumer` configures on a durable: filters, ack wait, max deliveries, and
    the most messages in flight when it asks for a number (else the server's default)."""
    filters = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    pending = config.max_ack_pending if wanted.max_ack_pending is not None else None
    return (
        tuple(sorted(filters)),
        round(config.ack_wait or 0.0, 3),
        config.max_deliver or -1,
        pending,
    )

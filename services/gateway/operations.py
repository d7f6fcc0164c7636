"""The gateway's use cases: accept (validate, expand, record + outbox), read, cancel, watch,
and apply the executor's status events to the task view."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dispo.auth import store as auth_store
from dispo.gateway import store
from dispo.gateway.convert import stored_status, task_envelope
from dispo.gateway.expand import DEFAULT_EGRESS, Limits, Submission, expand, validate
from dispo.gateway.labels import task_labels
from dispo.gateway.seals import NoSeals, Seals
from dispo.gateway.timing import DEFAULT_MAX_DELAY_SECONDS, timing
from dispo.libs import erasure as erasure_lib
from dispo.libs import metrics
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.batcher import Batcher
from dispo.libs.catalogue import DEFAULT_MAX_OUTPUT_BYTES, Catalogue
from dispo.libs.clock import Clock
from dispo.libs.contracts import tasks
from dispo.libs.contracts.tasks import DEFAULT_PRIORITY
from dispo.libs.db.driver import Database
from dispo.libs.egress import NATS_SCHEME, AllowList
from dispo.libs.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from dispo.libs.grpcserver import MAX_MESSAGE_BYTES
from dispo.libs.logging import bind_ids, get_logger
from dispo.libs.outbox import OutboxRelay, OutboxRow, outbox_add_many
from dispo.libs.payload import canonical_json, fields_problem, json_payload
from dispo.libs.timestamps import set_timestamp
from dispo.libs.tracing import current

log = get_logger(__name__)


def _string_list(values: list[str]) -> bytes:
    """``canonical_json(values)`` for a list of strings, from each string's own encoding
    (a list through the encoder costs several times its strings)."""
    return b"[%s]" % b",".join(canonical_json(v) for v in values)


def request_hash(sub: Submission) -> str:
    """SHA-256 of the request as canonical JSON: the bytes of ``canonical_json(asdict(sub))``,
    on which stored hashes depend, written out from each cell's canonical body rather than by
    copying every payload (``asdict`` deep-copies; it was most of a Submit's own work)."""
    cells = b",".join(
        b'{"cell":%s,"depends_on":%s,"payload":%s,"ref":%s}'
        % (canonical_json(c.cell), _string_list(c.depends_on), c.body, canonical_json(c.ref))
        for c in sub.cells
    )
    # A delayed start and a deadline are part of the request only when asked: the hashes
    # of requests without them stay what they were.
    deadline = b',"deadline":%s' % _instant(sub.deadline) if sub.deadline else b""
    not_before = b',"not_before":%s' % _instant(sub.not_before) if sub.not_before else b""
    # Labels likewise (ADR-0110); a cell's label fields are in its payload already.
    labels = b',"labels":%s' % canonical_json(sub.labels) if sub.labels else b""
    # So is a priority other than the default (ADR-0109).
    priority = b',"priority":%d' % sub.priority if sub.priority != DEFAULT_PRIORITY else b""
    document = b'{"business":%s,"callback_url":%s,"cells":[%s]%s,"idempotency_key":%s%s%s%s}' % (
        canonical_json(sub.business),
        canonical_json(sub.callback_url),
        cells,
        deadline,
        canonical_json(sub.idempotency_key),
        labels,
        not_before,
        priority,
    )
    return hashlib.sha256(document).hexdigest()


def _instant(moment: datetime) -> bytes:
    """An instant as request_hash writes it: ISO 8601 in UTC, as a JSON string."""
    return canonical_json(moment.astimezone(UTC).isoformat())


def cancelled_view(view: task_pb2.Task, now: datetime) -> task_pb2.Task:
    out = task_pb2.Task()
    out.CopyFrom(view)
    out.status = common_pb2.TASK_STATUS_CANCELLED
    out.cancel_requested = True
    out.status_reason = "cancelled before publication"
    set_timestamp(out.updated_at, now)
    for node in out.nodes:
        node.status = common_pb2.NODE_STATUS_CANCELLED
        set_timestamp(node.finished_at, now)
    return out


def check_signal(view: task_pb2.Task, signal: str, payload: Any, body: bytes) -> None:
    """A signal the task's wait actions declare, with a payload each of them can record as
    its output (within its ``max_output_bytes``, as its output fields declare)."""
    specs = [n.spec for n in view.nodes if n.spec.kind == "wait" and n.spec.signal == signal]
    if not specs:
        declared = sorted({n.spec.signal for n in view.nodes if n.spec.kind == "wait"})
        raise InvalidArgument(
            "signal",
            f"no wait node of task {view.task_id} waits for {signal!r}"
            + (f" (declared: {', '.join(declared)})" if declared else " (it has no wait node)"),
        )
    for spec in specs:
        limit = spec.max_output_bytes or DEFAULT_MAX_OUTPUT_BYTES
        if len(body) > limit:
            raise InvalidArgument(
                "payload", f"{len(body)} bytes is over the wait's limit of {limit} bytes"
            )
        fields = [(f.name, f.type, f.required) for f in spec.output_fields]
        if (problem := fields_problem(payload, fields)) is not None:
            raise InvalidArgument("payload", f"not as the wait declares: {problem}")


@dataclass(frozen=True)
class Accepted:
    task_id: str
    status: str
    duplicate: bool


class Gateway:
    def __init__(
        self,
        db: Database,
        relay: OutboxRelay,
        catalogue: Catalogue,
        limits: Limits,
        clock: Clock,
        watch_poll_interval: float,
        *,
        submit_batch: int = 500,
        submit_flushes: int = 1,
        submit_linger: float = 0.0,
        status_batch: int = 1000,
        status_linger: float = 0.0,
        egress: AllowList = DEFAULT_EGRESS,
        max_delay_seconds: int = DEFAULT_MAX_DELAY_SECONDS,
        seals: Seals | None = None,
    ) -> None:
        self.db = db  # the driver port: every other statement
        self.relay = relay
        self.catalogue = catalogue
        # The version ``catalogue`` is and the cells retired by then (ADR-0111): set by the
        # catalogue book whenever a newer version is loaded.
        self.catalogue_version = 0
        self.retired: frozenset[str] = frozenset()
        self.limits = limits
        self.egress = egress  # where a callback_url may point
        # How far ahead a delayed start or a deadline may be (ADR-0103).
        self.max_delay_seconds = max_delay_seconds
        self.clock = clock
        self.watch_poll_interval = watch_poll_interval
        # Where a FAILED task is sealed against a resume before its erasure (ADR-0114).
        self.seals: Seals = seals or NoSeals()
        self._changed: dict[str, asyncio.Event] = {}
        # Businesses seen with a signing secret: a current secret is never removed, so a
        # business found once needs no second read.
        self._signed: set[str] = set()
        # Group commit of accepted tasks (ADR 0022): one transaction per flush.
        self.submits: Batcher[store.NewTask, Accepted] = Batcher(
            "submits",
            self._accept_all,
            max_items=submit_batch,
            concurrency=submit_flushes,
            linger=submit_linger,
            max_pending=max(10_000, submit_batch),
            observe=metrics.group_commit_flushes("submits"),
        )
        # Status events: one statement per flush for all of them.
        self.statuses: Batcher[store.Snapshot, bool] = Batcher(
            "statuses",
            self._apply_all,
            max_items=status_batch,
            linger=status_linger,
            max_pending=max(10_000, status_batch),
            isolate=True,  # a status event that cannot be applied fails alone
            observe=metrics.group_commit_flushes("statuses"),
        )

    async def submit(self, sub: Submission, new: store.NewTask | None = None) -> Accepted:
        """Validate and expand here (unless ``new`` is ``sub`` :meth:`prepare`d already);
        record the task (or find the one holding its idempotency key) in the next flush;
        answer once that flush committed."""
        if new is None:
            new = await self.prepare(sub)
        accepted = await self.submits.submit(new)
        # The task the call answers with: a repeated key's is the one recorded first.
        bind_ids(task_id=accepted.task_id, business=sub.business)
        self._accepted(sub, new, accepted)
        return accepted

    async def submit_all(
        self, subs: Sequence[Submission], news: Sequence[store.NewTask]
    ) -> list[Accepted | BaseException]:
        """Record ``news`` (each :meth:`prepare` of the submission at its place) through the
        same flushes as Submits, together; answer once all are committed, each with its
        acceptance or the error it alone failed with (a key used with another request)."""
        answers = await self.submits.submit_all(news)
        for sub, new, accepted in zip(subs, news, answers, strict=True):
            if isinstance(accepted, Accepted):
                self._accepted(sub, new, accepted)
        return answers

    async def prepare(self, sub: Submission) -> store.NewTask:
        """The task ``sub`` asks for, validated and expanded, ready to record: bad input
        raises here, before anything is written."""
        # One version for the whole task, whatever a refresh loads meanwhile (ADR-0111).
        catalogue, version = self.catalogue, self.catalogue_version
        self._refuse_retired(sub)
        validate(sub, catalogue, self.limits, self.egress)
        labels = task_labels(sub.labels, [(c.cell, c.payload) for c in sub.cells], catalogue)
        await self._require_signing_secret(sub)
        now = self.clock.now()
        when = timing(
            sub.not_before,
            sub.deadline,
            [c.cell for c in sub.cells],
            catalogue,
            now,
            self.max_delay_seconds,
        )
        task_id = uuid.uuid4().hex
        nodes = expand(task_id, sub, catalogue, self.limits)
        env = task_envelope(task_id, sub, nodes, now, when)
        env.catalogue_version = version
        view = env.SerializeToString()  # encoded once: stored, published, and measured
        self._check_envelope_size(task_id, len(view), [n.node_id for n in nodes])
        return store.NewTask(
            task_id=task_id,
            business=sub.business,
            idempotency_key=sub.idempotency_key,
            request_hash=request_hash(sub),
            node_count=len(nodes),
            view=view,
            callback_url=sub.callback_url,
            created_at=now,
            trace=current(),
            not_before=when.not_before,
            deadline=when.deadline,
            labels=canonical_json(labels).decode() if labels else None,
            priority=sub.priority,
        )

    def use_catalogue(self, catalogue: Catalogue, version: int, retired: Iterable[str]) -> None:
        """Accept new submissions under ``catalogue`` (version ``version``) from now on."""
        self.catalogue, self.catalogue_version = catalogue, version
        self.retired = frozenset(retired)

    def _refuse_retired(self, sub: Submission) -> None:
        """INVALID_ARGUMENT naming each cell of ``sub`` the catalogue has retired."""
        bad = [
            FieldViolation(
                f"cells[{i}].cell",
                f"cell {req.cell!r} is retired (catalogue version {self.catalogue_version})",
            )
            for i, req in enumerate(sub.cells)
            if req.cell in self.retired
        ]
        if bad:
            raise InvalidArgument(violations=bad)

    @staticmethod
    def _accepted(sub: Submission, new: store.NewTask, accepted: Accepted) -> None:
        if not accepted.duplicate:
            metrics.task_accepted(sub.business, (c.cell for c in sub.cells))
            log.info(
                "task accepted",
                task_id=new.task_id,
                business=sub.business,
                nodes=new.node_count,
            )

    async def _require_signing_secret(self, sub: Submission) -> None:
        """A webhook callback is signed with the business's signing secret, so a business
        without one cannot ask for one (FAILED_PRECONDITION naming ``callback_url``; nothing is
        written). A ``nats:`` callback needs none: the bus's permissions say who published."""
        if not sub.callback_url or sub.callback_url.startswith(NATS_SCHEME):
            return
        if sub.business in self._signed:
            return
        async with self.db.connection() as conn:
            found = await auth_store.signing_secret_exists(conn, sub.business)
        if not found:
            why = (
                f"business {sub.business!r} has no webhook signing secret to sign the callback"
                f" with; make one with `dispo tokens rotate-secret --business {sub.business}`"
                " (a business's first token makes it too), or use a nats: callback"
            )
            raise FailedPrecondition(f"callback_url: {why}", [FieldViolation("callback_url", why)])
        if len(self._signed) >= 100_000:
            self._signed.clear()
        self._signed.add(sub.business)

    def _check_envelope_size(self, task_id: str, size: int, node_ids: list[str]) -> None:
        """Refuse a task whose envelope (``size`` bytes as accepted) could not travel on the
        bus: as accepted, or as large as it can grow while it runs
        (:func:`tasks.largest_envelope_size`), it must fit the server's message size. Checked
        before anything is written, so that no task is accepted that could never reach the
        executor or come back from it."""
        bus = self.relay.bus
        # Carried by the bus, and small enough for GetTask to answer with (docs/security.md).
        limit = min(bus.max_payload, MAX_MESSAGE_BYTES)
        largest = bus.message_size(
            tasks.largest_envelope_size(size, node_ids),
            msg_id=tasks.longest_envelope_id(task_id),
        )
        if largest > limit:
            size = bus.message_size(size, msg_id=tasks.create_id(task_id, 0))
            raise ResourceExhausted(
                f"the task's envelope is {size} bytes and can grow to {largest} bytes while it"
                f" runs; the bus carries at most {limit} bytes per message",
                field="cells",
            )

    async def _accept_all(self, items: list[store.NewTask]) -> list[Accepted | BaseException]:
        """One flush of Submits: every task whose key is free inserted with its task.create
        row by one statement that commits alone, then the holders of the taken keys (if any)
        read with another. Duplicates within the flush are answered exactly as across
        flushes: the first Submit of a key in the flush is the one inserted."""
        first: dict[tuple[str, str], store.NewTask] = {}
        fresh: list[store.NewTask] = []
        for t in items:
            if t.idempotency_key:
                if (t.business, t.idempotency_key) in first:
                    continue
                first[(t.business, t.idempotency_key)] = t
            fresh.append(t)
        # In key order: two flushes inserting the same keys wait for each other in the same
        # order, never in a cycle.
        fresh.sort(key=lambda t: (t.business, t.idempotency_key))
        staged = self.relay.staged()
        # One statement, its own transaction: no BEGIN and COMMIT round trips around it.
        async with self.db.connection() as conn:
            inserted = await store.tasks_accept_many(conn, fresh, staged)
            self.relay.publish_committed(staged)
            # The keys found taken: their holders are committed (the insert waited for any
            # transaction holding one), so a read after it finds them.
            taken = [key for key, t in first.items() if t.task_id not in inserted]
            holders = await store.tasks_by_keys(conn, taken)
        answers: list[Accepted | BaseException] = []
        for t in items:
            if t.task_id in inserted:
                answers.append(Accepted(t.task_id, "accepted", False))
                continue
            key = (t.business, t.idempotency_key)
            winner = first[key]
            if winner.task_id in inserted:  # an earlier Submit of this flush took the key
                holder = store.KeyHolder(winner.task_id, winner.request_hash, "accepted")
            elif key in holders:
                holder = holders[key]
            else:  # pragma: no cover - a key holder is never deleted
                answers.append(RuntimeError(f"idempotency key of business {t.business!r} lost"))
                continue
            answers.append(self._same(holder, t.request_hash))
        return answers

    @staticmethod
    def _same(existing: store.KeyHolder, digest: str) -> Accepted | FailedPrecondition:
        if existing.request_hash != digest:
            why = f"already used for task {existing.task_id} with a different request"
            return FailedPrecondition(
                f"idempotency key {why}", [FieldViolation("idempotency_key", why)]
            )
        return Accepted(existing.task_id, existing.status, True)

    async def holder(self, business: str, idempotency_key: str) -> str | None:
        """The id of the business's task submitted under ``idempotency_key`` (None: none)."""
        async with self.db.connection() as conn:
            found = await store.tasks_by_keys(conn, [(business, idempotency_key)])
        holder = found.get((business, idempotency_key))
        return holder.task_id if holder is not None else None

    async def get(self, task_id: str) -> task_pb2.Task:
        return self.view_of(await self.get_record(task_id))

    async def get_record(self, task_id: str) -> store.TaskRecord:
        async with self.db.connection() as conn:
            record = await store.task_get(conn, task_id)
        if record is None:
            raise NotFound(f"no task {task_id!r}")
        return record

    @staticmethod
    def view_of(record: store.TaskRecord) -> task_pb2.Task:
        view = task_pb2.Task()
        view.CopyFrom(record.view)
        view.cancel_requested = view.cancel_requested or record.cancel_requested
        return view

    async def list(self, matching: store.TaskFilter, **page: Any) -> list[store.TaskSummary]:
        async with self.db.connection() as conn:
            return await store.task_list(conn, matching, **page)

    async def counts(self, matching: store.TaskFilter) -> dict[str, int]:
        """How many matching tasks each status holds (stored names; absent: none)."""
        async with self.db.connection() as conn:
            return await store.task_counts(conn, matching)

    async def cancel(self, task_id: str) -> task_pb2.Task:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            record = await store.task_get(conn, task_id)
            if record is None:
                raise NotFound(f"no task {task_id!r}")
            if record.status in store.TERMINAL:
                raise FailedPrecondition(f"task {task_id} is already {record.status.upper()}")
            await self.cancel_in(conn, [task_id], now)
            record = await store.task_get(conn, task_id)
        self.relay.kick()
        assert record is not None
        log.info("task cancel requested", task_id=task_id)
        return self.view_of(record)

    async def cancel_in(self, conn: Any, task_ids: Sequence[str], now: datetime) -> set[str]:
        """Cancel the unfinished tasks ``task_ids`` in the caller's transaction: CancelTask's
        path for one task, a bulk cancel's for a batch (ADR-0112). Returns the ids whose
        cancel this asked for (not those asked already); the caller kicks the relay after
        commit."""
        for task_id in task_ids:
            if await store.outbox_withdraw_create(conn, tasks.create_id(task_id, 0)):
                # Provably never published, and now never will be (ADR-0090): no executor
                # has seen it, so it is cancelled here, completely. Otherwise the relay may
                # have published it: the task.cancel below reaches whichever executor has it.
                record = await store.task_get(conn, task_id)
                assert record is not None
                await store.task_set_view(
                    conn, task_id, cancelled_view(record.view, now), "cancelled", now
                )
        asked = await store.tasks_request_cancel_if_unrequested_many(conn, list(task_ids), now)
        rows = []
        for task_id in task_ids:
            if task_id in asked:
                request = task_pb2.CancelRequest(task_id=task_id)
                set_timestamp(request.requested_at, now)
                rows.append(
                    OutboxRow(
                        tasks.TASK_CANCEL,
                        tasks.cancel_id(task_id),
                        request.SerializeToString(),
                        now,
                    )
                )
        await outbox_add_many(conn, store.outbox, rows)
        return asked

    async def erase(self, task_id: str, erased_by: str) -> store.TaskRecord:
        """Replace a finished task's user data with tombstones here and emit its task.erase,
        which the executor and the reconciler apply to their own rows (ADR-0113). A task
        erased before is answered as it is; FAILED_PRECONDITION naming the status of a task
        that has not finished. A FAILED task is first sealed by the reconciler against a
        resume (ADR-0114), with its row locked here: FAILED_PRECONDITION naming ``task_id``
        while it is being resumed, UNAVAILABLE when the reconciler does not answer; either
        way nothing is written."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            record = await store.task_get_for_erase(conn, task_id)
            if record is None:
                raise NotFound(f"no task {task_id!r}")
            if record.erased_at is not None:
                return record
            if record.status not in store.TERMINAL:
                raise FailedPrecondition(
                    f"task {task_id} is {record.status.upper()}: only a finished task"
                    " (SUCCEEDED, CANCELLED or FAILED) can be erased"
                )
            if record.status == "failed":  # the one the reconciler may run again
                await self.seals.seal(task_id, erased_by)
            row = await store.task_row_bytes(conn, task_id)
            erasure = store.Erasure(
                task_id,
                erasure_lib.erase_task_bytes(row[0]) or b"",
                erasure_lib.erase_task_bytes(row[1]),
                erased_by,
            )
            await store.tasks_erase_if_finished_many(conn, [erasure], erasure_lib.TOMBSTONE, now)
            request = task_pb2.EraseRequest(task_id=task_id, erased_by=erased_by)
            set_timestamp(request.erased_at, now)
            await store.emit(
                conn, tasks.TASK_ERASE, tasks.erase_id(task_id), request.SerializeToString(), now
            )
            record = await store.task_get(conn, task_id)
        self.relay.kick()
        assert record is not None
        log.info("task erased", task_id=task_id, erased_by=erased_by)
        return record

    async def signal(
        self, task_id: str, signal: str, payload: Any, signal_id: str
    ) -> tuple[str, bool]:
        """Record a signal to the task's wait nodes with its task.signal (ADR-0102); answers
        its id and whether it was recorded before. INVALID_ARGUMENT naming ``signal`` when no
        wait action of the task declares it, naming ``payload`` when the payload is not as
        such an action declares its output; FAILED_PRECONDITION once the task has ended."""
        now = self.clock.now()
        signal_id = signal_id or uuid.uuid4().hex
        body = canonical_json(payload)
        async with self.db.transaction() as conn:
            record = await store.task_get(conn, task_id)
            if record is None:
                raise NotFound(f"no task {task_id!r}")
            check_signal(record.view, signal, payload, body)
            if record.status in store.TERMINAL:
                if await store.signal_recorded(conn, task_id, signal_id):
                    return signal_id, True
                raise FailedPrecondition(
                    f"task {task_id} is already {record.status.upper()}: nothing waits"
                )
            if not await store.signals_insert_if_new(conn, task_id, signal_id, signal, body, now):
                return signal_id, True
            request = task_pb2.SignalRequest(
                task_id=task_id, signal=signal, signal_id=signal_id, payload=json_payload(body)
            )
            set_timestamp(request.sent_at, now)
            await store.emit(
                conn,
                tasks.TASK_SIGNAL,
                tasks.signal_id(task_id, signal_id),
                request.SerializeToString(),
                now,
            )
        self.relay.kick()
        log.info("task signalled", task_id=task_id, signal=signal, signal_id=signal_id)
        return signal_id, False

    async def apply_status(self, env: task_pb2.Task, data: bytes | None = None) -> bool:
        """Take an executor's status snapshot (``data``: its bytes as received, stored as
        they are) into the view with the next flush; True if this snapshot was applied. A
        snapshot carries node states, not payloads: those stay as recorded at acceptance."""
        snapshot = store.Snapshot(
            env.task_id,
            env.version,
            stored_status(env.status),
            env.SerializeToString() if data is None else data,
            env.generation,
        )
        applied = await self.statuses.submit(snapshot)
        if applied and snapshot.status in store.TERMINAL:
            metrics.task_finished(env.business, snapshot.status, (n.cell for n in env.nodes))
        return applied

    async def _apply_all(self, items: Sequence[store.Snapshot]) -> Sequence[bool]:
        """One flush of status events: per task only the newest snapshot matters; all of
        them applied with one statement, each guarded by its version. Watchers of the tasks
        changed are woken after the commit."""
        newest: dict[str, store.Snapshot] = {}
        for item in items:
            known = newest.get(item.task_id)
            if known is None or item.version > known.version:
                newest[item.task_id] = item
        chosen = sorted(newest.values(), key=lambda s: s.task_id)  # one lock order for all
        # One statement is its own transaction: no BEGIN and COMMIT round trips around it.
        async with self.db.connection() as conn:
            applied = await store.tasks_apply_snapshots(conn, chosen, self.clock.now())
        for task_id in applied:
            event = self._changed.pop(task_id, None)
            if event is not None:
                event.set()
        return [item.task_id in applied and newest[item.task_id] is item for item in items]

    async def watch(self, task_id: str) -> AsyncGenerator[task_pb2.Task, None]:
        """The task now, then each new version, until a terminal status."""
        last = -1
        try:
            while True:
                event = self._changed.setdefault(task_id, asyncio.Event())
                view = await self.get(task_id)
                if view.version != last:
                    last = view.version
                    yield view
                if stored_status(view.status) in store.TERMINAL:
                    return
                try:
                    await asyncio.wait_for(event.wait(), self.watch_poll_interval)
                except TimeoutError:
                    pass
        finally:
            self._changed.pop(
                task_id, None
            )  # another watcher of the same task falls back to polling

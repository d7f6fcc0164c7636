"""Group commit across threads (the blocking client's gathered submits): racing threads each
get their own answer, one call at a time carries many items, and a thread only ever sends a
call that carries its own item."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from dispo.sdk._gather import Gathered


class Recorder:
    """A ``send`` that answers each item ``(item, 2 * value)``, checks that no two calls
    overlap and that the thread sending holds an item of the call, and can be held."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.foreign = 0  # calls sent by a thread none of whose items they carried
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, items):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.release.wait()
        me = threading.get_ident()
        if all(owner != me for owner, _ in items):
            self.foreign += 1
        # Let the other threads queue up behind this call.
        threading.Event().wait(0.001)
        with self.lock:
            self.calls.append(list(items))
            self.in_flight -= 1
        return [
            ValueError(f"odd {value}") if value % 7 == 3 else (owner, 2 * value)
            for owner, value in items
        ]


def test_racing_threads_each_get_their_own_answer_from_calls_that_carry_many():
    send = Recorder()
    gathered = Gathered(send, max_items=50)

    def one_thread(base: int) -> list[object]:
        me = threading.get_ident()
        answers: list[object] = []
        for value in range(base, base + 25):
            try:
                answers.append(gathered.submit((me, value), timeout=30))
            except ValueError as error:
                answers.append(str(error))
        return [me, answers]

    with ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(one_thread, range(0, 24 * 25, 25)))

    for (me, answers), base in zip(results, range(0, 24 * 25, 25), strict=True):
        expected = [f"odd {v}" if v % 7 == 3 else (me, 2 * v) for v in range(base, base + 25)]
        assert answers == expected  # its own answers, in its own order
    sent = [value for call in send.calls for _, value in call]
    assert sorted(sent) == list(range(24 * 25))  # every item sent exactly once
    assert send.most_in_flight == 1  # one call at a time
    assert send.foreign == 0  # each call sent by a thread with an item in it
    assert max(len(c) for c in send.calls) <= 50
    assert len(send.calls) < 24 * 25  # gathered: fewer calls than items
    assert (gathered.flushes, gathered.flushed_items) == (len(send.calls), 24 * 25)


def test_a_send_that_raises_fails_every_item_of_its_call_and_the_next_call_goes_on():
    calls: list[list[int]] = []
    fail = threading.Event()
    fail.set()

    def send(items):
        calls.append(list(items))
        if fail.is_set():
            fail.clear()
            raise ConnectionError("gateway gone")
        return [v + 1 for v in items]

    gathered = Gathered(send)
    with pytest.raises(ConnectionError):
        gathered.submit(1)
    assert gathered.submit(2) == 3
    assert calls == [[1], [2]]


def test_a_thread_whose_time_runs_out_in_line_leaves_it_unsent():
    send = Recorder()
    send.release.clear()  # the first call is held on its way
    gathered = Gathered(send)
    me = threading.get_ident()
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(gathered.submit, (me, 1), 30)
        while send.in_flight == 0:
            threading.Event().wait(0.001)
        with pytest.raises(TimeoutError):
            gathered.submit((me, 2), timeout=0.05)  # in line behind the held call
        send.release.set()
        assert first.result(timeout=30) == (me, 2)
    assert gathered.submit((me, 4), timeout=30) == (me, 8)  # the line works on
    assert [value for call in send.calls for _, value in call] == [1, 4]  # 2 never sent

"""The worker's completions travel together: cut into CompleteRuns calls by their size, in
order, a completion larger than a call's bound alone in its own."""

from dispo.libs.api.executor.v1 import worker_pb2
from dispo.libs.payload import json_payload
from dispo.sdk._worker import completion_calls


def completion(token: str, size: int) -> worker_pb2.CompleteRunRequest:
    data = b'"' + b"x" * size + b'"'
    return worker_pb2.CompleteRunRequest(run_token=token, output=json_payload(data))


def test_completions_are_cut_into_calls_by_size_in_order():
    small = [completion(f"s{i}", 10) for i in range(5)]
    assert completion_calls(small) == [small]
    bound = 3 * small[0].ByteSize()
    big = completion("big", 4 * bound)
    calls = completion_calls([*small[:2], big, *small[2:]], max_bytes=bound)
    assert [[r.run_token for r in call] for call in calls] == [
        ["s0", "s1"],
        ["big"],
        ["s2", "s3", "s4"],
    ]
    assert completion_calls([]) == []

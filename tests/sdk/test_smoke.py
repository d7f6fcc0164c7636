from dispo.libs.sdk import cell


async def test_submit_and_wait_noop(client):
    task = await client.submit("smoke", [cell("noop")])
    assert task.status == "ACCEPTED"
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", done


async def test_submit_http(client, downstream):
    task = await client.submit("smoke", [cell("pair", name="x"), cell("step", name="y")])
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", done
    calls = await downstream.calls()
    assert sorted(calls) == sorted(f"{task.task_id}/{n}" for n in ("pair.first", "pair.second", "step.call"))

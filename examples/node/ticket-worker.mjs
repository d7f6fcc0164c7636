// Serving a queue of worker actions from Node.js (docs/workers.md): each run opens a review
// ticket in a tracker and answers its number as the node's output (the twin of the Go
// example's ticket-worker).
//
//   DISPO_TOKEN=$(dispo tokens create --worker --queue tickets) \
//     node ticket-worker.mjs --tracker FILE [--executor 127.0.0.1:50052]
//       [--queue tickets] [--concurrency 10] [--grace 30]      # grace in seconds
//
// The tracker is a file here, one line per ticket opened: "<idempotency key> <attempt>
// <pid>" (a real tracker would take the idempotency key as its own, so that a run done twice
// opens one ticket). The output is {"ticket_id": "T-<name>", "key": <idempotency key>}. For
// trying the worker out, the payload may ask for more than a name:
//
//   {"name": "n1", "busy": 1}         the tracker is busy the first time: retryable, tried again
//   {"name": "n1", "work_ms": 5000}   opening the ticket takes 5 s
//   {"name": "n1", "refuse": "why"}   the tracker refuses: the node fails for good
//
// SIGTERM or SIGINT: no new runs; the runs in flight get the grace to finish, and what is
// left is handed back.
import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";

import { RetryableError, Worker } from "./worker.mjs";

const { values: options } = parseArgs({
  options: {
    executor: { type: "string", default: "127.0.0.1:50052" },
    queue: { type: "string", default: "tickets" },
    concurrency: { type: "string", default: "10" },
    grace: { type: "string", default: "30" },
    tracker: { type: "string" },
  },
});
if (!options.tracker) {
  console.error("usage: node ticket-worker.mjs --tracker FILE [--executor host:port] [--queue q] [--concurrency n] [--grace s]");
  process.exit(2);
}

// Append a line to the tracker, durably.
function record(line) {
  const fd = fs.openSync(options.tracker, "a");
  try {
    fs.writeSync(fd, line);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

// The runs the tracker answered busy, by key.
const busy = new Map();

const worker = new Worker(options.executor, {
  concurrency: Number(options.concurrency),
  grace: Number(options.grace) * 1000,
});

worker.action(options.queue, async (ctx, payload) => {
  worker.log(`run started: node ${ctx.nodeId} of task ${ctx.taskId}, attempt ${ctx.attempt}`);
  const times = busy.get(ctx.idempotencyKey) ?? 0;
  if (times < (payload.busy ?? 0)) {
    busy.set(ctx.idempotencyKey, times + 1);
    throw new RetryableError("the tracker is busy");
  }
  if (payload.refuse) throw new Error(`the tracker refused the ticket: ${payload.refuse}`);
  // Aborted when the run is not held any more: nothing done, nothing sent.
  await sleep(payload.work_ms ?? 0, undefined, { signal: ctx.signal });
  record(`${ctx.idempotencyKey} ${ctx.attempt} ${process.pid}\n`);
  return { ticket_id: `T-${payload.name}`, key: ctx.idempotencyKey };
});

worker.run().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);

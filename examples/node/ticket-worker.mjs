// Serving a queue of worker actions from Node.js (docs/workers.md): each run opens a review
// ticket in a tracker and answers its number as the node's output; the queue's probes are
// answered by looking for the ticket under the idempotency key (the twin of the Go
// example's ticket-worker).
//
//   DISPO_TOKEN=$(dispo tokens create --worker --queue tickets) \
//     node ticket-worker.mjs --tracker FILE [--executor 127.0.0.1:50052]
//       [--queue tickets] [--concurrency 10] [--grace 30]      # grace in seconds
//
// The tracker is a file here, one line per ticket opened: "<idempotency key> <attempt>
// <pid> <ticket id>" (a real tracker would take the idempotency key as its own, so that a
// run done twice opens one ticket). The output is {"ticket_id": "T-<name>", "key":
// <idempotency key>}. For trying the worker out, the payload may ask for more than a name:
//
//   {"name": "n1", "busy": 1}          the tracker is busy the first time: retryable, tried again
//   {"name": "n1", "work_ms": 5000}    opening the ticket takes 5 s
//   {"name": "n1", "refuse": "why"}    the tracker refuses: the node fails for good
//   {"name": "n1", "answer_ms": 5000}  the answer takes 5 s once the ticket is opened
//
// A probe (whether the run of a key that ended unknown opened its ticket) finds the ticket in
// the tracker: done, with the ticket as the output ({ticket_id, key, found_by: <pid>}). None
// found: the key is fenced up to the attempt asked about (a line "<key> <attempt>" in
// FILE.fences; a run of a fenced attempt opens nothing) and the answer is "not done, fenced",
// so the node runs again at once.
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

// Append a line to a file, durably.
function appendLine(file, line) {
  const fd = fs.openSync(file, "a");
  try {
    fs.writeSync(fd, line);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

// The lines of a file (none when it does not exist).
function readLines(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter(Boolean);
}

const FENCES = `${options.tracker}.fences`;

// Whether the tracker refuses key at attempt: a probe fenced it up to that attempt or later.
const fenced = (key, attempt) =>
  readLines(FENCES).some((line) => {
    const [fencedKey, upTo] = line.split(" ");
    return fencedKey === key && attempt <= Number(upTo);
  });

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
  const ticket = `T-${payload.name}`;
  if (fenced(ctx.idempotencyKey, ctx.attempt)) {
    throw new Error(`the tracker refuses key ${ctx.idempotencyKey} at attempt ${ctx.attempt}: fenced`);
  }
  appendLine(options.tracker, `${ctx.idempotencyKey} ${ctx.attempt} ${process.pid} ${ticket}\n`);
  // The ticket is opened; the answer may still be lost if the run is not held any more.
  await sleep(payload.answer_ms ?? 0, undefined, { signal: ctx.signal });
  return { ticket_id: ticket, key: ctx.idempotencyKey };
});

// Whether the run of the key asked about opened its ticket. Not found: the key is fenced up
// to that attempt first, so "not done" is final.
worker.probe(options.queue, async (ctx) => {
  worker.log(`probe: node ${ctx.nodeId} of task ${ctx.taskId}, attempt ${ctx.attempt}`);
  for (const line of readLines(options.tracker)) {
    const [key, , , ticket] = line.split(" ");
    if (key === ctx.idempotencyKey && ticket) {
      return { done: true, output: { ticket_id: ticket, key, found_by: process.pid } };
    }
  }
  appendLine(FENCES, `${ctx.idempotencyKey} ${ctx.attempt}\n`);
  return { done: false, fenced: true };
});

worker.run().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);

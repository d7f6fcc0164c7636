// A worker for Dispo's worker actions from Node.js (docs/workers.md): your own async functions
// as the actions of `kind: worker`, served over WorkerService with the protos of protos/
// loaded at run time, as client.mjs calls the gateway.
//
//   import { Worker, RetryableError } from "./worker.mjs";
//   const worker = new Worker("127.0.0.1:50052", { token, concurrency: 10, grace: 30_000 });
//   worker.action("tickets", async (ctx, payload) => {        // the catalogue action's queue
//     if (tracker.busy()) throw new RetryableError("tracker busy");   // no effect: retried
//     const ticket = await tracker.open(payload.name, { key: ctx.idempotencyKey, signal: ctx.signal });
//     return { ticket_id: ticket.id };                          // the node's output
//   });
//   await worker.run();                                         // until SIGTERM / worker.stop()
//
// A worker may also answer the probes of its queues (ADR-0100): whether the effect of a run
// whose outcome was lost (its worker vanished mid-run) happened, so that the node is settled
// without an operator:
//
//   worker.probe("tickets", async (ctx) => {                    // ctx.idempotencyKey, ctx.attempt
//     const ticket = await tracker.find(ctx.idempotencyKey);
//     if (ticket) return { done: true, output: { ticket_id: ticket.id } };  // SUCCEEDED
//     await tracker.refuse(ctx.idempotencyKey, ctx.attempt);   // never opened from now on
//     return { done: false, fenced: true };                     // runs again at once
//   });
//
// A probe handler that throws or returns nothing gives no answer: asked again later.
//
// The worker long-polls the executor for runs of its queues with its free credit
// (concurrency minus the runs it holds), heartbeats the runs it holds every third of their
// lease, and completes each with its handler's returned value (the output), its error (a
// failure: retryable when it is a RetryableError) or, for a queue it has no handler for,
// "not sent": the completions of the runs that end while a CompleteRuns call is on its way
// go together in the next one (completions.mjs; one CompleteRun each against an executor
// without it). A run whose heartbeat says it is not held any more has ctx.signal aborted and
// is never completed. SIGTERM (or stop()): no new runs; the runs in flight get `grace` ms to
// finish; what is left is handed back (ReleaseRuns).
import crypto from "node:crypto";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

import { Completions } from "./completions.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PROTOS = process.env.PROTOS ?? path.resolve(HERE, "../../protos");
// How long one PollRuns waits for a run (ms), and the pause after a call that failed.
const POLL_WAIT_MS = 10_000;
const RETRY_PAUSE_MS = 1_000;
const JSON_PLAIN = { encoding: Buffer.from("json/plain") };

// Thrown by a handler whose run had no effect and may be tried again (a short retry, as for
// an http 503). Any other error fails the node for good.
export class RetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = "RetryableError";
  }
}

const codeName = (code) => Object.keys(grpc.status).find((k) => grpc.status[k] === code) ?? code;
const describe = (error) => (error.code !== undefined ? `${codeName(error.code)}: ${error.details}` : String(error));
const toDate = (t) => (t ? new Date(Number(t.seconds) * 1000 + Math.floor(t.nanos / 1e6)) : null);

export class Worker {
  // The runs' outcomes on their way: those ending together in one CompleteRuns.
  #completions;

  // address: an executor's gRPC address (any replica). token: the caller's API token
  // (default DISPO_TOKEN). concurrency: runs handled at once at most. grace: how long (ms)
  // the runs in flight may take to finish after stop() or SIGTERM. credentials: the
  // channel's (plaintext by default, as `dispo up` serves).
  constructor(
    address = "127.0.0.1:50052",
    {
      token = process.env.DISPO_TOKEN,
      concurrency = 10,
      grace = 30_000,
      workerId = `${os.hostname()}:${process.pid}:${crypto.randomBytes(4).toString("hex")}`,
      credentials = grpc.credentials.createInsecure(),
      log = (line) => console.error(`${new Date().toISOString()} ${line}`),
    } = {},
  ) {
    if (!(concurrency >= 1)) throw new RangeError("concurrency must be at least 1");
    const definition = protoLoader.loadSync(["dispo/executor/v1/worker.proto"], {
      includeDirs: [PROTOS],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const { WorkerService } = grpc.loadPackageDefinition(definition).dispo.executor.v1;
    this.stub = new WorkerService(address, credentials);
    this.token = token;
    this.concurrency = concurrency;
    this.grace = grace;
    this.workerId = workerId;
    this.log = log;
    this.handlers = new Map();
    this.probes = new Map();
    this.held = new Map(); // run token -> { run, ctx, controller, gone, completing, done }
    this.leaseMs = 10_000;
    this.stopping = false;
    this.wake = null; // resolves the wait of a poll with no credit, or of a stop
    this.leaseChanged = null; // wakes the heartbeat when a poll tells another lease
    this.#completions = new Completions((method, request, timeoutMs) => this.#call(method, request, timeoutMs));
  }

  // Register `async (ctx, payload) => output` for the runs of `queue`.
  action(queue, handler) {
    if (this.handlers.has(queue)) throw new Error(`queue ${JSON.stringify(queue)} already has a handler`);
    this.handlers.set(queue, handler);
    return this;
  }

  // Register `async (ctx) => ({ done, fenced, output })` for the probe runs of `queue`:
  // whether the effect of ctx.attempt under ctx.idempotencyKey happened (done, with the
  // effect's output, the node's); not done and fenced: the handler made sure it never
  // happens under the key up to that attempt, so the node runs again at once; not done
  // and not fenced: final once the action's max_effect_seconds have passed.
  probe(queue, handler) {
    if (this.probes.has(queue)) throw new Error(`queue ${JSON.stringify(queue)} already has a probe handler`);
    this.probes.set(queue, handler);
    return this;
  }

  // Stop taking runs; the runs in flight get `grace` ms (default: the worker's) to finish.
  stop(grace) {
    if (grace !== undefined) this.grace = grace;
    this.stopping = true;
    this.polling?.cancel();
    this.#wakeUp();
  }

  // Poll and run until stop() (or SIGTERM / SIGINT with handleSignals), then hand back
  // what is left once the grace has passed.
  async run({ handleSignals = true } = {}) {
    if (this.handlers.size === 0 && this.probes.size === 0) {
      throw new Error("no action registered: use worker.action(queue, handler)");
    }
    const onSignal = () => this.stop();
    if (handleSignals) for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, onSignal);
    const beating = new AbortController();
    const names = (map) => [...map.keys()].sort().join(",");
    this.log(`worker ${this.workerId} started: queues ${names(this.handlers)}, probes ${names(this.probes)}`);
    const heartbeat = this.#heartbeat(beating.signal);
    try {
      await this.#poll();
      await this.#drain();
    } finally {
      beating.abort();
      await heartbeat;
      if (handleSignals) for (const signal of ["SIGTERM", "SIGINT"]) process.off(signal, onSignal);
      this.stub.close();
      this.log(`worker ${this.workerId} stopped`);
    }
  }

  #wakeUp() {
    this.wake?.();
    this.wake = null;
  }

  // One unary call with the token and a deadline; `started` sees the call (to cancel it).
  #call(method, request, timeoutMs, started = () => {}) {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set("authorization", `Bearer ${this.token}`);
    return new Promise((resolve, reject) => {
      started(
        this.stub[method](request, metadata, { deadline: Date.now() + timeoutMs }, (error, reply) =>
          error ? reject(error) : resolve(reply),
        ),
      );
    });
  }

  async #poll() {
    const queues = [...this.handlers.keys()].sort();
    const probeQueues = [...this.probes.keys()].sort();
    while (!this.stopping) {
      const credit = this.concurrency - this.held.size;
      if (credit <= 0) {
        await new Promise((resolve) => (this.wake = resolve));
        continue;
      }
      let reply;
      try {
        reply = await this.#call(
          "PollRuns",
          {
            queues,
            probe_queues: probeQueues,
            worker_id: this.workerId,
            max_runs: Math.min(credit, 100),
            wait_ms: POLL_WAIT_MS,
          },
          POLL_WAIT_MS + 10_000,
          (call) => (this.polling = call),
        );
      } catch (error) {
        if (this.stopping) return; // the poll was cut short by the stop
        this.log(`poll failed; again shortly: ${describe(error)}`);
        await Promise.race([sleep(RETRY_PAUSE_MS), new Promise((resolve) => (this.wake = resolve))]);
        continue;
      } finally {
        this.polling = null;
      }
      if (reply.lease_ms && reply.lease_ms !== this.leaseMs) {
        this.leaseMs = reply.lease_ms;
        this.leaseChanged?.(); // the heartbeat's pace follows at once
      }
      for (const run of reply.runs) this.#start(run);
    }
  }

  #start(run) {
    const controller = new AbortController();
    const ctx = {
      taskId: run.task_id,
      nodeId: run.node_id,
      action: run.action,
      queue: run.queue,
      idempotencyKey: run.idempotency_key, // the same on every attempt: deduplicate by it
      attempt: run.attempt,
      deadline: toDate(run.deadline),
      probe: run.probe, // a probe run: did the effect of `attempt` under the key happen?
      signal: controller.signal, // aborted when the run is not held any more
    };
    const entry = { token: run.run_token, ctx, controller, gone: false, completing: false };
    this.held.set(entry.token, entry);
    entry.done = this.#handle(entry, run).finally(() => {
      if (this.held.get(entry.token) === entry) this.held.delete(entry.token);
      this.#wakeUp();
    });
  }

  async #handle(entry, run) {
    const { ctx } = entry;
    const handler = this.handlers.get(run.queue);
    const request = { run_token: entry.token };
    if (run.probe) {
      Object.assign(request, await this.#probe(entry));
    } else if (!handler) {
      request.not_sent = `this worker serves no queue ${JSON.stringify(run.queue)}`;
    } else {
      try {
        const data = run.payload?.data?.length ? JSON.parse(run.payload.data.toString("utf8")) : null;
        const value = await handler(ctx, data);
        const body = value === undefined || value === null ? Buffer.alloc(0) : Buffer.from(JSON.stringify(value));
        request.output = { metadata: JSON_PLAIN, data: body };
      } catch (error) {
        if (error instanceof RetryableError) {
          request.error = { message: error.message || error.name, retryable: true };
        } else {
          const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
          if (!entry.gone) this.log(`action failed: node ${ctx.nodeId} of task ${ctx.taskId}: ${message}`);
          request.error = { message, retryable: false };
        }
      }
    }
    if (entry.gone) return; // never completed: the run is not held any more
    entry.completing = true;
    await this.#complete(request, ctx);
  }

  // A probe run's answer: the queue's probe handler's, else no answer.
  async #probe(entry) {
    const { ctx } = entry;
    const handler = this.probes.get(ctx.queue);
    if (!handler) return { not_sent: `this worker answers no probe of queue ${JSON.stringify(ctx.queue)}` };
    let answer;
    try {
      answer = await handler(ctx);
    } catch (error) {
      const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      if (!entry.gone) this.log(`probe failed: node ${ctx.nodeId} of task ${ctx.taskId}: ${message}`);
      return { error: { message, retryable: false } };
    }
    if (answer === undefined || answer === null) return { not_sent: "the probe handler could not say" };
    const done = Boolean(answer.done);
    const probe = { done, fenced: Boolean(answer.fenced) && !done };
    if (done && answer.output !== undefined && answer.output !== null) {
      probe.output = { metadata: JSON_PLAIN, data: Buffer.from(JSON.stringify(answer.output)) };
    }
    return { probe };
  }

  // Send a run's outcome, with those of the runs ending meanwhile; an UNAVAILABLE executor
  // is tried a few times.
  async #complete(request, ctx) {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const { recorded, detail } = await this.#completions.submit(request);
        if (!recorded) {
          this.log(`completion refused: the run's lease was lost: node ${ctx.nodeId} of task ${ctx.taskId}: ${detail}`);
        }
        return;
      } catch (error) {
        if (error.code !== grpc.status.UNAVAILABLE) {
          this.log(`completion refused: node ${ctx.nodeId} of task ${ctx.taskId}: ${describe(error)}`);
          return;
        }
        await sleep(RETRY_PAUSE_MS);
      }
    }
  }

  // Every third of the lease: extend the leases of the runs held; a run not held any more
  // has its signal aborted and is never completed.
  async #heartbeat(stopped) {
    while (!stopped.aborted) {
      const paced = new AbortController();
      const stop = () => paced.abort();
      stopped.addEventListener("abort", stop, { once: true });
      this.leaseChanged = () => paced.abort("lease");
      try {
        await sleep(this.leaseMs / 3, undefined, { signal: paced.signal });
      } catch {
        if (stopped.aborted) return;
        continue; // another lease: wait a third of it
      } finally {
        stopped.removeEventListener("abort", stop);
        this.leaseChanged = null;
      }
      const held = [...this.held.values()].filter((entry) => !entry.gone);
      if (held.length === 0) continue;
      let reply;
      try {
        reply = await this.#call(
          "HeartbeatRuns",
          { worker_id: this.workerId, run_tokens: held.map((entry) => entry.token) },
          this.leaseMs / 3,
        );
      } catch (error) {
        this.log(`heartbeat failed: ${describe(error)}`);
        continue;
      }
      reply.leases.forEach((lease, i) => {
        const entry = held[i];
        if (lease.held || !entry) return;
        const lost = !entry.completing && !entry.gone;
        entry.gone = true;
        if (lost) {
          this.log(`run lease lost; its handler is cancelled: node ${entry.ctx.nodeId} of task ${entry.ctx.taskId}`);
          entry.controller.abort(new Error("the run's lease was lost"));
        }
      });
    }
  }

  // Let the runs in flight finish within the grace, then hand back the rest.
  async #drain() {
    const running = [...this.held.values()].map((entry) => entry.done);
    if (running.length === 0) return;
    const timer = new AbortController();
    await Promise.race([
      Promise.allSettled(running),
      sleep(this.grace, undefined, { signal: timer.signal }).catch(() => {}),
    ]);
    timer.abort();
    const left = [...this.held.values()].filter((entry) => !entry.gone && !entry.completing);
    for (const entry of left) {
      entry.gone = true;
      entry.controller.abort(new Error("the worker stopped: the run is handed back"));
    }
    if (left.length > 0) {
      try {
        const reply = await this.#call(
          "ReleaseRuns",
          { worker_id: this.workerId, run_tokens: left.map((entry) => entry.token) },
          10_000,
        );
        this.log(`runs handed back: ${reply.released}`);
      } catch (error) {
        this.log(`runs not handed back: ${describe(error)}`);
      }
    }
    // The outcomes being sent go out; a handler that ignores its signal is not waited for.
    await Promise.allSettled([...this.held.values()].filter((entry) => entry.completing).map((entry) => entry.done));
  }
}

// The outcomes of a worker's runs, sent as the Python SDK's worker sends them (ADR-0107): a
// run that ends while no call is on its way is sent at once; those that end while one is go
// together in the next CompleteRuns, each recorded or refused on its own. One call on its
// way at a time, at most 100 runs and about 1 MiB of outcomes a call. An executor that
// answers CompleteRuns UNIMPLEMENTED (one from before) gets one CompleteRun per run from
// then on; an INVALID_ARGUMENT for a call of several sends them one by one, so that only
// the malformed one is refused.
//
//   const completions = new Completions((method, request, timeoutMs) => promise of the reply);
//   const { recorded, detail } = await completions.submit({ run_token, output });  // or throws the call's error
import grpc from "@grpc/grpc-js";

export const COMPLETE_MAX_RUNS = 100;
export const COMPLETE_MAX_BYTES = 1 << 20;
const COMPLETE_TIMEOUT_MS = 10_000;

// About the bytes a completion takes in a call: its outcome's data and texts.
const sizeOf = (request) =>
  32 +
  Buffer.byteLength(request.run_token ?? "") +
  (request.output?.data?.length ?? 0) +
  (request.probe?.output?.data?.length ?? 0) +
  Buffer.byteLength(request.error?.message ?? "") +
  Buffer.byteLength(request.not_sent ?? "");

// The completions, in order, cut into calls of at most maxBytes each (one larger than that
// alone in its call).
export function completionCalls(items, maxBytes = COMPLETE_MAX_BYTES) {
  const calls = [];
  let size = 0;
  for (const item of items) {
    const n = sizeOf(item.request);
    if (calls.length === 0 || size + n > maxBytes) {
      calls.push([]);
      size = 0;
    }
    calls[calls.length - 1].push(item);
    size += n;
  }
  return calls;
}

export class Completions {
  // call(method, request, timeoutMs): one unary call of WorkerService, a promise of its reply.
  constructor(call) {
    this.call = call;
    this.waiting = [];
    this.sending = false;
    this.single = false; // the executor answered CompleteRuns UNIMPLEMENTED: a CompleteRun each
  }

  // Send `request` (a CompleteRunRequest) with the completions waiting beside it: its
  // RunCompletion ({ run_token, recorded, detail }), or the call's error thrown.
  submit(request) {
    return new Promise((resolve, reject) => {
      this.waiting.push({ request, resolve, reject });
      if (!this.sending) {
        this.sending = true;
        setImmediate(() => this.#flush()); // with the runs ending in the same turn
      }
    });
  }

  async #flush() {
    try {
      while (this.waiting.length > 0) {
        const taken = this.waiting.splice(0, COMPLETE_MAX_RUNS);
        for (const call of completionCalls(taken)) await this.#send(call);
      }
    } finally {
      this.sending = false;
    }
  }

  async #send(items) {
    if (!this.single) {
      try {
        const reply = await this.call(
          "CompleteRuns",
          { completions: items.map((item) => item.request) },
          COMPLETE_TIMEOUT_MS,
        );
        if (reply.results.length !== items.length) {
          const error = new Error(`CompleteRuns answered ${reply.results.length} results for ${items.length} completions`);
          for (const item of items) item.reject(error);
        } else {
          items.forEach((item, i) => item.resolve(reply.results[i]));
        }
        return;
      } catch (error) {
        if (error.code === grpc.status.UNIMPLEMENTED) {
          this.single = true; // an executor from before
        } else if (error.code !== grpc.status.INVALID_ARGUMENT || items.length === 1) {
          for (const item of items) item.reject(error);
          return;
        } // else one of them is malformed: each on its own, so that it alone is refused
      }
    }
    await Promise.all(items.map((item) => this.#sendOne(item)));
  }

  // One CompleteRun: ABORTED is a refusal, as CompleteRuns gives it.
  async #sendOne(item) {
    const { run_token } = item.request;
    try {
      await this.call("CompleteRun", item.request, COMPLETE_TIMEOUT_MS);
      item.resolve({ run_token, recorded: true, detail: "" });
    } catch (error) {
      if (error.code === grpc.status.ABORTED) item.resolve({ run_token, recorded: false, detail: error.details });
      else item.reject(error);
    }
  }
}

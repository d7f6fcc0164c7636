// Calling Dispo from Node.js: the protos of protos/ loaded at run time (no generated code),
// a bearer token on every call, and gRPC errors turned into readable messages from their
// google.rpc.BadRequest details.
//
//   DISPO_TOKEN=... node client.mjs            # against the stack `dispo up` started
//
// Environment: DISPO_TOKEN (required; a business token or the admin token),
// GATEWAY (127.0.0.1:50051), RECONCILER (127.0.0.1:50053), BUSINESS
// (ecommerce), RUN (a suffix making this run's idempotency keys and payloads its own;
// default: the time). The cells are the example catalogue's (libs/catalogue/
// content_governance.yaml), which `dispo up` loads, calling its demo downstream.
import path from "node:path";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PROTOS = process.env.PROTOS ?? path.resolve(HERE, "../../protos");
const GATEWAY = process.env.GATEWAY ?? "127.0.0.1:50051";
const RECONCILER = process.env.RECONCILER ?? "127.0.0.1:50053";
const BUSINESS = process.env.BUSINESS ?? "ecommerce";
const RUN = process.env.RUN ?? String(Date.now());
const TOKEN = process.env.DISPO_TOKEN;
if (!TOKEN) {
  console.error("set DISPO_TOKEN (dispo up wrote the admin token to .dispo/admin.token)");
  process.exit(2);
}

// The protos as published, read from protos/ (keepCase: field names as in the .proto).
const definition = protoLoader.loadSync(
  ["dispo/gateway/v1/gateway.proto", "dispo/reconciler/v1/reconciler.proto"],
  { includeDirs: [PROTOS], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true },
);
const api = grpc.loadPackageDefinition(definition).dispo;

// Plaintext channels, as `dispo up` serves by default.
const gateway = new api.gateway.v1.GatewayService(GATEWAY, grpc.credentials.createInsecure());
const reconciler = new api.reconciler.v1.ReconcilerService(
  RECONCILER,
  grpc.credentials.createInsecure(),
);

// The token travels on every call as `authorization: Bearer <token>` (grpc-js sends call
// credentials only over TLS, so it goes in each call's metadata).
function bearer() {
  const metadata = new grpc.Metadata();
  metadata.set("authorization", `Bearer ${TOKEN}`);
  return metadata;
}

// google.rpc.Status and BadRequest: the rich error model of grpc-status-details-bin.
const rpc = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: "int32", id: 1 },
                message: { type: "string", id: 2 },
                details: { rule: "repeated", type: "Any", id: 3 },
              },
            },
            Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
            BadRequest: {
              fields: { field_violations: { rule: "repeated", type: "FieldViolation", id: 1 } },
              nested: {
                FieldViolation: {
                  fields: {
                    field: { type: "string", id: 1 },
                    description: { type: "string", id: 2 },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
});
const Status = rpc.lookupType("google.rpc.Status");
const BadRequest = rpc.lookupType("google.rpc.BadRequest");

// A status as a person reads it: the code's name, then one line per field violation of its
// google.rpc.BadRequest detail.
function statusText(code, message, details = []) {
  const name = Object.keys(grpc.status).find((k) => grpc.status[k] === code) ?? code;
  const lines = [];
  for (const detail of details) {
    if (detail.type_url.endsWith("/google.rpc.BadRequest")) {
      for (const v of BadRequest.decode(detail.value).field_violations) {
        lines.push(`  ${v.field}: ${v.description}`);
      }
    }
  }
  return [`${name}: ${message}`, ...lines].join("\n");
}

// A gRPC error as a person reads it (its status details travel in grpc-status-details-bin).
export function readable(error) {
  const [raw] = error.metadata?.get("grpc-status-details-bin") ?? [];
  return statusText(error.code, error.details, raw ? Status.decode(raw).details : []);
}

const call = (client, method, request) =>
  new Promise((resolve, reject) =>
    client[method](request, bearer(), (error, reply) => (error ? reject(error) : resolve(reply))),
  );

// WatchTask: the task now, then at every change, until it is terminal (or `until` holds).
async function watch(taskId, until = () => false) {
  const stream = gateway.WatchTask({ task_id: taskId }, bearer());
  let last;
  for await (const { task } of stream) {
    last = task;
    if (until(task)) {
      stream.cancel();
      break;
    }
  }
  return last;
}

const json = (value) => Buffer.from(JSON.stringify(value));
// A cell of the submission: catalogue name, payload (as JSON bytes), the cells it follows.
const cell = (name, payload, depends_on = []) => ({
  cell: name,
  payload_json: json(payload),
  depends_on,
});
const nodes = (task) => task.nodes.map((n) => `${n.node_id}=${n.status}`).join(" ");

// Resume a FAILED task through the reconciler (once it holds it), then watch it to its end.
async function resume(failed) {
  let resumed;
  for (let attempt = 0; !resumed; attempt++) {
    try {
      resumed = await call(reconciler, "RedriveTask", {
        task_id: failed.task_id,
        actor: "node-example",
        reason: "the downstream was fixed",
        include_permanent: true,
      });
    } catch (error) {
      // NOT_FOUND until the reconciler has recorded the failure.
      if (error.code !== grpc.status.NOT_FOUND || attempt >= 100) throw error;
      await new Promise((r) => setTimeout(r, 100 * Math.min(attempt + 1, 10)));
    }
  }
  console.log(`resumed ${resumed.task.task_id}: ${resumed.task.state}`);
  // Until the executor takes the redrive, the task is still the FAILED one: a watch of it
  // ends at once. Watch again until a newer generation has ended.
  let after = failed;
  while (after.status === "TASK_STATUS_FAILED" && after.generation === failed.generation) {
    await new Promise((r) => setTimeout(r, 100));
    after = await watch(failed.task_id);
  }
  console.log(`watched ${after.task_id} to ${after.status} after the resume`);
}

async function main() {
  // 1. Submit a two-cell task (the second after the first) under an idempotency key; the
  //    same key again is the same task.
  const request = {
    business: BUSINESS,
    idempotency_key: `node-${RUN}`,
    cells: [
      cell("update_quality_level", { content_id: `content-${RUN}`, level: 3 }),
      cell("notify_owner", { owner_id: "user-7", message: "label raised" }, ["update_quality_level"]),
    ],
  };
  const submitted = await call(gateway, "Submit", request);
  console.log(`submitted ${submitted.task_id} ${submitted.status} duplicate=${submitted.duplicate}`);
  const again = await call(gateway, "Submit", request);
  console.log(`submitted again: same task ${again.task_id === submitted.task_id} duplicate=${again.duplicate}`);

  // 2. Stream WatchTask to its end.
  const done = await watch(submitted.task_id);
  console.log(`watched ${done.task_id} to ${done.status}: ${nodes(done)}`);

  // 3. Cancel a task while its first node runs: the node after it never starts.
  const held = await call(gateway, "Submit", {
    business: BUSINESS,
    cells: [
      cell("start_review", { content_id: `held-${RUN}` }),
      cell("notify_owner", { owner_id: "user-7", message: "review opened" }, ["start_review"]),
    ],
  });
  await watch(held.task_id, (task) => task.nodes.some((n) => n.status === "NODE_STATUS_RUNNING"));
  try {
    const cancelled = (await call(gateway, "CancelTask", { task_id: held.task_id })).task;
    console.log(`cancel requested for ${cancelled.task_id}: ${cancelled.cancel_requested}`);
  } catch (error) {
    // A task that finished first cannot be cancelled any more.
    if (error.code !== grpc.status.FAILED_PRECONDITION) throw error;
    console.log(`not cancelled: ${readable(error)}`);
  }

  // 4. A task that fails, resumed through the reconciler once it holds it.
  const failing = await call(gateway, "Submit", {
    business: BUSINESS,
    cells: [cell("update_quality_level", { content_id: `fails-${RUN}`, level: 1 })],
  });
  const failed = await watch(failing.task_id);
  console.log(`watched ${failed.task_id} to ${failed.status}`);
  if (failed.status === "TASK_STATUS_FAILED") await resume(failed);

  // 5. The business's tasks, a page at a time.
  const ids = [];
  let page_token = "";
  do {
    const page = await call(gateway, "ListTasks", {
      business: BUSINESS,
      page: { page_size: 2, page_token },
    });
    ids.push(...page.tasks.map((t) => t.task_id));
    page_token = page.page?.next_page_token ?? "";
  } while (page_token);
  const mine = [submitted.task_id, held.task_id, failing.task_id].every((id) => ids.includes(id));
  console.log(`listed ${ids.length} tasks of ${BUSINESS}, this run's among them: ${mine}`);

  // 6. Bad input: refused with the offending fields named.
  try {
    await call(gateway, "Submit", {
      business: BUSINESS,
      idempotency_key: "k".repeat(200),
      cells: [{ cell: "delete_everything" }],
    });
    console.log("bad input accepted?!");
  } catch (error) {
    console.log(`refused: ${readable(error)}`);
  }

  // 7. Several tasks in one call, each answered on its own: SubmitEach. The bad one is
  //    refused in its place, naming its own fields, and the others are recorded.
  const each = await call(gateway, "SubmitEach", {
    requests: [
      { business: BUSINESS, idempotency_key: `node-each-${RUN}`, cells: [cell("notify_owner", { owner_id: "user-7", message: "first" })] },
      { business: BUSINESS, cells: [{ cell: "delete_everything" }] },
      { business: BUSINESS, cells: [cell("notify_owner", { owner_id: "user-8", message: "second" })] },
    ],
  });
  each.outcomes.forEach(({ accepted, refused }, i) => {
    if (accepted) console.log(`each[${i}] accepted ${accepted.task_id} duplicate=${accepted.duplicate}`);
    else console.log(`each[${i}] refused: ${statusText(refused.code, refused.message, refused.details)}`);
  });
}

main().then(
  () => {
    gateway.close();
    reconciler.close();
  },
  (error) => {
    console.error(error.code !== undefined ? readable(error) : error);
    process.exit(1);
  },
);

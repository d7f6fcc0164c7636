// Package dispo calls Dispo's gRPC services from Go.
//
// A Client submits tasks to the gateway, reads them, follows them to their end and lists the
// catalogue's cells:
//
//	client, err := dispo.NewClient("127.0.0.1:50051", dispo.WithToken(token))
//	if err != nil { ... }
//	defer client.Close()
//	submitted, err := client.Submit(ctx, dispo.Request{
//		Business:       "ecommerce",
//		IdempotencyKey: "content-42-raise",
//		Cells: []dispo.Cell{
//			{Cell: "update_quality_level", Payload: map[string]any{"content_id": "content-42", "level": 3}},
//		},
//	})
//	task, err := client.WatchTask(ctx, submitted.TaskId, nil)
//
// A Worker serves the queues of worker actions: its handlers are steps of a task.
//
//	worker, err := dispo.NewWorker("127.0.0.1:50052", dispo.WithToken(token))
//	worker.Handle("tickets", func(ctx context.Context, run *dispo.Run) (any, error) {
//		return map[string]string{"ticket_id": "T-1"}, nil // the node's output
//	})
//	err = worker.Run(ctx) // until ctx ends; then the runs in flight finish or are handed back
//
// Every call carries the token as "authorization: Bearer <token>"; Dial opens the channel
// (plaintext, or TLS with WithTLS) that any of Dispo's service clients can share. A refused
// call returns an *Error: the gRPC code, the message and the fields the server named.
//
// The generated code of protos/ lives under dispo/gen/<context>/v1 (build.sh writes it).
package dispo

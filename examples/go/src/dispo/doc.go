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
// Every call carries the token as "authorization: Bearer <token>"; Dial opens the channel
// (plaintext, or TLS with WithTLS) that any of Dispo's service clients can share. A refused
// call returns an *Error: the gRPC code, the message and the fields the server named.
//
// The generated code of protos/ lives under dispo/gen/<context>/v1 (build.sh writes it).
package dispo

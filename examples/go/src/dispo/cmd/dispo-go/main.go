// Command dispo-go calls Dispo's gateway from Go and prints what it answers as JSON.
//
//	dispo-go [-address host:port] [-timeout d] submit -d REQUEST   # REQUEST: JSON, @file or @- (stdin)
//	dispo-go get TASK_ID
//	dispo-go watch TASK_ID        # one line per change, until the task is terminal
//	dispo-go cells
//
// REQUEST is a task as grpcurl writes it: {"business": ..., "idempotency_key": ...,
// "callback_url": ..., "cells": [{"cell": ..., "ref": ..., "payload": {...},
// "depends_on": [...]}]}; the payloads are sent as written.
//
// The token is DISPO_TOKEN; TLS follows DISPO_TLS_CA_FILE (with DISPO_TLS_CLIENT_CERT_FILE
// and DISPO_TLS_CLIENT_KEY_FILE for mTLS); the address defaults to DISPO_GATEWAY_HOST and
// DISPO_GATEWAY_PORT, else 127.0.0.1:50051.
//
// Exit codes, as Dispo's CLI: 0 done (watch: the task SUCCEEDED), 1 the watched task ended
// FAILED or CANCELLED, 2 usage, 3 unreachable (UNAVAILABLE, DEADLINE_EXCEEDED), 4 refused
// (any other status; its JSON, with the fields named, on standard error).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"dispo"
	commonv1 "dispo/gen/common/v1"
	gatewayv1 "dispo/gen/gateway/v1"
	taskv1 "dispo/gen/task/v1"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

const (
	exitDone        = 0
	exitTaskFailed  = 1
	exitUsage       = 2
	exitUnreachable = 3
	exitRefused     = 4
)

const usage = `usage: dispo-go [-address host:port] [-timeout d] <command>

commands:
  submit -d REQUEST   submit a task (REQUEST: JSON, @file, or @- for standard input)
  get TASK_ID         the task now, with its completion
  watch TASK_ID       the task at every change, one JSON line each, until it is terminal
  cells               the catalogue's cells

environment: DISPO_TOKEN; DISPO_TLS_CA_FILE (TLS), DISPO_TLS_CLIENT_CERT_FILE and
DISPO_TLS_CLIENT_KEY_FILE (mTLS); DISPO_GATEWAY_HOST, DISPO_GATEWAY_PORT
`

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// usageError is bad command-line input: printed with the usage, exit code 2.
type usageError struct{ message string }

func (e usageError) Error() string { return e.message }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("dispo-go", flag.ContinueOnError)
	global.SetOutput(stderr)
	global.Usage = func() { fmt.Fprint(stderr, usage) }
	address := global.String("address", defaultAddress(), "the gateway's host:port")
	timeout := global.Duration("timeout", 60*time.Second, "how long the command may take")
	if err := global.Parse(args); err != nil {
		return exitUsage
	}
	if global.NArg() == 0 {
		global.Usage()
		return exitUsage
	}

	client, err := dispo.NewClient(*address, dispo.FromEnvironment())
	if err != nil {
		fmt.Fprintln(stderr, "dispo-go:", err)
		return exitUsage
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	out := printer{stdout}
	command, rest := global.Arg(0), global.Args()[1:]
	switch command {
	case "submit":
		err = submit(ctx, client, rest, stdin, out)
	case "get":
		err = get(ctx, client, rest, out)
	case "watch":
		var task *taskv1.Task
		task, err = watch(ctx, client, rest, out)
		if err == nil && task.GetStatus() != commonv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			return exitTaskFailed
		}
	case "cells":
		err = cells(ctx, client, rest, out)
	default:
		err = usageError{fmt.Sprintf("unknown command %q", command)}
	}
	return report(err, stderr)
}

// report prints err (nil: nothing) and answers the exit code it means.
func report(err error, stderr io.Writer) int {
	var bad usageError
	var refused *dispo.Error
	switch {
	case err == nil:
		return exitDone
	case errors.As(err, &bad):
		fmt.Fprintf(stderr, "dispo-go: %s\n\n%s", bad.message, usage)
		return exitUsage
	case errors.As(err, &refused):
		violations := refused.Violations
		if violations == nil {
			violations = []dispo.Violation{}
		}
		encoded, _ := json.Marshal(map[string]any{
			"code":       dispo.CodeName(refused.Code),
			"message":    refused.Message,
			"violations": violations,
		})
		fmt.Fprintln(stderr, string(encoded))
		if refused.Code == codes.Unavailable || refused.Code == codes.DeadlineExceeded {
			return exitUnreachable
		}
		return exitRefused
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintln(stderr, "dispo-go:", err)
		return exitUnreachable
	default:
		fmt.Fprintln(stderr, "dispo-go:", err)
		return exitUsage
	}
}

func defaultAddress() string {
	host, port := os.Getenv("DISPO_GATEWAY_HOST"), os.Getenv("DISPO_GATEWAY_PORT")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "50051"
	}
	return host + ":" + port
}

// printer writes messages as JSON, field names as in the protos, every field present.
type printer struct{ w io.Writer }

var asJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func (p printer) print(message proto.Message) error {
	encoded, err := asJSON.Marshal(message)
	if err != nil {
		return err
	}
	// protojson's spacing is not stable on purpose: one compact line each.
	var line bytes.Buffer
	if err := json.Compact(&line, encoded); err != nil {
		return err
	}
	line.WriteByte('\n')
	_, err = p.w.Write(line.Bytes())
	return err
}

// oneArgument is the single positional argument of a command, e.g. its task id.
func oneArgument(command string, args []string) (string, error) {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		return "", usageError{command + " takes one TASK_ID"}
	}
	return args[0], nil
}

func submit(ctx context.Context, client *dispo.Client, args []string, stdin io.Reader, out printer) error {
	flags := flag.NewFlagSet("submit", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	data := flags.String("d", "", "the request: JSON, @file, or @- for standard input")
	if err := flags.Parse(args); err != nil {
		return usageError{"submit: " + err.Error()}
	}
	if *data == "" || flags.NArg() != 0 {
		return usageError{"submit takes -d REQUEST"}
	}
	raw := []byte(*data)
	var err error
	switch {
	case *data == "@-":
		raw, err = io.ReadAll(stdin)
	case strings.HasPrefix(*data, "@"):
		raw, err = os.ReadFile((*data)[1:])
	}
	if err != nil {
		return usageError{"submit: " + err.Error()}
	}
	request, err := decodeRequest(raw)
	if err != nil {
		return usageError{"submit: the request: " + err.Error()}
	}
	reply, err := client.Submit(ctx, request)
	if err != nil {
		return err
	}
	return out.print(reply)
}

// decodeRequest reads a request, its payloads kept exactly as written.
func decodeRequest(raw []byte) (dispo.Request, error) {
	var request struct {
		dispo.Request
		Cells []struct {
			dispo.Cell
			Payload json.RawMessage `json:"payload"`
		} `json:"cells"`
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&request); err != nil {
		return dispo.Request{}, err
	}
	out := request.Request
	out.Cells = nil
	for _, cell := range request.Cells {
		if cell.Payload != nil {
			cell.Cell.Payload = cell.Payload
		}
		out.Cells = append(out.Cells, cell.Cell)
	}
	return out, nil
}

func get(ctx context.Context, client *dispo.Client, args []string, out printer) error {
	taskID, err := oneArgument("get", args)
	if err != nil {
		return err
	}
	reply, err := client.GetTask(ctx, taskID)
	if err != nil {
		return err
	}
	return out.print(reply)
}

func watch(ctx context.Context, client *dispo.Client, args []string, out printer) (*taskv1.Task, error) {
	taskID, err := oneArgument("watch", args)
	if err != nil {
		return nil, err
	}
	var failed error
	task, err := client.WatchTask(ctx, taskID, func(task *taskv1.Task) {
		if failed == nil {
			failed = out.print(task)
		}
	})
	if err != nil {
		return nil, err
	}
	return task, failed
}

func cells(ctx context.Context, client *dispo.Client, args []string, out printer) error {
	if len(args) != 0 {
		return usageError{"cells takes no argument"}
	}
	listed, err := client.ListCells(ctx)
	if err != nil {
		return err
	}
	return out.print(&gatewayv1.ListCellsResponse{Cells: listed})
}

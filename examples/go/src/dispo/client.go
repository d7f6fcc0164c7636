package dispo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	commonv1 "dispo/gen/common/v1"
	gatewayv1 "dispo/gen/gateway/v1"
	taskv1 "dispo/gen/task/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// A Client calls the gateway: tasks and the catalogue. It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn
	gateway gatewayv1.GatewayServiceClient
}

// NewClient dials the gateway at address ("127.0.0.1:50051" for `dispo up`).
func NewClient(address string, opts ...Option) (*Client, error) {
	conn, err := Dial(address, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, gateway: gatewayv1.NewGatewayServiceClient(conn)}, nil
}

// Close closes the client's channel.
func (c *Client) Close() error { return c.conn.Close() }

// Gateway is the generated client of GatewayService on the same channel, for the calls this
// package does not wrap (ListTasks, CancelTask, SubmitEach ...).
func (c *Client) Gateway() gatewayv1.GatewayServiceClient { return c.gateway }

// A Cell is one cell of a submission.
type Cell struct {
	// Cell is the catalogue's name, e.g. "update_quality_level".
	Cell string `json:"cell"`
	// Ref names the cell within the submission (default: its name); DependsOn names refs.
	Ref string `json:"ref,omitempty"`
	// Payload is the cell's payload, sent as the JSON encoding/json makes of it (a
	// json.RawMessage or json.Number is sent as written: integers of any size stay integers).
	Payload any `json:"payload,omitempty"`
	// DependsOn are the refs of the cells that must succeed before this one starts.
	DependsOn []string `json:"depends_on,omitempty"`
}

// A Request is a task to submit: the cells one business wants done, with their order.
type Request struct {
	Business string `json:"business"`
	// IdempotencyKey: the same key (per business) is the same task, answered with
	// duplicate = true, so a caller that lost an answer submits again with the same key.
	// At most 128 characters; empty: no de-duplication.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// CallbackURL is where the task's end is notified (an allowed http(s) URL or nats:…).
	CallbackURL string `json:"callback_url,omitempty"`
	Cells       []Cell `json:"cells"`
}

func (r Request) proto() (*gatewayv1.SubmitRequest, error) {
	out := &gatewayv1.SubmitRequest{
		Business:       r.Business,
		IdempotencyKey: r.IdempotencyKey,
		CallbackUrl:    r.CallbackURL,
	}
	for i, cell := range r.Cells {
		payload := []byte("{}")
		if cell.Payload != nil {
			encoded, err := json.Marshal(cell.Payload)
			if err != nil {
				return nil, fmt.Errorf("cells[%d].payload: %w", i, err)
			}
			payload = encoded
		}
		out.Cells = append(out.Cells, &gatewayv1.CellRequest{
			Cell:      cell.Cell,
			Ref:       cell.Ref,
			Body:      &gatewayv1.CellRequest_PayloadJson{PayloadJson: payload},
			DependsOn: cell.DependsOn,
		})
	}
	return out, nil
}

// Submit records the task durably and answers its id; a repeated idempotency key answers
// the first submission's task with Duplicate set. Bad input is an *Error with code
// INVALID_ARGUMENT naming the fields, and nothing is recorded.
func (c *Client) Submit(ctx context.Context, request Request) (*gatewayv1.SubmitResponse, error) {
	message, err := request.proto()
	if err != nil {
		return nil, err
	}
	reply, err := c.gateway.Submit(ctx, message)
	return reply, fromRPC(err)
}

// GetTask reads the task now: every node, and when it ended.
func (c *Client) GetTask(ctx context.Context, taskID string) (*gatewayv1.GetTaskResponse, error) {
	reply, err := c.gateway.GetTask(ctx, &gatewayv1.GetTaskRequest{TaskId: taskID})
	return reply, fromRPC(err)
}

// ListCells is the catalogue: every cell, sorted by name.
func (c *Client) ListCells(ctx context.Context) ([]*gatewayv1.Cell, error) {
	reply, err := c.gateway.ListCells(ctx, &gatewayv1.ListCellsRequest{})
	return reply.GetCells(), fromRPC(err)
}

// Terminal tells whether a task in this status is done for good: SUCCEEDED, FAILED or
// CANCELLED. (RETRY_EXHAUSTED and DEMOTED wait for the reconciler.)
func Terminal(s commonv1.TaskStatus) bool {
	switch s {
	case commonv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		commonv1.TaskStatus_TASK_STATUS_FAILED,
		commonv1.TaskStatus_TASK_STATUS_CANCELLED:
		return true
	}
	return false
}

// reconnectDelay is how long WatchTask waits before watching again after a broken stream.
const reconnectDelay = 200 * time.Millisecond

// WatchTask follows the task until it is terminal and returns it then. onChange, when not
// nil, sees the task now and at every change. A stream that breaks (UNAVAILABLE, or ended
// before the task did) is opened again, so the same change may be seen twice; ctx bounds
// the whole watch.
func (c *Client) WatchTask(ctx context.Context, taskID string, onChange func(*taskv1.Task)) (*taskv1.Task, error) {
	for {
		last, err := c.watchOnce(ctx, taskID, onChange)
		if err == nil && Terminal(last.GetStatus()) {
			return last, nil
		}
		if err != nil && CodeOf(err) != codes.Unavailable {
			return last, err
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(reconnectDelay):
		}
	}
}

func (c *Client) watchOnce(ctx context.Context, taskID string, onChange func(*taskv1.Task)) (*taskv1.Task, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a terminal task ends the stream here, whatever the server does
	stream, err := c.gateway.WatchTask(ctx, &gatewayv1.WatchTaskRequest{TaskId: taskID})
	if err != nil {
		return nil, fromRPC(err)
	}
	var last *taskv1.Task
	for {
		reply, err := stream.Recv()
		if err == io.EOF {
			return last, nil
		}
		if err != nil {
			return last, fromRPC(err)
		}
		last = reply.GetTask()
		if onChange != nil {
			onChange(last)
		}
		if Terminal(last.GetStatus()) {
			return last, nil
		}
	}
}

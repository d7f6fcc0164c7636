package dispo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"time"

	commonv1 "dispo/gen/common/v1"
	executorv1 "dispo/gen/executor/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// How long one PollRuns waits for a run, and the pause after a call that failed.
const (
	pollWait   = 10 * time.Second
	retryPause = time.Second
)

// A Run is one node run of a worker action, handed to its queue's handler.
type Run struct {
	TaskID string
	NodeID string
	Action string
	Queue  string
	// IdempotencyKey is the node's stable key, the same on every attempt: deduplicate the
	// run's effect by it.
	IdempotencyKey string
	Attempt        int
	// Deadline is when the run is given up (an outcome after it is not recorded); the
	// handler's context ends then too. Zero when the executor sent none.
	Deadline time.Time
	// Payload is the cell's payload, its references to upstream outputs resolved (JSON);
	// none for a probe run.
	Payload json.RawMessage
	// Probe marks a probe run (handed to the queue's ProbeFunc): not the action's call but
	// the question whether the effect of Attempt under IdempotencyKey happened.
	Probe bool
}

// Decode reads the payload into v, as json.Unmarshal does.
func (r *Run) Decode(v any) error { return json.Unmarshal(r.Payload, v) }

// A HandlerFunc runs one run. The value it returns is the node's output, as the JSON
// encoding/json makes of it (nil: no output; a json.RawMessage goes as written). An error
// fails the node for good, unless it is wrapped by Retryable. Its context ends when the
// worker no longer holds the run (its lease was lost, or the worker's grace ran out): the
// handler should return then, and what it returns is not sent.
type HandlerFunc func(ctx context.Context, run *Run) (any, error)

// A ProbeAnswer is what a probe handler says of the effect it is asked about (ADR-0100).
type ProbeAnswer struct {
	// Done: the effect happened; the node is SUCCEEDED with Output and never run again.
	Done bool
	// Fenced, with Done false: the handler made sure the effect never happens under this
	// key up to the attempt asked about, so the node runs again at once. Without it, "not
	// done" is final only once the action's max_effect_seconds have passed.
	Fenced bool
	// Output, with Done: the effect's output, the node's (encoded as a handler's; nil: none).
	Output any
}

// A ProbeFunc answers a probe run: whether the effect of run.Attempt under
// run.IdempotencyKey happened. An error is no answer: the node is asked about again later
// (after the reconciler's probe limit, an operator decides).
type ProbeFunc func(ctx context.Context, run *Run) (ProbeAnswer, error)

// A RetryableError is a failure after which the run had no effect and may be tried again.
type RetryableError struct{ Err error }

func (e *RetryableError) Error() string { return e.Err.Error() }
func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable marks err as retryable: the run had no effect, and the executor tries it
// again after a backoff (as for an http 503). Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &RetryableError{Err: err}
}

// IsRetryable tells whether err, or an error it wraps, was made by Retryable.
func IsRetryable(err error) bool {
	var retryable *RetryableError
	return errors.As(err, &retryable)
}

// A Worker serves the queues of worker actions (docs/workers.md): it long-polls an
// executor for runs of the queues it has handlers for, with its free credit (Concurrency
// minus the runs it holds), heartbeats the runs it holds every third of their lease, and
// completes each with its handler's outcome: the outcomes of the runs that end while a
// CompleteRuns call is on its way go together in the next one (one CompleteRun each
// against an executor without it). Set its fields before Run.
type Worker struct {
	// Concurrency is how many runs it handles at once at most (default 10).
	Concurrency int
	// Grace is how long the runs in flight may take to finish once Run's context ends,
	// before they are handed back (default 30 s).
	Grace time.Duration
	// ID names the worker to the executor, unique among live workers (default
	// "<host>:<pid>:<random>").
	ID string
	// Logger receives a line per notable event (default: standard error).
	Logger *log.Logger

	conn     *grpc.ClientConn
	stub     executorv1.WorkerServiceClient
	handlers map[string]HandlerFunc
	// completions sends the runs' outcomes: those ending together in one CompleteRuns.
	completions *completions
	probes      map[string]ProbeFunc

	mu    sync.Mutex
	held  map[string]*heldRun
	lease time.Duration
	// free: a run ended (credit to poll with); leaseChanged: a poll told another lease.
	free         chan struct{}
	leaseChanged chan struct{}
	// wg: the handlers running; sending: the outcomes being sent.
	wg      sync.WaitGroup
	sending sync.WaitGroup
}

// heldRun is a run the worker holds; mu guards its flags.
type heldRun struct {
	token  string
	run    *Run
	cancel context.CancelFunc
	// gone: not held any more (lease lost, or handed back): never completed.
	gone bool
	// completing: its handler returned and its outcome is being sent.
	completing bool
}

// NewWorker dials the executor at address ("127.0.0.1:50052" for `dispo up`; any replica)
// with the options Dial takes.
func NewWorker(address string, opts ...Option) (*Worker, error) {
	conn, err := Dial(address, opts...)
	if err != nil {
		return nil, err
	}
	stub := executorv1.NewWorkerServiceClient(conn)
	return &Worker{
		conn:        conn,
		stub:        stub,
		handlers:    map[string]HandlerFunc{},
		probes:      map[string]ProbeFunc{},
		completions: &completions{stub: stub},
	}, nil
}

// Close closes the worker's channel.
func (w *Worker) Close() error { return w.conn.Close() }

// Handle registers handler for the runs of queue (the catalogue action's `queue`). It
// panics when the queue has a handler already.
func (w *Worker) Handle(queue string, handler HandlerFunc) {
	if _, taken := w.handlers[queue]; taken {
		panic(fmt.Sprintf("dispo: queue %q already has a handler", queue))
	}
	w.handlers[queue] = handler
}

// Probe registers probe for the probe runs of queue (ADR-0100): when a non-idempotent
// action's run ended with its outcome unknown (its worker vanished mid-run), the reconciler
// asks the queue's workers whether its effect happened, so the node is settled without an
// operator. It panics when the queue has a probe handler already.
func (w *Worker) Probe(queue string, probe ProbeFunc) {
	if _, taken := w.probes[queue]; taken {
		panic(fmt.Sprintf("dispo: queue %q already has a probe handler", queue))
	}
	w.probes[queue] = probe
}

// Run polls and runs until ctx ends (e.g. signal.NotifyContext on SIGTERM), then stops
// taking runs, lets the runs in flight finish within Grace, and hands back the rest
// (ReleaseRuns): an idempotent action's run is offered again at once.
func (w *Worker) Run(ctx context.Context) error {
	if len(w.handlers) == 0 && len(w.probes) == 0 {
		return errors.New("dispo: no handler registered: use Handle(queue, handler)")
	}
	if w.Concurrency < 1 {
		w.Concurrency = 10
	}
	if w.Grace <= 0 {
		w.Grace = 30 * time.Second
	}
	if w.ID == "" {
		w.ID = defaultWorkerID()
	}
	if w.Logger == nil {
		w.Logger = log.New(os.Stderr, "", log.LstdFlags)
	}
	w.held = map[string]*heldRun{}
	w.lease = 10 * time.Second
	w.free = make(chan struct{}, 1)
	w.leaseChanged = make(chan struct{}, 1)

	queues, probes := sortedKeys(w.handlers), sortedKeys(w.probes)
	w.Logger.Printf("worker %s started: queues %v, probes %v", w.ID, queues, probes)

	// Runs are handled, heartbeaten and completed under their own contexts: ctx ending
	// stops the polling, not the runs in flight.
	beating, stopBeating := context.WithCancel(context.Background())
	beaten := make(chan struct{})
	go func() {
		defer close(beaten)
		w.heartbeat(beating)
	}()
	w.poll(ctx, queues, probes)
	w.drain()
	stopBeating()
	<-beaten
	w.Logger.Printf("worker %s stopped", w.ID)
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

func defaultWorkerID() string {
	host, _ := os.Hostname()
	random := make([]byte, 4)
	_, _ = rand.Read(random)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(random))
}

// credit is how many more runs the worker may take.
func (w *Worker) credit() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.Concurrency - len(w.held)
}

func (w *Worker) poll(ctx context.Context, queues, probes []string) {
	for ctx.Err() == nil {
		credit := w.credit()
		if credit <= 0 {
			select {
			case <-ctx.Done():
			case <-w.free:
			}
			continue
		}
		if credit > 100 {
			credit = 100
		}
		call, cancel := context.WithTimeout(ctx, pollWait+10*time.Second)
		reply, err := w.stub.PollRuns(call, &executorv1.PollRunsRequest{
			Queues:      queues,
			ProbeQueues: probes,
			WorkerId:    w.ID,
			MaxRuns:     int32(credit),
			WaitMs:      int32(pollWait / time.Millisecond),
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // stopping: the poll was cut short
			}
			w.Logger.Printf("poll failed; again shortly: %v", fromRPC(err))
			select {
			case <-ctx.Done():
			case <-time.After(retryPause):
			}
			continue
		}
		if lease := time.Duration(reply.GetLeaseMs()) * time.Millisecond; lease > 0 {
			w.mu.Lock()
			changed := lease != w.lease
			w.lease = lease
			w.mu.Unlock()
			if changed { // the heartbeat's pace follows at once
				select {
				case w.leaseChanged <- struct{}{}:
				default:
				}
			}
		}
		for _, run := range reply.GetRuns() {
			w.start(run)
		}
	}
}

func (w *Worker) start(message *executorv1.Run) {
	run := &Run{
		TaskID:         message.GetTaskId(),
		NodeID:         message.GetNodeId(),
		Action:         message.GetAction(),
		Queue:          message.GetQueue(),
		IdempotencyKey: message.GetIdempotencyKey(),
		Attempt:        int(message.GetAttempt()),
		Payload:        json.RawMessage(message.GetPayload().GetData()),
		Probe:          message.GetProbe(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	if message.GetDeadline() != nil {
		run.Deadline = message.GetDeadline().AsTime()
		ctx, cancel = context.WithDeadline(context.Background(), run.Deadline)
	}
	h := &heldRun{token: message.GetRunToken(), run: run, cancel: cancel}
	w.mu.Lock()
	w.held[h.token] = h
	w.mu.Unlock()
	w.wg.Add(1)
	go w.handle(ctx, h)
}

func (w *Worker) handle(ctx context.Context, h *heldRun) {
	defer w.wg.Done()
	defer w.forget(h)
	request := &executorv1.CompleteRunRequest{RunToken: h.token}
	handler, ok := w.handlers[h.run.Queue]
	if h.run.Probe {
		w.probe(ctx, request, h.run)
	} else if !ok {
		request.Result = &executorv1.CompleteRunRequest_NotSent{
			NotSent: fmt.Sprintf("this worker serves no queue %q", h.run.Queue),
		}
	} else {
		value, err := call(ctx, handler, h.run)
		setOutcome(request, value, err)
		if err != nil && !IsRetryable(err) && ctx.Err() == nil {
			w.Logger.Printf("action failed: node %s of task %s: %v", h.run.NodeID, h.run.TaskID, err)
		}
	}
	w.mu.Lock()
	if h.gone {
		w.mu.Unlock()
		return // never completed: the run is not held any more
	}
	h.completing = true
	w.sending.Add(1)
	w.mu.Unlock()
	defer w.sending.Done()
	w.complete(request, h.run)
}

// probe sets a probe run's answer: the queue's probe handler's, else no answer.
func (w *Worker) probe(ctx context.Context, request *executorv1.CompleteRunRequest, run *Run) {
	probe, ok := w.probes[run.Queue]
	if !ok {
		request.Result = &executorv1.CompleteRunRequest_NotSent{
			NotSent: fmt.Sprintf("this worker answers no probe of queue %q", run.Queue),
		}
		return
	}
	answer, err := callProbe(ctx, probe, run)
	if err != nil {
		if ctx.Err() == nil {
			w.Logger.Printf("probe failed: node %s of task %s: %v", run.NodeID, run.TaskID, err)
		}
		request.Result = &executorv1.CompleteRunRequest_Error{
			Error: &executorv1.RunFailure{Message: err.Error()},
		}
		return
	}
	result := &executorv1.ProbeResult{Done: answer.Done, Fenced: answer.Fenced && !answer.Done}
	if answer.Done && answer.Output != nil {
		output, err := jsonOutput(answer.Output)
		if err != nil {
			request.Result = &executorv1.CompleteRunRequest_Error{
				Error: &executorv1.RunFailure{Message: err.Error()},
			}
			return
		}
		result.Output = output
	}
	request.Result = &executorv1.CompleteRunRequest_Probe{Probe: result}
}

// callProbe runs the probe handler, a panic turned into an error.
func callProbe(ctx context.Context, probe ProbeFunc, run *Run) (answer ProbeAnswer, err error) {
	defer func() {
		if p := recover(); p != nil {
			answer, err = ProbeAnswer{}, fmt.Errorf("panic: %v", p)
		}
	}()
	return probe(ctx, run)
}

// call runs the handler, a panic turned into an error.
func call(ctx context.Context, handler HandlerFunc, run *Run) (value any, err error) {
	defer func() {
		if p := recover(); p != nil {
			value, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return handler(ctx, run)
}

// setOutcome sets what a handler's return is sent as.
func setOutcome(request *executorv1.CompleteRunRequest, value any, err error) {
	if err != nil {
		message := err.Error()
		if message == "" {
			message = fmt.Sprintf("%T", err)
		}
		request.Result = &executorv1.CompleteRunRequest_Error{
			Error: &executorv1.RunFailure{Message: message, Retryable: IsRetryable(err)},
		}
		return
	}
	output, err := jsonOutput(value)
	if err != nil {
		setOutcome(request, nil, err)
		return
	}
	request.Result = &executorv1.CompleteRunRequest_Output{Output: output}
}

// jsonOutput is value as an output: its JSON (nil: empty, no output).
func jsonOutput(value any) (*commonv1.Payload, error) {
	data := []byte{}
	if value != nil {
		encoded, err := json.Marshal(value)
		if err != nil {
			return nil, fmt.Errorf("the output is no JSON: %w", err)
		}
		data = encoded
	}
	return &commonv1.Payload{
		Metadata: map[string][]byte{"encoding": []byte("json/plain")},
		Data:     data,
	}, nil
}

// forget drops a run whose handler returned, freeing its credit.
func (w *Worker) forget(h *heldRun) {
	h.cancel()
	w.mu.Lock()
	if w.held[h.token] == h {
		delete(w.held, h.token)
	}
	w.mu.Unlock()
	select {
	case w.free <- struct{}{}:
	default:
	}
}

// complete sends a run's outcome, with the outcomes of the runs ending meanwhile (see
// completions); an UNAVAILABLE executor is tried a few times.
func (w *Worker) complete(request *executorv1.CompleteRunRequest, run *Run) {
	for try := 0; try < 5; try++ {
		result, err := w.completions.submit(request)
		switch CodeOf(err) {
		case codes.OK:
			if !result.GetRecorded() {
				w.Logger.Printf("completion refused: the run's lease was lost: node %s of task %s: %s", run.NodeID, run.TaskID, result.GetDetail())
			}
			return
		case codes.Unavailable:
			time.Sleep(retryPause)
		default:
			w.Logger.Printf("completion refused: node %s of task %s: %v", run.NodeID, run.TaskID, fromRPC(err))
			return
		}
	}
}

// heartbeat extends the leases of the runs held every third of the lease, until ctx
// ends; a run not held any more has its context cancelled and is never completed.
func (w *Worker) heartbeat(ctx context.Context) {
	for {
		w.mu.Lock()
		every := w.lease / 3
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-w.leaseChanged:
			continue
		case <-time.After(every):
		}
		w.mu.Lock()
		var held []*heldRun
		var tokens []string
		for _, h := range w.held {
			if !h.gone {
				held = append(held, h)
				tokens = append(tokens, h.token)
			}
		}
		w.mu.Unlock()
		if len(held) == 0 {
			continue
		}
		call, cancel := context.WithTimeout(ctx, every)
		reply, err := w.stub.HeartbeatRuns(call, &executorv1.HeartbeatRunsRequest{WorkerId: w.ID, RunTokens: tokens})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.Logger.Printf("heartbeat failed: %v", fromRPC(err))
			}
			continue
		}
		for i, lease := range reply.GetLeases() {
			if i >= len(held) || lease.GetHeld() {
				continue
			}
			h := held[i]
			w.mu.Lock()
			lost := !h.completing && !h.gone
			h.gone = true
			w.mu.Unlock()
			if lost {
				w.Logger.Printf("run lease lost; its handler is cancelled: node %s of task %s", h.run.NodeID, h.run.TaskID)
				h.cancel()
			}
		}
	}
}

// drain lets the runs in flight finish within the grace, then hands back the rest.
func (w *Worker) drain() {
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(w.Grace):
	}
	w.mu.Lock()
	var left []*heldRun
	var tokens []string
	for _, h := range w.held {
		if !h.gone && !h.completing {
			h.gone = true
			left = append(left, h)
			tokens = append(tokens, h.token)
		}
	}
	w.mu.Unlock()
	for _, h := range left {
		h.cancel()
	}
	if len(tokens) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		reply, err := w.stub.ReleaseRuns(ctx, &executorv1.ReleaseRunsRequest{WorkerId: w.ID, RunTokens: tokens})
		cancel()
		if err != nil {
			w.Logger.Printf("runs not handed back: %v", fromRPC(err))
		} else {
			w.Logger.Printf("runs handed back: %d", reply.GetReleased())
		}
	}
	// The outcomes being sent go out; a handler that ignores its context is not waited for.
	w.sending.Wait()
}

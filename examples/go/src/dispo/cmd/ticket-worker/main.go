// Command ticket-worker serves a queue of worker actions from Go (docs/workers.md): each run
// opens a review ticket in a tracker and answers its number as the node's output.
//
//	ticket-worker [-executor host:port] [-queue tickets] [-concurrency 10] [-grace 30s] -tracker FILE
//
// The tracker is a file here, one line per ticket opened: "<idempotency key> <attempt>
// <pid>" (a real tracker would take the idempotency key as its own, so that a run done
// twice opens one ticket). The output is {"ticket_id": "T-<name>", "key": <idempotency
// key>}. For trying the worker out, the payload may ask for more than a name:
//
//	{"name": "n1", "busy": 1}         the tracker is busy the first time: Retryable, tried again
//	{"name": "n1", "work_ms": 5000}   opening the ticket takes 5 s
//	{"name": "n1", "refuse": "why"}   the tracker refuses: the node fails for good
//
// The token is DISPO_TOKEN; TLS follows DISPO_TLS_CA_FILE (as dispo-go). SIGTERM or SIGINT:
// no new runs; the runs in flight get the grace to finish, and what is left is handed back.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"dispo"
)

type ticketRequest struct {
	Name   string `json:"name"`
	Busy   int    `json:"busy"`
	WorkMs int    `json:"work_ms"`
	Refuse string `json:"refuse"`
}

// A tracker opens tickets in its file; busy counts the runs it answered busy, by key.
type tracker struct {
	file string
	mu   sync.Mutex
	busy map[string]int
}

func main() {
	executor := flag.String("executor", "127.0.0.1:50052", "an executor's host:port")
	queue := flag.String("queue", "tickets", "the queue served")
	concurrency := flag.Int("concurrency", 10, "runs handled at once at most")
	grace := flag.Duration("grace", 30*time.Second, "how long runs in flight may finish after SIGTERM")
	file := flag.String("tracker", "", "the file tickets are opened in")
	flag.Parse()
	if *file == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}

	worker, err := dispo.NewWorker(*executor, dispo.FromEnvironment())
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	worker.Concurrency = *concurrency
	worker.Grace = *grace
	tickets := &tracker{file: *file, busy: map[string]int{}}
	worker.Handle(*queue, tickets.open)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := worker.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// open is the queue's handler: the ticket's number is the node's output.
func (t *tracker) open(ctx context.Context, run *dispo.Run) (any, error) {
	var request ticketRequest
	if err := run.Decode(&request); err != nil {
		return nil, err
	}
	log.Printf("run started: node %s of task %s, attempt %d", run.NodeID, run.TaskID, run.Attempt)
	if t.busyFor(run.IdempotencyKey, request.Busy) {
		return nil, dispo.Retryable(errors.New("the tracker is busy"))
	}
	if request.Refuse != "" {
		return nil, fmt.Errorf("the tracker refused the ticket: %s", request.Refuse)
	}
	select {
	case <-time.After(time.Duration(request.WorkMs) * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err() // the run is not held any more: nothing done
	}
	if err := t.record(fmt.Sprintf("%s %d %d\n", run.IdempotencyKey, run.Attempt, os.Getpid())); err != nil {
		return nil, err
	}
	return map[string]string{"ticket_id": "T-" + request.Name, "key": run.IdempotencyKey}, nil
}

// busyFor tells whether the tracker is busy for this run of the ticket: the first times
// of it asked for.
func (t *tracker) busyFor(key string, times int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy[key] >= times {
		return false
	}
	t.busy[key]++
	return true
}

// record appends line to the tracker's file, durably.
func (t *tracker) record(line string) error {
	file, err := os.OpenFile(t.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, err := file.WriteString(line); err != nil {
		return err
	}
	return file.Sync()
}

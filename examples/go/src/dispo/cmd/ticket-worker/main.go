// Command ticket-worker serves a queue of worker actions from Go (docs/workers.md): each run
// opens a review ticket in a tracker and answers its number as the node's output; it also
// answers the queue's probes by looking for the ticket under the idempotency key.
//
//	ticket-worker [-executor host:port] [-queue tickets] [-concurrency 10] [-grace 30s] -tracker FILE
//
// The tracker is a file here, one line per ticket opened: "<idempotency key> <attempt>
// <pid> <ticket id>" (a real tracker would take the idempotency key as its own, so that a
// run done twice opens one ticket). The output is {"ticket_id": "T-<name>", "key":
// <idempotency key>}. For trying the worker out, the payload may ask for more than a name:
//
//	{"name": "n1", "busy": 1}          the tracker is busy the first time: Retryable, tried again
//	{"name": "n1", "work_ms": 5000}    opening the ticket takes 5 s
//	{"name": "n1", "refuse": "why"}    the tracker refuses: the node fails for good
//	{"name": "n1", "answer_ms": 5000}  the answer takes 5 s once the ticket is opened
//
// A probe (whether the run of a key that ended unknown opened its ticket) finds the ticket
// in the tracker: done, with the ticket as the output ({"ticket_id", "key", "found_by":
// <pid>}). None found: the key is fenced up to the attempt asked about (a line "<key>
// <attempt>" in FILE.fences; a run of a fenced attempt opens nothing) and the answer is
// "not done, fenced", so the node runs again at once.
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
	"strconv"
	"strings"
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
	// AnswerMs: how long the answer takes once the ticket is opened.
	AnswerMs int `json:"answer_ms"`
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
	worker.Probe(*queue, tickets.find)

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
	ticket := "T-" + request.Name
	t.mu.Lock()
	fenced, err := t.fenced(run.IdempotencyKey, run.Attempt)
	if err == nil && !fenced {
		err = appendLine(t.file, fmt.Sprintf("%s %d %d %s\n", run.IdempotencyKey, run.Attempt, os.Getpid(), ticket))
	}
	t.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fenced {
		return nil, fmt.Errorf("the tracker refuses key %s at attempt %d: fenced", run.IdempotencyKey, run.Attempt)
	}
	select {
	case <-time.After(time.Duration(request.AnswerMs) * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err() // the ticket is opened, but the run is not held any more
	}
	return map[string]string{"ticket_id": ticket, "key": run.IdempotencyKey}, nil
}

// find is the queue's probe handler: whether the run of the key asked about opened its
// ticket. Not found: the key is fenced up to that attempt first, so "not done" is final.
func (t *tracker) find(ctx context.Context, run *dispo.Run) (dispo.ProbeAnswer, error) {
	log.Printf("probe: node %s of task %s, attempt %d", run.NodeID, run.TaskID, run.Attempt)
	t.mu.Lock()
	defer t.mu.Unlock()
	lines, err := readLines(t.file)
	if err != nil {
		return dispo.ProbeAnswer{}, err
	}
	for _, line := range lines {
		if fields := strings.Fields(line); len(fields) == 4 && fields[0] == run.IdempotencyKey {
			return dispo.ProbeAnswer{Done: true, Output: map[string]any{
				"ticket_id": fields[3], "key": run.IdempotencyKey, "found_by": os.Getpid(),
			}}, nil
		}
	}
	if err := appendLine(t.file+".fences", fmt.Sprintf("%s %d\n", run.IdempotencyKey, run.Attempt)); err != nil {
		return dispo.ProbeAnswer{}, err
	}
	return dispo.ProbeAnswer{Done: false, Fenced: true}, nil
}

// fenced tells whether the tracker refuses key at attempt: a probe fenced it up to that
// attempt or a later one.
func (t *tracker) fenced(key string, attempt int) (bool, error) {
	lines, err := readLines(t.file + ".fences")
	if err != nil {
		return false, err
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		if len(fields) != 2 || fields[0] != key {
			continue
		}
		if upTo, err := strconv.Atoi(fields[1]); err == nil && attempt <= upTo {
			return true, nil
		}
	}
	return false, nil
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

// readLines is the lines of a file (none when it does not exist).
func readLines(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(data), "\n"), "\n"), nil
}

// appendLine appends line to a file, durably.
func appendLine(name, line string) error {
	file, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, err := file.WriteString(line); err != nil {
		return err
	}
	return file.Sync()
}

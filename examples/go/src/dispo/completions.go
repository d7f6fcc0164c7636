package dispo

import (
	"context"
	"fmt"
	"sync"
	"time"

	executorv1 "dispo/gen/executor/v1"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// One CompleteRuns carries at most this many runs, and at most about this many bytes of
// outcomes (far below the executor's message limit; a larger outcome goes alone).
const (
	completeMaxRuns  = 100
	completeMaxBytes = 1 << 20
	completeTimeout  = 10 * time.Second
)

// completions sends the outcomes of a worker's runs, as the Python SDK's worker does
// (ADR-0107): a run that ends while no call is on its way is sent at once; those that end
// while one is go together in the next CompleteRuns, each recorded or refused on its own.
// One call on its way at a time. An executor that answers CompleteRuns UNIMPLEMENTED (one
// from before) gets one CompleteRun per run from then on; an INVALID_ARGUMENT for a call of
// several sends them one by one, so that only the malformed one is refused.
type completions struct {
	stub executorv1.WorkerServiceClient

	mu      sync.Mutex
	waiting []*completing
	sending bool
	// single: the executor answered CompleteRuns UNIMPLEMENTED; a CompleteRun per run.
	single bool
}

// completing is one outcome waiting for its fate.
type completing struct {
	request *executorv1.CompleteRunRequest
	done    chan completed
}

// completed is what became of one outcome: its RunCompletion (recorded, or refused with
// the reason), or the call's error.
type completed struct {
	result *executorv1.RunCompletion
	err    error
}

// submit sends request with the outcomes waiting beside it and returns its fate.
func (c *completions) submit(request *executorv1.CompleteRunRequest) (*executorv1.RunCompletion, error) {
	me := &completing{request: request, done: make(chan completed, 1)}
	c.mu.Lock()
	c.waiting = append(c.waiting, me)
	if !c.sending {
		c.sending = true
		go c.flush()
	}
	c.mu.Unlock()
	answer := <-me.done
	return answer.result, answer.err
}

// flush sends what is waiting, at most completeMaxRuns a call, until nothing is.
func (c *completions) flush() {
	for {
		c.mu.Lock()
		if len(c.waiting) == 0 {
			c.sending = false
			c.mu.Unlock()
			return
		}
		n := len(c.waiting)
		if n > completeMaxRuns {
			n = completeMaxRuns
		}
		taken := append([]*completing(nil), c.waiting[:n]...)
		c.waiting = c.waiting[n:]
		c.mu.Unlock()
		for _, call := range completionCalls(taken, completeMaxBytes) {
			c.send(call)
		}
	}
}

// completionCalls cuts the outcomes, in order, into calls of at most maxBytes each (one
// larger than that alone in its call).
func completionCalls(taken []*completing, maxBytes int) [][]*completing {
	var calls [][]*completing
	size := 0
	for _, one := range taken {
		n := proto.Size(one.request)
		if len(calls) == 0 || size+n > maxBytes {
			calls = append(calls, nil)
			size = 0
		}
		calls[len(calls)-1] = append(calls[len(calls)-1], one)
		size += n
	}
	return calls
}

// send makes one CompleteRuns of call (or a CompleteRun each) and answers each outcome.
func (c *completions) send(call []*completing) {
	c.mu.Lock()
	single := c.single
	c.mu.Unlock()
	if !single {
		requests := make([]*executorv1.CompleteRunRequest, len(call))
		for i, one := range call {
			requests[i] = one.request
		}
		ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
		reply, err := c.stub.CompleteRuns(ctx, &executorv1.CompleteRunsRequest{Completions: requests})
		cancel()
		switch code := CodeOf(err); {
		case code == codes.OK:
			results := reply.GetResults()
			if len(results) != len(call) {
				err = fmt.Errorf("CompleteRuns answered %d results for %d completions", len(results), len(call))
				for _, one := range call {
					one.done <- completed{err: err}
				}
				return
			}
			for i, one := range call {
				one.done <- completed{result: results[i]}
			}
			return
		case code == codes.Unimplemented: // an executor from before
			c.mu.Lock()
			c.single = true
			c.mu.Unlock()
		case code == codes.InvalidArgument && len(call) > 1:
			// one of them is malformed: each on its own, so that it alone is refused
		default:
			for _, one := range call {
				one.done <- completed{err: err}
			}
			return
		}
	}
	var wg sync.WaitGroup
	for _, one := range call {
		wg.Add(1)
		go func(one *completing) {
			defer wg.Done()
			one.done <- c.sendOne(one.request)
		}(one)
	}
	wg.Wait()
}

// sendOne completes one run with CompleteRun: ABORTED is a refusal, as CompleteRuns gives it.
func (c *completions) sendOne(request *executorv1.CompleteRunRequest) completed {
	ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
	_, err := c.stub.CompleteRun(ctx, request)
	cancel()
	switch CodeOf(err) {
	case codes.OK:
		return completed{result: &executorv1.RunCompletion{RunToken: request.GetRunToken(), Recorded: true}}
	case codes.Aborted:
		return completed{result: &executorv1.RunCompletion{
			RunToken: request.GetRunToken(), Detail: status.Convert(err).Message(),
		}}
	default:
		return completed{err: err}
	}
}

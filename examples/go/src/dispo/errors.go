package dispo

import (
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A Violation is one field a server found wrong, named as in the request
// ("cells[0].cell"), from the google.rpc.BadRequest detail of its status.
type Violation struct {
	Field       string `json:"field"`
	Description string `json:"description"`
}

// An Error is a call a server refused or could not answer: the gRPC status, read.
type Error struct {
	Code       codes.Code
	Message    string
	Violations []Violation
	// RetryAfter is when to try again after a rate limit (google.rpc.RetryInfo); 0 if none.
	RetryAfter time.Duration
	status     *status.Status
}

// CodeName is the code as the protos and Dispo's docs spell it: "INVALID_ARGUMENT".
func CodeName(c codes.Code) string { return code.Code(c).String() }

// Error reads as Dispo's CLI prints a refusal: the code and message, then one line per
// field violation.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(CodeName(e.Code) + ": " + e.Message)
	for _, v := range e.Violations {
		b.WriteString("\n  " + v.Field + ": " + v.Description)
	}
	return b.String()
}

// GRPCStatus is the status as received, for status.FromError and status.Code.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// CodeOf is err's gRPC code: codes.OK for nil, codes.Unknown for an error that is no status.
func CodeOf(err error) codes.Code {
	var refused *Error
	if errors.As(err, &refused) {
		return refused.Code
	}
	return status.Code(err)
}

// fromRPC turns the error of a gRPC call into an *Error (nil stays nil; an error that
// carries no status, such as a context's, is returned as it is).
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	out := &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				out.Violations = append(out.Violations, Violation{v.GetField(), v.GetDescription()})
			}
		case *errdetails.RetryInfo:
			if delay := d.GetRetryDelay(); delay != nil {
				out.RetryAfter = time.Duration(delay.GetSeconds())*time.Second + time.Duration(delay.GetNanos())
			}
		}
	}
	return out
}

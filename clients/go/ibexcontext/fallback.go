package ibexcontext

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client's fallback reasons (the service's own reasons arrive in the
// response's metadata). They are the Python client's.
const (
	ReasonTimeout         = "client_timeout"
	ReasonUnavailable     = "client_unavailable"
	ReasonInvalidArgument = "client_invalid_argument"
	ReasonCanceled        = "client_canceled"
	// ReasonErrorPrefix starts every other reason: "client_error:" and a gRPC
	// status name (e.g. "client_error:UNAUTHENTICATED"), or "bad_request" or
	// "empty_response".
	ReasonErrorPrefix = "client_error:"

	reasonBadRequest    = ReasonErrorPrefix + "bad_request"
	reasonEmptyResponse = ReasonErrorPrefix + "empty_response"
	reasonUnexpected    = ReasonErrorPrefix + "unexpected"
)

// grpc-go's words for a request it could not encode (e.g. invalid UTF-8 in a
// string field): the caller's bug, like the Python client's bad_request.
const marshalErrorPrefix = "grpc: error while marshaling"

// statusNames are the gRPC status names as the protocol (and the Python
// client's reasons) spell them; codes.Code.String() spells them in CamelCase.
var statusNames = map[codes.Code]string{
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// classify maps the error of a failed call to its fallback reason.
func classify(err error) string {
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.DeadlineExceeded:
			return ReasonTimeout
		case codes.Canceled:
			return ReasonCanceled
		case codes.Unavailable:
			return ReasonUnavailable
		case codes.InvalidArgument, codes.ResourceExhausted:
			// RESOURCE_EXHAUSTED: a request over the service's size limit, refused
			// by gRPC itself: as much the caller's bug as a field the service rejects.
			return ReasonInvalidArgument
		case codes.Internal:
			if strings.HasPrefix(st.Message(), marshalErrorPrefix) {
				return reasonBadRequest
			}
		}
		if name, known := statusNames[st.Code()]; known {
			return ReasonErrorPrefix + name
		}
		return reasonUnexpected
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, context.Canceled):
		return ReasonCanceled
	}
	return reasonUnexpected
}

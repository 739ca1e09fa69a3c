package ibexcontext

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), ReasonTimeout},
		{status.Error(codes.Canceled, "context canceled"), ReasonCanceled},
		{status.Error(codes.Unavailable, "connection refused"), ReasonUnavailable},
		{status.Error(codes.InvalidArgument, "org_id: must be a UUID"), ReasonInvalidArgument},
		{status.Error(codes.ResourceExhausted, "message larger than max"), ReasonInvalidArgument},
		{status.Error(codes.Internal, "grpc: error while marshaling: string field contains invalid UTF-8"), "client_error:bad_request"},
		{status.Error(codes.Internal, "handler bug"), "client_error:INTERNAL"},
		{status.Error(codes.Unauthenticated, "no token"), "client_error:UNAUTHENTICATED"},
		{status.Error(codes.PermissionDenied, "wrong org"), "client_error:PERMISSION_DENIED"},
		{status.Error(codes.Unimplemented, "unknown method"), "client_error:UNIMPLEMENTED"},
		{status.Error(codes.Unknown, "?"), "client_error:UNKNOWN"},
		{status.Error(codes.Code(42), "from the future"), "client_error:unexpected"},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), ReasonTimeout},
		{context.Canceled, ReasonCanceled},
		{errors.New("something else"), "client_error:unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			if got := classify(tt.err); got != tt.want {
				t.Errorf("classify(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

package ibexcontext

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
)

// DefaultMemoryTimeout is the deadline of a MemoryClient call whose context has
// none: a write embeds its memories on the service, a purge may take seconds.
const DefaultMemoryTimeout = 10 * time.Second

// MemoryClient is the write and read side (MemoryService: memories, directives,
// feedback, the read side, export and purge), dialed like a ContextClient. Unlike
// Assemble, its calls return the service's errors (gRPC statuses, e.g.
// INVALID_ARGUMENT naming the field): a write that failed must be known.
type MemoryClient struct {
	contextv1.MemoryServiceClient
	conn *grpc.ClientConn
}

// NewMemoryClient dials target as NewContextClient does (tracing options do not
// apply). Close it when done.
func NewMemoryClient(target string, opts ...Option) (*MemoryClient, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	timeout := DefaultMemoryTimeout
	if cfg.timeoutSet {
		timeout = cfg.timeout
	}
	cfg.dialOptions = append([]grpc.DialOption{grpc.WithChainUnaryInterceptor(defaultDeadline(timeout))}, cfg.dialOptions...)
	conn, err := dial(target, cfg)
	if err != nil {
		return nil, err
	}
	return &MemoryClient{MemoryServiceClient: contextv1.NewMemoryServiceClient(conn), conn: conn}, nil
}

// Close closes the client's connection.
func (m *MemoryClient) Close() error { return m.conn.Close() }

// defaultDeadline gives a call without a deadline one: no call waits forever.
func defaultDeadline(timeout time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

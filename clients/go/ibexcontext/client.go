package ibexcontext

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
)

// roundRobin balances calls over every address the target resolves to (a
// headless Service's pods), using only those connected.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// Request is one AssembleContext call.
type Request struct {
	OrgID     string // tenant, a UUID; required
	AgentID   string // a UUID; required
	SessionID string // a UUID, or empty for a new session
	Model     string // target model, e.g. "gpt-4o"; required
	RequestID string // the caller's id for logs and traces; the service makes one when empty
	Messages  []*contextv1.Message
}

// Result is what to send to the model.
type Result struct {
	// Messages are the service's when FromService, else the caller's own (the
	// very slice of the Request).
	Messages []*contextv1.Message
	// Metadata is the service's account of the assembly; nil when the client fell back.
	Metadata *contextv1.InjectionMetadata
	// FallbackReason is empty for a full assembly, the service's reason when it
	// degraded, or a client_* reason when the client fell back.
	FallbackReason string
	FromService    bool
	Elapsed        time.Duration
	// Err is why the client fell back (nil otherwise), for the caller's log: a
	// gRPC status. INVALID_ARGUMENT's message names the field and may quote a
	// preview of the rejected value (e.g. a malformed org_id), never content.
	Err error
}

// Degraded says whether the messages lack anything a full assembly would add.
func (r Result) Degraded() bool { return r.FallbackReason != "" }

// ContextClient calls AssembleContext over one long-lived gRPC connection per
// address. It is safe for concurrent use.
type ContextClient struct {
	conn       *grpc.ClientConn // nil when the caller owns the connection
	stub       contextv1.ContextAssemblyServiceClient
	timeout    time.Duration
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	metrics    *clientMetrics
}

// NewContextClient connects to target, e.g. "dns:///ibex-context-headless.ns.svc:50051"
// (round robin over every address of the name, resolved again every
// DefaultResolveEvery: see WithResolveEvery) or "127.0.0.1:50051". A target
// without a port gets 50051. It does not wait for the connection: errors are for
// options only. Close it when done.
func NewContextClient(target string, opts ...Option) (*ContextClient, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	metrics, err := newClientMetrics(cfg.meter)
	if err != nil {
		return nil, err
	}
	conn, err := dial(target, cfg)
	if err != nil {
		return nil, err
	}
	client := newClient(conn, cfg, metrics)
	client.conn = conn
	return client, nil
}

var errEmptyTarget = errors.New("ibexcontext: empty target")

// dial creates the connection as the options say: round robin over the target's
// addresses (re-resolved periodically), TLS or plaintext, a bearer token (over
// TLS only), then the caller's own dial options. A target without a scheme is a
// dns: one, as for grpc.NewClient.
func dial(target string, cfg *config) (*grpc.ClientConn, error) {
	if target == "" {
		return nil, errEmptyTarget
	}
	opts := []grpc.DialOption{
		grpc.WithDefaultServiceConfig(roundRobin),
		grpc.WithResolvers(refreshingDNS{every: cfg.resolveEvery}),
	}
	switch {
	case cfg.tls != nil:
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg.tls)))
	case cfg.token != nil:
		return nil, errors.New("ibexcontext: WithBearerToken needs WithTLS")
	default:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if cfg.token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken{cfg.token}))
	}
	return grpc.NewClient(target, append(opts, cfg.dialOptions...)...)
}

// NewContextClientFromConn calls AssembleContext over a connection the caller
// dialed and closes. Connection options (TLS, token, dial options) are refused:
// they belong to the caller's dial.
func NewContextClientFromConn(conn grpc.ClientConnInterface, opts ...Option) (*ContextClient, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.dials() {
		return nil, errors.New("ibexcontext: TLS, token and dial options apply to NewContextClient only")
	}
	metrics, err := newClientMetrics(cfg.meter)
	if err != nil {
		return nil, err
	}
	return newClient(conn, cfg, metrics), nil
}

func newClient(conn grpc.ClientConnInterface, cfg *config, metrics *clientMetrics) *ContextClient {
	return &ContextClient{
		stub:       contextv1.NewContextAssemblyServiceClient(conn),
		timeout:    cfg.timeout,
		tracer:     cfg.tracer.Tracer(instrumentationName),
		propagator: cfg.propagator,
		metrics:    metrics,
	}
}

// WaitReady waits until a connection is up, or ctx ends: call it at start-up
// so the first request does not pay for the handshake. It says whether one is.
func (c *ContextClient) WaitReady(ctx context.Context) bool {
	if c.conn == nil {
		return false
	}
	for {
		state := c.conn.GetState()
		switch state {
		case connectivity.Ready:
			return true
		case connectivity.Idle:
			c.conn.Connect() // a new (or idle) client connects on its first call only
		}
		if !c.conn.WaitForStateChange(ctx, state) {
			return false
		}
	}
}

// Close closes the connection the client dialed (not one it was given).
func (c *ContextClient) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Assemble returns the messages to send to the model. It never fails: on any
// error it returns req.Messages with a client_* FallbackReason (see the package
// documentation). Its deadline is ctx's, capped at the client's timeout.
func (c *ContextClient) Assemble(ctx context.Context, req Request) Result {
	started := time.Now()
	ctx, span := c.tracer.Start(ctx, spanName, spanStart...)
	result := c.assemble(ctx, req)
	result.Elapsed = time.Since(started)
	endSpan(span, &result)
	c.metrics.record(ctx, &result)
	return result
}

func (c *ContextClient) assemble(ctx context.Context, req Request) Result {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ctx = c.outgoingMetadata(ctx, req.RequestID)
	reply, err := c.stub.AssembleContext(ctx, &contextv1.AssembleContextRequest{
		OrgId:     req.OrgID,
		AgentId:   req.AgentID,
		SessionId: req.SessionID,
		Model:     req.Model,
		RequestId: req.RequestID,
		Messages:  req.Messages,
	})
	if err != nil {
		reason := classify(err)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The call's own deadline ran out. grpc-go usually says DEADLINE_EXCEEDED, but
			// when the deadline fires while the stream is being set up it can surface as
			// UNKNOWN "context deadline exceeded" (seen in CI): the deadline decides.
			reason = ReasonTimeout
		}
		return Result{Messages: req.Messages, FallbackReason: reason, Err: err}
	}
	if len(reply.GetMessages()) == 0 && len(req.Messages) > 0 {
		return Result{
			Messages:       req.Messages,
			FallbackReason: reasonEmptyResponse,
			Err:            errors.New("ibexcontext: the service returned no messages"),
		}
	}
	return Result{
		Messages:       reply.GetMessages(),
		Metadata:       reply.GetMetadata(),
		FallbackReason: reply.GetMetadata().GetFallbackReason(),
		FromService:    true,
	}
}

// outgoingMetadata adds the request id and the trace context (of the client's
// span) to whatever metadata the caller's context already carries. A propagator
// with no fields (the global one until the application sets one) costs nothing.
func (c *ContextClient) outgoingMetadata(ctx context.Context, requestID string) context.Context {
	var pairs []string
	if requestID != "" {
		pairs = append(pairs, "x-request-id", requestID)
	}
	if len(c.propagator.Fields()) > 0 {
		md := metadata.MD{}
		c.propagator.Inject(ctx, metadataCarrier(md))
		for key, values := range md {
			for _, value := range values {
				pairs = append(pairs, key, value)
			}
		}
	}
	if len(pairs) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, pairs...)
}

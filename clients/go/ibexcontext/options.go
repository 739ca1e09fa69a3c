package ibexcontext

import (
	"crypto/tls"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// DefaultTimeout caps every call's deadline: the proxy's budget for the whole
// context path is 50 ms, and 5 ms of it stay with the proxy.
const DefaultTimeout = 45 * time.Millisecond

// Option configures a ContextClient.
type Option func(*config) error

type config struct {
	timeout      time.Duration
	timeoutSet   bool
	resolveEvery time.Duration
	tls          *tls.Config
	token        TokenSource
	dialOptions  []grpc.DialOption
	tracer       trace.TracerProvider
	meter        metric.MeterProvider
	propagator   propagation.TextMapPropagator
}

func newConfig(opts []Option) (*config, error) {
	cfg := &config{timeout: DefaultTimeout, resolveEvery: DefaultResolveEvery}
	for _, opt := range opts {
		if err := opt(cfg); err != nil {
			return nil, err
		}
	}
	if cfg.tracer == nil {
		cfg.tracer = otel.GetTracerProvider()
	}
	if cfg.meter == nil {
		cfg.meter = otel.GetMeterProvider()
	}
	if cfg.propagator == nil {
		cfg.propagator = otel.GetTextMapPropagator()
	}
	return cfg, nil
}

// dials says whether the options configure a connection (and so need NewContextClient).
func (c *config) dials() bool {
	return c.tls != nil || c.token != nil || len(c.dialOptions) > 0
}

// WithTimeout sets, for a ContextClient, the cap on every call's deadline
// (DefaultTimeout when not given; a caller's earlier deadline is kept); for a
// MemoryClient, the deadline of a call whose context has none
// (DefaultMemoryTimeout when not given).
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return errors.New("ibexcontext: timeout must be positive")
		}
		c.timeout, c.timeoutSet = d, true
		return nil
	}
}

// WithResolveEvery sets how often a dns: target is resolved again
// (DefaultResolveEvery when not given), so that pods added behind the name get
// calls. The name is also resolved again (at most once a second) whenever a
// connection fails.
func WithResolveEvery(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return errors.New("ibexcontext: the resolve period must be positive")
		}
		c.resolveEvery = d
		return nil
	}
}

// WithTLS dials with TLS (plaintext without it). Set Certificates for mutual
// TLS, RootCAs for a private CA.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return errors.New("ibexcontext: WithTLS needs a tls.Config")
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// WithBearerToken sends "authorization: Bearer <token>" metadata on every call,
// the token asked of source each time (so it may rotate). It needs WithTLS:
// a token is never sent in plaintext.
func WithBearerToken(source TokenSource) Option {
	return func(c *config) error {
		if source == nil {
			return errors.New("ibexcontext: WithBearerToken needs a TokenSource")
		}
		c.token = source
		return nil
	}
}

// WithDialOptions adds grpc.DialOptions (keepalive, a custom dialer, resolvers, ...)
// after the client's own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) error {
		c.dialOptions = append(c.dialOptions, opts...)
		return nil
	}
}

// WithTracerProvider records a ContextClient's spans with tp (the global provider when not given).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return errors.New("ibexcontext: WithTracerProvider needs a provider")
		}
		c.tracer = tp
		return nil
	}
}

// WithMeterProvider records a ContextClient's metrics with mp (the global
// provider when not given): ibex_context_client_requests{result} and
// ibex_context_client_duration (seconds), the Python client's, which the
// chart's dashboard reads.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("ibexcontext: WithMeterProvider needs a provider")
		}
		c.meter = mp
		return nil
	}
}

// WithPropagator injects the trace context into each call's metadata with p (the
// global propagator when not given, which injects nothing until one is set).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) error {
		if p == nil {
			return errors.New("ibexcontext: WithPropagator needs a propagator")
		}
		c.propagator = p
		return nil
	}
}

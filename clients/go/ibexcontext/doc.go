// Package ibexcontext is the LLM proxy's client of ibex-context.
//
// ContextClient.Assemble calls AssembleContext and never fails the LLM request:
// whatever happens it returns the messages to send to the model. When the
// service answered, they are the service's (with the directive and memories
// injected, or the caller's own when the service degraded, with the service's
// fallback reason). When the call failed, they are the caller's own messages,
// unchanged, with a client_* fallback reason:
//
//	client_timeout           the deadline (the caller's, capped at 45 ms) ran out
//	client_unavailable       no connection, refused, reset, or the service said UNAVAILABLE
//	client_invalid_argument  the service rejected the request (INVALID_ARGUMENT, or
//	                         RESOURCE_EXHAUSTED for one over its size limit): a bug in the caller
//	client_canceled          the caller's context was canceled
//	client_error:<STATUS>    any other gRPC status, e.g. client_error:UNAUTHENTICATED;
//	                         client_error:bad_request when the request cannot be encoded
//	                         (invalid UTF-8), client_error:empty_response
//
// These are the reasons of the Python client (ibex_context_client.ContextClient).
//
// Dial the headless Service with a dns:/// target: the client balances round
// robin over every address the name resolves to, resolves the name again every
// DefaultResolveEvery (WithResolveEvery) so that added pods get calls, and skips
// a pod that refuses connections. Each call records an OpenTelemetry client span
// with the RPC's name and the outcome, and the metrics
// ibex_context_client_requests{result} and ibex_context_client_duration (the
// Python client's, which the chart's dashboard reads): never tenant ids or content.
package ibexcontext

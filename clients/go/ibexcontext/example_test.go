package ibexcontext_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log"
	"os"
	"time"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
)

// The proxy's path: one client for the process, one Assemble per LLM request.
// Assemble never fails: on any error it returns the caller's own messages.
func ExampleContextClient_Assemble() {
	client, err := ibexcontext.NewContextClient("dns:///ibex-context-headless.ibex.svc.cluster.local:50051")
	if err != nil {
		log.Fatal(err) // bad options only: the connections are made in the background
	}
	defer client.Close()

	result := client.Assemble(context.Background(), ibexcontext.Request{
		OrgID:     "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
		AgentID:   "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
		Model:     "gpt-4o",
		RequestID: "req-1",
		Messages:  []*contextv1.Message{{Role: "user", Content: "Which seat should I book for Berlin?"}},
	})
	if result.Err != nil { // a client fallback: the gRPC status, never content
		log.Printf("context assembly fell back (%s): %v", result.FallbackReason, result.Err)
	}
	_ = result.Messages // what to send to the model
}

// With TLS (the chart's default) and a bearer token re-read on every call, e.g.
// from a projected file that rotates; pods added behind the name are found
// within 10 s instead of the default 30 s.
func ExampleNewContextClient_tls() {
	roots := x509.NewCertPool()
	ca, err := os.ReadFile("/etc/ibex-context/ca.crt")
	if err != nil || !roots.AppendCertsFromPEM(ca) {
		log.Fatalf("reading the service's CA: %v", err)
	}
	client, err := ibexcontext.NewContextClient("dns:///ibex-context-headless.ibex.svc.cluster.local:50051",
		ibexcontext.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		ibexcontext.WithBearerToken(func(context.Context) (string, error) {
			token, err := os.ReadFile("/var/run/secrets/ibex-context/token")
			return string(token), err
		}),
		ibexcontext.WithResolveEvery(10*time.Second),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}

// The write side returns the service's errors: a write that failed must be known.
func ExampleMemoryClient() {
	memory, err := ibexcontext.NewMemoryClient("dns:///ibex-context-headless.ibex.svc.cluster.local:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer memory.Close()

	_, err = memory.UpsertMemories(context.Background(), &contextv1.UpsertMemoriesRequest{
		OrgId:    "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
		AgentId:  "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
		Memories: []*contextv1.MemoryInput{{Content: "The customer travels with a service dog.", Category: "factual"}},
	})
	if err != nil {
		log.Printf("upsert failed: %v", err) // e.g. INVALID_ARGUMENT naming the field
	}
}

// Command proxy is a minimal OpenAI-compatible reverse proxy: every
// POST /v1/chat/completions has its messages assembled by ibex-context
// (directive and memories in) before it goes to the upstream; everything else,
// and every answer (SSE streams included), passes through unchanged.
//
// It is ContextClient underneath, so it never fails a request: when
// ibex-context is slow (past -timeout, 45 ms by default), down or refuses, the
// request goes out as it came. The answer's X-Ibex-Context header says which:
// assembled, degraded:<reason>, fallback:<reason> or skipped (no call made).
//
//	go run ./examples/proxy -upstream https://api.openai.com -target 127.0.0.1:50051 \
//	    -org "$ORG" -agent "$AGENT"
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("proxy stopped", "error", err)
		os.Exit(1)
	}
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func run(log *slog.Logger) error {
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve on")
	upstream := flag.String("upstream", "", "the OpenAI-compatible API to forward to, e.g. https://api.openai.com (required)")
	target := flag.String("target", env("IBEX_TARGET", "127.0.0.1:50051"), "ibex-context's gRPC target [IBEX_TARGET]")
	org := flag.String("org", os.Getenv("IBEX_ORG_ID"), "org for requests that name none [IBEX_ORG_ID]")
	agent := flag.String("agent", os.Getenv("IBEX_AGENT_ID"), "agent for requests that name none [IBEX_AGENT_ID]")
	trustHeaders := flag.Bool("trust-headers", false, "let X-Ibex-Org-Id / X-Ibex-Agent-Id name the tenant (behind a gateway that sets them)")
	timeout := flag.Duration("timeout", ibexcontext.DefaultTimeout, "cap on each AssembleContext call, connecting included")
	maxBody := flag.Int64("max-body-bytes", 8<<20, "largest chat completion body read")
	tlsCA := flag.String("tls-ca", os.Getenv("IBEX_TLS_CA"), "CA file: TLS to ibex-context [IBEX_TLS_CA]")
	tokenFile := flag.String("token-file", os.Getenv("IBEX_TOKEN_FILE"), "bearer token file, read on every call; needs -tls-ca [IBEX_TOKEN_FILE]")
	flag.Parse()

	upstreamURL, err := url.Parse(*upstream)
	if err != nil || (upstreamURL.Scheme != "http" && upstreamURL.Scheme != "https") || upstreamURL.Host == "" {
		return fmt.Errorf("-upstream: an absolute http(s) URL is required, got %q", *upstream)
	}
	if *maxBody <= 0 {
		return errors.New("-max-body-bytes: must be positive")
	}
	opts := []ibexcontext.Option{ibexcontext.WithTimeout(*timeout)}
	if *tlsCA != "" {
		pem, err := os.ReadFile(*tlsCA)
		roots := x509.NewCertPool()
		if err != nil || !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("-tls-ca: no certificate read from %s", *tlsCA)
		}
		opts = append(opts, ibexcontext.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	}
	if *tokenFile != "" {
		path := *tokenFile
		opts = append(opts, ibexcontext.WithBearerToken(func(context.Context) (string, error) {
			token, err := os.ReadFile(path)
			return string(token), err
		}))
	}
	client, err := ibexcontext.NewContextClient(*target, opts...)
	if err != nil {
		return err
	}
	defer client.Close()
	ready, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if !client.WaitReady(ready) { // not fatal: requests go out as they came until it is
		log.Warn("ibex-context not reachable yet; requests pass unassembled until it is")
	}
	cancel()

	server := &http.Server{
		Addr:              *listen,
		Handler:           NewProxy(Config{Upstream: upstreamURL, DefaultOrg: *org, DefaultAgent: *agent, TrustHeaders: *trustHeaders, MaxBodyBytes: *maxBody}, client, log),
		ReadHeaderTimeout: 10 * time.Second,
	}
	stop, cancelStop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancelStop()
	go func() {
		<-stop.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	log.Info("proxy serving", "listen", *listen, "upstream", upstreamURL.Redacted())
	if err := server.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
)

const (
	testOrg     = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
	testAgent   = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"
	headerOrgID = "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e02"
	injected    = "Directive and memories"
	// modelOverloaded makes the scripted service degrade.
	modelOverloaded = "scenario-overloaded"
	// generous bounds a call in tests that need the service's answer (a loaded machine).
	generous = 10 * time.Second
)

// scriptedService is a real gRPC server on a loopback socket: it puts a system
// message before the request's messages and records what it saw.
type scriptedService struct {
	contextv1.UnimplementedContextAssemblyServiceServer
	mu    sync.Mutex
	calls []*contextv1.AssembleContextRequest
}

func (s *scriptedService) AssembleContext(_ context.Context, req *contextv1.AssembleContextRequest) (*contextv1.AssembleContextResponse, error) {
	s.mu.Lock()
	s.calls = append(s.calls, req)
	s.mu.Unlock()
	if req.GetModel() == modelOverloaded { // the service sheds: the caller's messages, and says why
		return &contextv1.AssembleContextResponse{Messages: req.GetMessages(),
			Metadata: &contextv1.InjectionMetadata{FallbackReason: "overloaded"}}, nil
	}
	messages := append([]*contextv1.Message{{Role: "system", Content: injected}}, req.GetMessages()...)
	return &contextv1.AssembleContextResponse{Messages: messages, Metadata: &contextv1.InjectionMetadata{DirectiveInjected: true}}, nil
}

func (s *scriptedService) seen() []*contextv1.AssembleContextRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*contextv1.AssembleContextRequest(nil), s.calls...)
}

func startScripted(t *testing.T) (*scriptedService, string) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	service := &scriptedService{}
	server := grpc.NewServer()
	contextv1.RegisterContextAssemblyServiceServer(server, service)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return service, listener.Addr().String()
}

// closedAddress is an address nothing listens on (bound, then released).
func closedAddress(t *testing.T) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := listener.Addr().String()
	if err := listener.Close(); err != nil {
		t.Fatal(err)
	}
	return address
}

// recordingUpstream is the model's API: it records each request and answers 200
// with a completion (or what handle writes).
type recordingUpstream struct {
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	paths   []string
	handle  func(w http.ResponseWriter, r *http.Request)
	*httptest.Server
}

func startUpstream(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{handle: handle}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, body)
		u.headers = append(u.headers, r.Header.Clone())
		u.paths = append(u.paths, r.URL.Path)
		u.mu.Unlock()
		if u.handle != nil {
			u.handle(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(OutcomeHeader, "forged by the upstream")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"ok"}}]}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *recordingUpstream) last(t *testing.T) ([]byte, http.Header) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("the upstream received no request")
	}
	return u.bodies[len(u.bodies)-1], u.headers[len(u.headers)-1]
}

func startProxy(t *testing.T, upstream *recordingUpstream, target string, cfg Config, opts ...ibexcontext.Option) *httptest.Server {
	t.Helper()
	return startProxyLogging(t, io.Discard, upstream, target, cfg, opts...)
}

func startProxyLogging(t *testing.T, logs io.Writer, upstream *recordingUpstream, target string, cfg Config, opts ...ibexcontext.Option) *httptest.Server {
	t.Helper()
	client, err := ibexcontext.NewContextClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	cfg.Upstream, err = url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	proxy := httptest.NewServer(NewProxy(cfg, client, slog.New(slog.NewTextHandler(logs, nil))))
	t.Cleanup(proxy.Close)
	return proxy
}

func post(t *testing.T, proxy *httptest.Server, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, proxy.URL+chatCompletionsPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// sentMessages are the messages of the body the upstream received.
func sentMessages(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var completion struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(body, &completion); err != nil {
		t.Fatalf("the upstream received %q: %v", body, err)
	}
	return completion.Messages
}

const plainCompletion = `{"model":"gpt-4o","temperature":0.2,"messages":[{"role":"user","content":"Which seat should I book?"}]}`

func TestAssembledMessagesReachTheUpstream(t *testing.T) {
	service, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent, TrustHeaders: true},
		ibexcontext.WithTimeout(generous))

	resp := post(t, proxy, plainCompletion, map[string]string{headerOrg: headerOrgID, headerRequestID: "req-7"})

	if resp.StatusCode != http.StatusOK || len(resp.Header.Values(OutcomeHeader)) != 1 || resp.Header.Get(OutcomeHeader) != "assembled" {
		t.Fatalf("status %d, %s %q, want 200 and assembled", resp.StatusCode, OutcomeHeader, resp.Header.Values(OutcomeHeader))
	}
	if resp.Header.Get(ElapsedHeader) == "" {
		t.Errorf("no %s", ElapsedHeader)
	}
	body, headers := upstream.last(t)
	got := sentMessages(t, body)
	if len(got) != 2 || got[0]["role"] != "system" || got[0]["content"] != injected || got[1]["content"] != "Which seat should I book?" {
		t.Errorf("the upstream received messages %v, want the injected system message and the question", got)
	}
	var fields map[string]any
	_ = json.Unmarshal(body, &fields)
	if fields["model"] != "gpt-4o" || fields["temperature"] != 0.2 {
		t.Errorf("the other fields changed: %s", body)
	}
	if headers.Get(headerOrg) != "" {
		t.Errorf("the tenant header reached the upstream")
	}
	calls := service.seen()
	if len(calls) != 1 || calls[0].GetOrgId() != headerOrgID || calls[0].GetAgentId() != testAgent ||
		calls[0].GetModel() != "gpt-4o" || calls[0].GetRequestId() != "req-7" {
		t.Errorf("the service saw %v, want the header's org, the default agent, the model and the request id", calls)
	}
}

func TestHeadersNameNoTenantUnlessTrusted(t *testing.T) {
	service, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent}, ibexcontext.WithTimeout(generous))

	post(t, proxy, plainCompletion, map[string]string{headerOrg: headerOrgID})

	if calls := service.seen(); len(calls) != 1 || calls[0].GetOrgId() != testOrg {
		t.Errorf("the service saw %v, want the default org", calls)
	}
}

func TestADegradedAssemblySaysWhy(t *testing.T) {
	_, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent}, ibexcontext.WithTimeout(generous))

	resp := post(t, proxy, `{"model":"`+modelOverloaded+`","messages":[{"role":"user","content":"Hi"}]}`, nil)

	if got := resp.Header.Get(OutcomeHeader); got != "degraded:overloaded" {
		t.Errorf("%s %q, want degraded:overloaded", OutcomeHeader, got)
	}
	if body, _ := upstream.last(t); len(sentMessages(t, body)) != 1 {
		t.Errorf("the upstream received %q, want the service's (here the request's) one message", body)
	}
}

func TestFailsOpenWhenTheServiceIsDown(t *testing.T) {
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, closedAddress(t), Config{DefaultOrg: testOrg, DefaultAgent: testAgent},
		ibexcontext.WithTimeout(generous))

	resp := post(t, proxy, plainCompletion, nil)

	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(answer, []byte("chatcmpl-1")) {
		t.Fatalf("status %d, body %q: want the upstream's answer", resp.StatusCode, answer)
	}
	if got := resp.Header.Get(OutcomeHeader); got != "fallback:"+ibexcontext.ReasonUnavailable {
		t.Errorf("%s %q, want fallback:%s", OutcomeHeader, got, ibexcontext.ReasonUnavailable)
	}
	if body, _ := upstream.last(t); string(body) != plainCompletion {
		t.Errorf("the upstream received %q, want the request as it came", body)
	}
}

func TestFallbacksAreLoggedOncePerPeriodWithoutContent(t *testing.T) {
	upstream := startUpstream(t, nil)
	var logs syncBuffer
	proxy := startProxyLogging(t, &logs, upstream, closedAddress(t), Config{DefaultOrg: testOrg, DefaultAgent: testAgent})

	post(t, proxy, plainCompletion, nil)
	post(t, proxy, plainCompletion, nil)

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "reason=") {
		t.Errorf("logged %q, want one line with the reason", lines)
	}
	if strings.Contains(logs.String(), testOrg) || strings.Contains(logs.String(), "Which seat") {
		t.Errorf("the log names the tenant or the content: %q", logs.String())
	}
}

// syncBuffer is a bytes.Buffer the proxy's handlers may write concurrently.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestMessagesBeyondRoleAndTextPassUntouched(t *testing.T) {
	service, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent}, ibexcontext.WithTimeout(generous))
	bodies := map[string]string{
		"tool calls": `{"model":"gpt-4o","messages":[{"role":"user","content":"Weather?"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"sunny"}]}`,
		"an image":    `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`,
		"a name":      `{"model":"gpt-4o","messages":[{"role":"user","name":"priya","content":"Hi"}]}`,
		"an odd role": `{"model":"gpt-4o","messages":[{"role":"function","content":"Hi"}]}`,
		"not JSON":    `{"model":`,
		"no messages": `{"model":"gpt-4o","messages":[]}`,
	}
	for name, sent := range bodies {
		t.Run(name, func(t *testing.T) {
			resp := post(t, proxy, sent, nil)

			if got := resp.Header.Get(OutcomeHeader); got != outcomeSkipped {
				t.Errorf("%s %q, want skipped", OutcomeHeader, got)
			}
			if body, _ := upstream.last(t); string(body) != sent {
				t.Errorf("the upstream received %q, want %q", body, sent)
			}
		})
	}
	if calls := service.seen(); len(calls) != 0 {
		t.Errorf("the service was called %d times", len(calls))
	}
}

func TestNoTenantNoCall(t *testing.T) {
	service, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{TrustHeaders: true}, ibexcontext.WithTimeout(generous))

	resp := post(t, proxy, plainCompletion, map[string]string{headerOrg: testOrg})

	if got := resp.Header.Get(OutcomeHeader); got != outcomeSkipped || len(service.seen()) != 0 {
		t.Errorf("%s %q after %d calls, want skipped and none", OutcomeHeader, got, len(service.seen()))
	}
}

func TestStreamsTheUpstreamsAnswerAsItComes(t *testing.T) {
	_, target := startScripted(t)
	second := make(chan struct{})
	upstream := startUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select { // the second chunk only once the client has read the first
		case <-second:
		case <-time.After(generous):
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n")
	})
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent}, ibexcontext.WithTimeout(generous))

	resp := post(t, proxy, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hi"}]}`, nil)

	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get(OutcomeHeader) != "assembled" {
		t.Fatalf("Content-Type %q, %s %q", resp.Header.Get("Content-Type"), OutcomeHeader, resp.Header.Get(OutcomeHeader))
	}
	reader := bufio.NewReader(resp.Body)
	first, err := reader.ReadString('\n')
	if err != nil || first != "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n" {
		t.Fatalf("first line %q (%v): the proxy held the stream back", first, err)
	}
	close(second)
	rest, err := io.ReadAll(reader)
	if err != nil || string(rest) != "\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n" {
		t.Errorf("rest of the stream %q (%v)", rest, err)
	}
}

func TestOtherPathsPassThrough(t *testing.T) {
	service, target := startScripted(t)
	upstream := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, r.Method+" "+r.Host+r.URL.RequestURI())
	})
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent})

	resp, err := proxy.Client().Post(proxy.URL+"/v1/embeddings?x=1", "application/json", strings.NewReader(`{"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTeapot || string(answer) != "POST "+strings.TrimPrefix(upstream.URL, "http://")+"/v1/embeddings?x=1" || resp.Header.Get(OutcomeHeader) != "" {
		t.Errorf("status %d, body %q, %s %q", resp.StatusCode, answer, OutcomeHeader, resp.Header.Get(OutcomeHeader))
	}
	if body, _ := upstream.last(t); string(body) != `{"input":"hi"}` || len(service.seen()) != 0 {
		t.Errorf("the upstream received %q; %d service calls", body, len(service.seen()))
	}
}

func TestBodyOverTheLimitIsRefused(t *testing.T) {
	_, target := startScripted(t)
	upstream := startUpstream(t, nil)
	proxy := startProxy(t, upstream, target, Config{DefaultOrg: testOrg, DefaultAgent: testAgent, MaxBodyBytes: 64})

	resp := post(t, proxy, plainCompletion+strings.Repeat(" ", 64), nil)

	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(answer), "max-body-bytes") {
		t.Errorf("status %d, body %q, want 413 naming the limit", resp.StatusCode, answer)
	}
	upstream.mu.Lock()
	defer upstream.mu.Unlock()
	if len(upstream.bodies) != 0 {
		t.Errorf("the upstream received %d requests", len(upstream.bodies))
	}
}

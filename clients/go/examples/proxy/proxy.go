package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
)

// The headers the proxy reads and answers with: the LiteLLM hook's
// (clients/python/ibex_context_client/litellm/request.py).
const (
	headerOrg       = "X-Ibex-Org-Id"
	headerAgent     = "X-Ibex-Agent-Id"
	headerSession   = "X-Ibex-Session-Id"
	headerRequestID = "X-Request-Id"
	// OutcomeHeader says what became of the request's context: assembled,
	// degraded:<reason>, fallback:<reason> or skipped.
	OutcomeHeader = "X-Ibex-Context"
	// ElapsedHeader is the Assemble call's wall time in milliseconds.
	ElapsedHeader = "X-Ibex-Context-Ms"

	chatCompletionsPath = "/v1/chat/completions"
	outcomeSkipped      = "skipped"
)

// roles are the service's (ibex_context.models.ROLES): a message with another
// role would be refused, so such a request passes untouched.
var roles = map[string]bool{"system": true, "user": true, "assistant": true, "tool": true, "developer": true}

// Assembler is ContextClient's fail-open call.
type Assembler interface {
	Assemble(ctx context.Context, req ibexcontext.Request) ibexcontext.Result
}

// Config is the proxy's: where to forward, and whose context a request gets
// when it names none.
type Config struct {
	Upstream     *url.URL
	DefaultOrg   string
	DefaultAgent string
	// TrustHeaders lets X-Ibex-Org-Id / X-Ibex-Agent-Id name the tenant: on only
	// behind a gateway that sets them, as the callers would otherwise pick any org.
	TrustHeaders bool
	// MaxBodyBytes bounds a chat completion's body, read whole before the call.
	MaxBodyBytes int64
}

// Proxy forwards every request to the upstream, a chat completion with its
// messages assembled by ibex-context when it can be (and as it came otherwise).
type Proxy struct {
	cfg       Config
	assembler Assembler
	log       *slog.Logger
	forward   *httputil.ReverseProxy
	// lastWarned (unix nanoseconds) throttles the fallback warnings: a service
	// that is down would otherwise log a line per request.
	lastWarned atomic.Int64
}

// warnEvery is the most often a fallback is logged (the LiteLLM hook's period).
const warnEvery = 10 * time.Second

// NewProxy forwards to cfg.Upstream; the upstream's answers, SSE streams
// included, go back unchanged and unbuffered.
func NewProxy(cfg Config, assembler Assembler, log *slog.Logger) *Proxy {
	p := &Proxy{cfg: cfg, assembler: assembler, log: log}
	p.forward = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(cfg.Upstream) // the upstream's Host too: a hosted API routes by it
			// The tenant headers are the proxy's, not the model's.
			for _, name := range []string{headerOrg, headerAgent, headerSession} {
				r.Out.Header.Del(name)
			}
		},
		FlushInterval: -1, // every write of the upstream's goes out at once (token streams)
		ModifyResponse: func(resp *http.Response) error {
			// Only the proxy says what happened to the context.
			resp.Header.Del(OutcomeHeader)
			resp.Header.Del(ElapsedHeader)
			return nil
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return p
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != chatCompletionsPath {
		p.forward.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body over the proxy's limit of %d bytes (-max-body-bytes)", p.cfg.MaxBodyBytes),
				http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the request body failed", http.StatusBadRequest)
		return
	}
	body, outcome, elapsed := p.assemble(r, body)
	w.Header().Set(OutcomeHeader, outcome)
	if elapsed != "" {
		w.Header().Set(ElapsedHeader, elapsed)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length") // the transport writes the new length
	p.forward.ServeHTTP(w, r)
}

// assemble returns the body to forward, the outcome and the call's wall time
// (empty when no call was made).
func (p *Proxy) assemble(r *http.Request, body []byte) ([]byte, string, string) {
	completion, messages, ok := parseCompletion(body)
	if !ok {
		return body, outcomeSkipped, ""
	}
	org, agent := p.tenant(r.Header)
	if org == "" || agent == "" {
		return body, outcomeSkipped, ""
	}
	var model string
	_ = json.Unmarshal(completion["model"], &model)
	result := p.assembler.Assemble(r.Context(), ibexcontext.Request{
		OrgID:     org,
		AgentID:   agent,
		SessionID: strings.TrimSpace(r.Header.Get(headerSession)),
		Model:     model,
		RequestID: r.Header.Get(headerRequestID),
		Messages:  messages,
	})
	elapsed := fmt.Sprintf("%.2f", float64(result.Elapsed.Microseconds())/1000)
	if !result.FromService {
		p.warnFallback(result.FallbackReason)
		return body, "fallback:" + result.FallbackReason, elapsed
	}
	outcome := "assembled"
	if result.Degraded() {
		outcome = "degraded:" + result.FallbackReason
	}
	replaced, err := replaceMessages(completion, result.Messages)
	if err != nil { // cannot happen for strings; the request goes out as it came
		return body, "fallback:encode", elapsed
	}
	return replaced, outcome, elapsed
}

// warnFallback logs a fallback's reason (only: the error may quote a rejected
// id), at most once per warnEvery.
func (p *Proxy) warnFallback(reason string) {
	now, last := time.Now().UnixNano(), p.lastWarned.Load()
	if now-last < int64(warnEvery) || !p.lastWarned.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn("context assembly fell back; requests go out as they came", "reason", reason,
		"quiet_for", warnEvery.String())
}

// tenant is whose context the request gets: the headers when trusted, else the defaults.
func (p *Proxy) tenant(h http.Header) (org, agent string) {
	org, agent = p.cfg.DefaultOrg, p.cfg.DefaultAgent
	if p.cfg.TrustHeaders {
		if v := strings.TrimSpace(h.Get(headerOrg)); v != "" {
			org = v
		}
		if v := strings.TrimSpace(h.Get(headerAgent)); v != "" {
			agent = v
		}
	}
	return org, agent
}

// parseCompletion returns the body's fields and its messages as the service
// takes them, or false when the body is not a JSON object or a message carries
// more than a known role and its text (tool calls, images, a name): replacing
// such messages with the service's would drop what the model needs.
func parseCompletion(body []byte) (map[string]json.RawMessage, []*contextv1.Message, bool) {
	var completion map[string]json.RawMessage
	if err := json.Unmarshal(body, &completion); err != nil {
		return nil, nil, false
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(completion["messages"], &raw); err != nil || len(raw) == 0 {
		return nil, nil, false
	}
	messages := make([]*contextv1.Message, 0, len(raw))
	for _, fields := range raw {
		if len(fields) != 2 {
			return nil, nil, false
		}
		var role, content string
		if json.Unmarshal(fields["role"], &role) != nil || !roles[role] {
			return nil, nil, false
		}
		// A string only: a list of parts (images, audio) is not plain text.
		if len(fields["content"]) == 0 || fields["content"][0] != '"' || json.Unmarshal(fields["content"], &content) != nil {
			return nil, nil, false
		}
		messages = append(messages, &contextv1.Message{Role: role, Content: content})
	}
	return completion, messages, true
}

type plainMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// replaceMessages is the body with the assembled messages; every other field as it came.
func replaceMessages(completion map[string]json.RawMessage, messages []*contextv1.Message) ([]byte, error) {
	plain := make([]plainMessage, len(messages))
	for i, m := range messages {
		plain[i] = plainMessage{Role: m.GetRole(), Content: m.GetContent()}
	}
	encoded, err := json.Marshal(plain)
	if err != nil {
		return nil, err
	}
	out := make(map[string]json.RawMessage, len(completion))
	for k, v := range completion {
		out[k] = v
	}
	out["messages"] = encoded
	return json.Marshal(out)
}

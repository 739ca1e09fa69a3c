//go:build integration

package main

// The proxy in front of a recording upstream, with the real Python service
// (`ibex-context dev` and its demo tenants, started through internal/devservice).
// Run: go test -tags integration ./... (scripts/test-go does).

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
	"github.com/ibex-context/ibex-context/clients/go/internal/devservice"
)

// attempts bounds the requests sent until one is assembled in full: on a
// loaded machine the service may degrade a call (and say so) instead of failing it.
const attempts = 3

func TestProxyAgainstTheRealService(t *testing.T) {
	service := devservice.Start(t)
	target := "dns:///localhost:" + service.Port
	upstream := startUpstream(t, nil)
	tenant := map[string]string{headerOrg: devservice.DemoOrg, headerAgent: devservice.DemoAgent}
	question, err := json.Marshal(devservice.DemoQuestion)
	if err != nil {
		t.Fatal(err)
	}
	completion := `{"model":"gpt-4o","messages":[{"role":"user","content":` + string(question) + `}]}`
	patient := startProxy(t, upstream, target, Config{TrustHeaders: true}, ibexcontext.WithTimeout(generous))
	capped := startProxy(t, upstream, target, Config{TrustHeaders: true}) // the 45 ms default

	t.Run("the upstream receives the demo's directive and the memory about the dog", func(t *testing.T) {
		var outcomes []string
		for range attempts {
			resp := post(t, patient, completion, tenant)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			outcome := resp.Header.Get(OutcomeHeader)
			if outcome != "assembled" {
				outcomes = append(outcomes, outcome)
				continue
			}
			body, _ := upstream.last(t)
			messages := sentMessages(t, body)
			system, _ := messages[0]["content"].(string)
			if len(messages) != 2 || messages[0]["role"] != "system" || messages[1]["content"] != devservice.DemoQuestion {
				t.Fatalf("the upstream received %v, want a system message and the question", messages)
			}
			if !strings.Contains(system, devservice.DemoDirective) || !strings.Contains(system, devservice.DemoMemory) {
				t.Errorf("the system message lacks the directive or the dog: %q", system)
			}
			return
		}
		t.Fatalf("no request assembled in full in %d: %v", attempts, outcomes)
	})

	t.Run("hung past the 45 ms cap: the request goes out as it came", func(t *testing.T) {
		service.Signal(t, syscall.SIGSTOP)
		defer service.Signal(t, syscall.SIGCONT)

		resp := post(t, capped, completion, tenant)

		if got := resp.Header.Get(OutcomeHeader); resp.StatusCode != http.StatusOK || got != "fallback:"+ibexcontext.ReasonTimeout {
			t.Errorf("status %d, %s %q, want 200 and fallback:%s", resp.StatusCode, OutcomeHeader, got, ibexcontext.ReasonTimeout)
		}
		if body, _ := upstream.last(t); string(body) != completion {
			t.Errorf("the upstream received %q, want the request as it came", body)
		}
	})

	t.Run("down: the request goes out as it came", func(t *testing.T) {
		service.ShutDown(t)

		resp := post(t, patient, completion, tenant)

		if got := resp.Header.Get(OutcomeHeader); resp.StatusCode != http.StatusOK || got != "fallback:"+ibexcontext.ReasonUnavailable {
			t.Errorf("status %d, %s %q, want 200 and fallback:%s", resp.StatusCode, OutcomeHeader, got, ibexcontext.ReasonUnavailable)
		}
		if body, _ := upstream.last(t); string(body) != completion {
			t.Errorf("the upstream received %q, want the request as it came", body)
		}
	})
}

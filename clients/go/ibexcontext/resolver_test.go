package ibexcontext

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// testDNS is an authoritative DNS server on a real UDP socket: A queries for
// the names it knows get their addresses (TTL 0), SERVFAIL while failing.
type testDNS struct {
	conn      net.PacketConn
	mu        sync.Mutex
	addresses map[string][]string // name (with the trailing dot) -> IPv4 addresses
	failing   bool
	queries   int
}

func startDNS(t *testing.T) *testDNS {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &testDNS{conn: conn, addresses: map[string][]string{}}
	go server.serve()
	t.Cleanup(func() { _ = conn.Close() })
	return server
}

func (s *testDNS) set(name string, addresses ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addresses[name+"."] = addresses
}

func (s *testDNS) fail(failing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = failing
}

func (s *testDNS) queryCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

func (s *testDNS) serve() {
	buffer := make([]byte, 1500)
	for {
		n, peer, err := s.conn.ReadFrom(buffer)
		if err != nil {
			return
		}
		var query dnsmessage.Message
		if query.Unpack(buffer[:n]) != nil || len(query.Questions) == 0 {
			continue
		}
		if reply, err := s.answer(query); err == nil {
			_, _ = s.conn.WriteTo(reply, peer)
		}
	}
}

func (s *testDNS) answer(query dnsmessage.Message) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries++
	question := query.Questions[0]
	reply := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: query.ID, Response: true, Authoritative: true},
		Questions: query.Questions,
	}
	addresses, known := s.addresses[question.Name.String()]
	switch {
	case s.failing:
		reply.RCode = dnsmessage.RCodeServerFailure
	case !known:
		reply.RCode = dnsmessage.RCodeNameError
	case question.Type == dnsmessage.TypeA:
		for _, address := range addresses {
			var a dnsmessage.AResource
			copy(a.A[:], net.ParseIP(address).To4())
			reply.Answers = append(reply.Answers, dnsmessage.Resource{
				Header: dnsmessage.ResourceHeader{Name: question.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
				Body:   &a,
			})
		}
	}
	return reply.Pack()
}

// startOn serves a scriptedService on host (a loopback address) at port.
func startOn(t *testing.T, host, port string) *scriptedService {
	t.Helper()
	service, _ := startScriptedAt(t, net.JoinHostPort(host, port))
	return service
}

// callUntil calls until done() holds or a bounded wait ends; every call must be answered.
func callUntil(t *testing.T, client *ContextClient, done func() bool) bool {
	t.Helper()
	until := time.Now().Add(generous)
	for !done() {
		if time.Now().After(until) {
			return false
		}
		if result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")}); !result.FromService {
			t.Fatalf("a call fell back: %s (%v)", result.FallbackReason, result.Err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

const podName = "ibex-context-headless.test"

func TestADNSTargetIsResolvedAgainSoAddedPodsGetCallsAndGoneOnesNone(t *testing.T) {
	first, port := startScripted(t)
	_, port, _ = net.SplitHostPort(port)
	second := startOn(t, "127.0.0.2", port)
	dns := startDNS(t)
	dns.set(podName, "127.0.0.1")
	client := newTestClient(t, "dns://"+dns.conn.LocalAddr().String()+"/"+podName+":"+port,
		WithTimeout(generous), WithResolveEvery(100*time.Millisecond))
	waitReady(t, client)
	if !callUntil(t, client, func() bool { return len(first.seen()) >= 3 }) {
		t.Fatal("the first pod got no calls")
	}
	if got := len(second.seen()); got != 0 {
		t.Fatalf("the pod not yet in DNS got %d calls", got)
	}

	dns.set(podName, "127.0.0.1", "127.0.0.2") // the HPA added a pod

	if !callUntil(t, client, func() bool { return len(second.seen()) > 0 }) {
		t.Fatal("the added pod got no call: the name was not resolved again")
	}

	dns.set(podName, "127.0.0.2") // the first pod is gone from the name

	// Once resolved again, every call goes to the second pod: 20 in a row do.
	inARow, before := 0, len(first.seen())
	retired := callUntil(t, client, func() bool {
		if now := len(first.seen()); now != before {
			inARow, before = 0, now
		} else {
			inARow++
		}
		return inARow > 20
	})
	if !retired {
		t.Error("the pod no longer in DNS kept getting calls")
	}
}

func TestAFailingLookupKeepsTheAddressesItHad(t *testing.T) {
	service, address := startScripted(t)
	_, port, _ := net.SplitHostPort(address)
	dns := startDNS(t)
	dns.set(podName, "127.0.0.1")
	client := newTestClient(t, "dns://"+dns.conn.LocalAddr().String()+"/"+podName+":"+port,
		WithTimeout(generous), WithResolveEvery(50*time.Millisecond))
	waitReady(t, client)

	dns.fail(true)
	failedFrom := dns.queryCount()
	for i := 0; i < 10; i++ {
		if result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")}); !result.FromService {
			t.Fatalf("call %d fell back while DNS failed: %s (%v)", i, result.FallbackReason, result.Err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	if dns.queryCount() == failedFrom {
		t.Error("no lookup was tried while DNS failed")
	}
	if got := len(service.seen()); got < 10 {
		t.Errorf("the pod answered %d calls, want 10", got)
	}
}

func TestANameThatNeverResolvesFailsCallsAsUnavailable(t *testing.T) {
	dns := startDNS(t)
	client := newTestClient(t, "dns://"+dns.conn.LocalAddr().String()+"/nowhere.test:50051", WithTimeout(generous))

	result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: userMessages("hi")})

	if result.FallbackReason != ReasonUnavailable {
		t.Errorf("FallbackReason = %q (%v), want %q", result.FallbackReason, result.Err, ReasonUnavailable)
	}
}

func TestTargetsWithoutAPortGetTheServicesPort(t *testing.T) {
	tests := map[string][2]string{
		"name":           {"name", "50051"},
		"name:443":       {"name", "443"},
		"[::1]":          {"::1", "50051"},
		"[::1]:9000":     {"::1", "9000"},
		"10.0.0.1":       {"10.0.0.1", "50051"},
		"pods.svc:50051": {"pods.svc", "50051"},
	}
	for endpoint, want := range tests {
		host, port, err := splitHostPort(endpoint)
		if err != nil || host != want[0] || port != want[1] {
			t.Errorf("splitHostPort(%q) = %q, %q, %v; want %q, %q", endpoint, host, port, err, want[0], want[1])
		}
	}
	if _, _, err := splitHostPort(":50051"); err == nil {
		t.Error("an endpoint without a host was accepted")
	}
}

func TestTheResolvePeriodMustBePositive(t *testing.T) {
	if client, err := NewContextClient("dns:///name:50051", WithResolveEvery(0)); err == nil {
		_ = client.Close()
		t.Error("a zero period was accepted")
	}
}

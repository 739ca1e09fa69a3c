// Package devservice starts the real Python service for the Go integration
// tests (build tag integration): `ibex-context dev` (embedded Redis and
// PostgreSQL+pgvector, the demo tenants, the MiniLM embedder) in a process
// group of its own. IBEX_CONTEXT_BIN names the command (default: ibex-context
// on PATH); scripts/test-go sets it.
package devservice

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The demo's Acme Travel support agent (service/ibex_context/devtools/demo),
// its paraphrased question, whose answer is the memory about the dog (found by
// meaning: no word in common), and a phrase of its directive.
const (
	DemoOrg       = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
	DemoAgent     = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"
	DemoQuestion  = "Can my furry companion come on board with me to Berlin next month?"
	DemoMemory    = "service dog, Miso"
	DemoDirective = "Acme Travel's support assistant"
)

const (
	startupLimit = 300 * time.Second
	exitLimit    = 60 * time.Second
)

var servingLine = regexp.MustCompile(`serving gRPC on 127\.0\.0\.1:(\d+)`)

// Service is `ibex-context dev`, stopped when the test ends.
type Service struct {
	// Port is the gRPC port it serves on, on 127.0.0.1.
	Port   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	output []string // the last lines it printed, for failures
	exited chan struct{}
}

// Start runs `ibex-context dev` with env added to this process's environment
// and waits (at most 300 s: the first run downloads nothing but starts the
// stores and loads the embedder) until it serves gRPC.
func Start(t *testing.T, env ...string) *Service {
	t.Helper()
	bin := os.Getenv("IBEX_CONTEXT_BIN")
	if bin == "" {
		bin = "ibex-context"
	}
	cmd := exec.Command(bin, "dev", "--data-dir", t.TempDir())
	cmd.Env = append(append(os.Environ(), "IBEX_GRPC_PORT=0", "IBEX_METRICS_PORT=0", "IBEX_LOG_FORMAT=text"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v (set IBEX_CONTEXT_BIN, or put .venv/bin on PATH)", bin, err)
	}
	service := &Service{cmd: cmd, exited: make(chan struct{})}
	ports := make(chan string, 1)
	go service.read(stdout, ports)
	go func() { _ = cmd.Wait(); close(service.exited) }()
	t.Cleanup(func() { service.stop(t) })

	select {
	case service.Port = <-ports:
		return service
	case <-service.exited:
		t.Fatalf("ibex-context dev exited before serving:\n%s", service.Tail())
	case <-time.After(startupLimit):
		t.Fatalf("ibex-context dev did not serve within %v:\n%s", startupLimit, service.Tail())
	}
	return nil
}

func (s *Service) read(stdout io.Reader, ports chan<- string) {
	scanner := bufio.NewScanner(stdout)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		s.mu.Lock()
		s.output = append(s.output, line)
		if len(s.output) > 60 {
			s.output = s.output[1:]
		}
		s.mu.Unlock()
		if match := servingLine.FindStringSubmatch(line); match != nil {
			select {
			case ports <- match[1]:
			default:
			}
		}
	}
}

// Tail is the last lines the service printed.
func (s *Service) Tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.output, "\n")
}

// Signal sends sig to the service (SIGSTOP freezes it: a hung service).
func (s *Service) Signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// ShutDown stops the service as Kubernetes does (SIGTERM) and waits for it.
func (s *Service) ShutDown(t *testing.T) {
	t.Helper()
	s.Signal(t, syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(exitLimit):
		t.Fatalf("ibex-context dev still running %v after SIGTERM:\n%s", exitLimit, s.Tail())
	}
}

// stop ends the service and the stores it started, whatever state it is in.
func (s *Service) stop(t *testing.T) {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(exitLimit):
		t.Errorf("ibex-context dev ignored SIGTERM; killing its process group")
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

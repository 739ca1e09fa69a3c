// Command callloop calls AssembleContext through ibexcontext.ContextClient, with
// the client's defaults, until its standard input closes: the Go side of the
// rebalancing test (tests/client/test_rebalancing.py), which counts on its
// servers which pods got calls from it. It prints a line per call that fell
// back, with when.
//
//	callloop -target dns://127.0.0.1:5353/ibex-context-headless.test:50051 [-every 20ms]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ibex-context/ibex-context/clients/go/contextv1"
	"github.com/ibex-context/ibex-context/clients/go/ibexcontext"
)

func main() {
	target := flag.String("target", "", "the service, e.g. dns:///name:50051")
	every := flag.Duration("every", 20*time.Millisecond, "pause between calls")
	timeout := flag.Duration("timeout", 5*time.Second, "each call's deadline")
	flag.Parse()

	client, err := ibexcontext.NewContextClient(*target, ibexcontext.WithTimeout(*timeout))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer client.Close()

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	request := ibexcontext.Request{
		OrgID: "org", AgentID: "agent", Model: "gpt-4o", RequestID: "callloop",
		Messages: []*contextv1.Message{{Role: "user", Content: "What do I drink?"}},
	}
	started := time.Now()
	ticker := time.NewTicker(*every)
	defer ticker.Stop()
	for {
		select {
		case <-stdinClosed:
			return
		case <-ticker.C:
		}
		if result := client.Assemble(context.Background(), request); !result.FromService {
			fmt.Printf("fell back %.1f s after the start, after %v: %s (%v)\n",
				time.Since(started).Seconds(), result.Elapsed, result.FallbackReason, result.Err)
		}
	}
}

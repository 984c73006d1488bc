// Command tenantrepro measures what one client can take from the others in
// a scope, against a sidecar binary it starts (any build, so that two can be
// compared):
//
//	go run ./scripts/tenantrepro -sidecar BINARY priority
//	go run ./scripts/tenantrepro -sidecar BINARY -aging 1s priority
//	go run ./scripts/tenantrepro -sidecar BINARY maxlive
//	go run ./scripts/tenantrepro -sidecar BINARY -tenants maxlive
//
// priority: 8 callers asking priority 2147483647 and 8 asking 0 loop
// Pick, a 20 ms attempt, RecordOutcome for 12 s on one source of
// max_concurrency 4 (every caller names no tenant); it prints each group's
// grants.
//
// maxlive: one client opens calls and never settles them (at most 10 000,
// at most 10 s), then another client opens 10; it prints what each got.
// With -tenants each client has a tenant token, and the scope gives each
// tenant max_live_calls 1000 (a sidecar that does not know tenant tokens
// refuses that configuration).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

func main() {
	sidecar := flag.String("sidecar", "", "the sidecar binary to start")
	aging := flag.Duration("aging", 0, "priority: the scope's priority_aging (0: none)")
	tenants := flag.Bool("tenants", false, "maxlive: a tenant token per client, max_live_calls 1000 per tenant")
	flag.Parse()
	if *sidecar == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tenantrepro -sidecar BINARY [-aging D] [-tenants] priority|maxlive")
		os.Exit(2)
	}
	var err error
	switch flag.Arg(0) {
	case "priority":
		err = priority(*sidecar, *aging)
	case "maxlive":
		err = maxLive(*sidecar, *tenants)
	default:
		err = fmt.Errorf("unknown scenario %q", flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// start runs the sidecar binary on a free port with config and returns a
// client of it, and a function that stops it.
func start(binary, config string) (admissionv1.AdmissionServiceClient, func(), error) {
	dir, err := os.MkdirTemp("", "tenantrepro-")
	if err != nil {
		return nil, nil, err
	}
	file := filepath.Join(dir, "polygate.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--config", file, "--log-level", "error")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	sc := bufio.NewScanner(out)
	addr := ""
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "polygate listening on "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		stop()
		return nil, nil, fmt.Errorf("the sidecar did not start")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return admissionv1.NewAdmissionServiceClient(conn), func() { conn.Close(); stop() }, nil
}

func priority(binary string, aging time.Duration) error {
	config := "scopes:\n  chat:\n    backpressure: {poll_interval: 50ms}\n    sources: [{name: only, max_concurrency: 4}]\n"
	if aging > 0 {
		config = strings.Replace(config, "    sources:", fmt.Sprintf("    priority_aging: %v\n    sources:", aging), 1)
	}
	c, stop, err := start(binary, config)
	if err != nil {
		return err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	var high, low atomic.Int64
	var wg sync.WaitGroup
	caller := func(prio int32, grants *atomic.Int64) {
		defer wg.Done()
		for ctx.Err() == nil {
			req := &admissionv1.PickRequest{Scope: "chat", Priority: prio}
			for ctx.Err() == nil {
				p, err := c.Pick(ctx, req)
				if err != nil {
					return
				}
				if g := p.GetGrant(); g != nil {
					grants.Add(1)
					time.Sleep(20 * time.Millisecond)
					_, _ = c.RecordOutcome(context.Background(), &admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: p.GetCallId(),
						PermitId: g.GetPermitId(), Outcome: admissionv1.Outcome_OUTCOME_SUCCESS})
					break
				}
				if _, err := c.OnNoRunnable(ctx, &admissionv1.OnNoRunnableRequest{Scope: "chat", CallId: p.GetCallId()}); err != nil {
					return
				}
				req = &admissionv1.PickRequest{Scope: "chat", CallId: p.GetCallId()}
			}
		}
	}
	for range 8 {
		wg.Add(2)
		go caller(math.MaxInt32, &high)
		go caller(0, &low)
	}
	wg.Wait()
	fmt.Printf("priority_aging %v: grants to priority 2147483647: %d, to priority 0: %d\n", aging, high.Load(), low.Load())
	return nil
}

func maxLive(binary string, tenants bool) error {
	config := "scopes:\n  chat:\n    sources: [{name: only, max_concurrency: 100000}]\n"
	abuser, victim := context.Background(), context.Background()
	if tenants {
		config = "auth:\n  tenant_tokens: [{tenant: abuser, token: abuser-token}, {tenant: victim, token: victim-token}]\n" +
			"scopes:\n  chat:\n    tenants: {abuser: {max_live_calls: 1000}, victim: {max_live_calls: 1000}}\n" +
			"    sources: [{name: only, max_concurrency: 100000}]\n"
		abuser = metadata.AppendToOutgoingContext(abuser, "authorization", "Bearer abuser-token")
		victim = metadata.AppendToOutgoingContext(victim, "authorization", "Bearer victim-token")
	}
	c, stop, err := start(binary, config)
	if err != nil {
		return err
	}
	defer stop()
	count := func(ctx context.Context, n int, within time.Duration) map[string]int {
		out := map[string]int{}
		deadline := time.Now().Add(within)
		for i := 0; i < n && time.Now().Before(deadline); i++ {
			_, err := c.Pick(ctx, &admissionv1.PickRequest{Scope: "chat"})
			key := "OK"
			if err != nil {
				st := status.Convert(err)
				key = st.Code().String()
				for _, d := range st.Details() {
					if info, ok := d.(*errdetails.ErrorInfo); ok {
						key += " " + info.GetReason()
					}
				}
			}
			out[key]++
		}
		return out
	}
	fmt.Printf("tenants %v: the first client's 10 000 unsettled calls: %v\n", tenants, count(abuser, 10000, 10*time.Second))
	fmt.Printf("tenants %v: then another client's 10 calls: %v\n", tenants, count(victim, 10, time.Minute))
	return nil
}

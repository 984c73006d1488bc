package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// The peer: envoy's ratelimit service (github.com/envoyproxy/ratelimit,
// pinned in tools/ratelimit/go.mod), started against the bench's
// redis-server with its settings at their defaults, and driven with
// ShouldRateLimit on one descriptor no limit refuses. What Redis spends per
// decision for it is the yardstick of polygate's attempt cycle on Redis,
// which is to cost the shared Redis at most twice as much. Its API is spoken with protowire and a raw-bytes codec, not
// go-control-plane's generated code, which would bring envoy's dependencies
// into the main module.

const (
	opDecide op = "decide" // envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit

	shouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// The peer's configuration: one domain, one descriptor (key, value).
	peerDomain = "polybench"
	peerKey    = "bench"
	peerValue  = "only"
	// peerLimit is the descriptor's limit per hour, the largest the
	// configuration's uint32 holds: no cell comes near it.
	peerLimit = 4_000_000_000
	// maxDecisionReply bounds a RateLimitResponse read from the peer: one
	// descriptor's status is a few tens of bytes.
	maxDecisionReply = 4096
)

// decisionRequest is the RateLimitRequest every decision sends, encoded
// once: domain (1), one descriptor (2) with one entry (1: key 1, value 2),
// hits_addend (3) 1.
var decisionRequest = func() []byte {
	var entry, desc, req []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, peerKey)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, peerValue)
	desc = protowire.AppendTag(desc, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, peerDomain)
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	req = protowire.AppendBytes(req, desc)
	req = protowire.AppendTag(req, 3, protowire.VarintType)
	req = protowire.AppendVarint(req, 1)
	return req
}()

// Codes of RateLimitResponse.overall_code (RateLimitResponse.Code).
const (
	codeOK        = 1
	codeOverLimit = 2
)

// decisionOf reads a RateLimitResponse: overall_code (field 1, a varint),
// and whether every descriptor's status (statuses, field 2) names the limit
// it was counted against (current_limit, its field 2). The service answers
// OK without a current_limit, and without asking Redis, for a descriptor
// that matches no limit of its configuration: such a decision measures
// nothing. Other fields are skipped; a reply that does not parse, or has no
// overall_code, is an error.
func decisionOf(b []byte) (code uint64, limited bool, err error) {
	seen, statuses, withLimit := false, 0, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false, fmt.Errorf("RateLimitResponse: bad tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false, fmt.Errorf("RateLimitResponse: overall_code: %w", protowire.ParseError(n))
			}
			code, seen, b = v, true, b[n:]
		case num == 1:
			return 0, false, fmt.Errorf("RateLimitResponse: overall_code has wire type %d, want a varint", typ)
		case num == 2 && typ == protowire.BytesType:
			st, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, false, fmt.Errorf("RateLimitResponse: statuses: %w", protowire.ParseError(n))
			}
			b = b[n:]
			has, err := hasField(st, 2, protowire.BytesType)
			if err != nil {
				return 0, false, fmt.Errorf("RateLimitResponse: statuses: %w", err)
			}
			statuses++
			if has {
				withLimit++
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, false, fmt.Errorf("RateLimitResponse: field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if !seen {
		return 0, false, errors.New("RateLimitResponse: no overall_code")
	}
	return code, statuses > 0 && withLimit == statuses, nil
}

// hasField reports whether message b has field num of wire type typ,
// checking that all of b parses.
func hasField(b []byte, num protowire.Number, typ protowire.Type) (bool, error) {
	has := false
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return false, protowire.ParseError(l)
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(n, t, b)
		if l < 0 {
			return false, fmt.Errorf("field %d: %w", n, protowire.ParseError(l))
		}
		b = b[l:]
		has = has || (n == num && t == typ)
	}
	return has, nil
}

// decide sends one decision on conn k and checks it was allowed, counted
// against the configured limit.
func (c *client) decide(ctx context.Context, k int) error {
	var reply []byte
	if err := c.conns[k].Invoke(ctx, shouldRateLimitMethod, decisionRequest, &reply,
		grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(maxDecisionReply)); err != nil {
		return err
	}
	code, limited, err := decisionOf(reply)
	if err != nil {
		return err
	}
	if code != codeOK {
		name := "UNKNOWN"
		if code == codeOverLimit {
			name = "OVER_LIMIT"
		}
		return fmt.Errorf("ShouldRateLimit answered overall_code %d (%s), want OK", code, name)
	}
	if !limited {
		return errors.New("ShouldRateLimit answered OK with no current_limit: the descriptor matched no limit of the service's configuration, and nothing was counted in Redis")
	}
	return nil
}

// rawCodec sends a []byte as the message and reads the reply into a
// *[]byte: the bytes are protobuf, encoded and read with protowire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: marshal %T, want []byte", v)
	}
	return b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: unmarshal into %T, want *[]byte", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

// Name is the content-subtype the call announces: the bytes are protobuf.
func (rawCodec) Name() string { return "proto" }

// peerConfig is the peer's configuration file: one domain, one descriptor
// with limit requests per hour.
func peerConfig(limit uint32) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: %s
    value: %s
    rate_limit:
      unit: hour
      requests_per_unit: %d
`, peerDomain, peerKey, peerValue, limit)
}

// startRatelimit starts envoy's ratelimit service (bin) against the
// redis-server at redisAddr, its configuration under dir/ratelimit/config,
// its log in dir/ratelimit.log, and waits until it answers a decision OK.
// Its environment holds only what it needs to run here (where Redis is,
// where its configuration is, free loopback ports, no statsd to send to),
// then env (NAME=VALUE, later ones win): nothing of polybench's own
// environment, so every other setting is the service's default unless env
// says otherwise: the Redis pool (10 connections, shared: a decision's
// INCRBY and EXPIRE go to a random one, written together with whatever
// other decisions are on it), no write buffering (REDIS_PIPELINE_WINDOW
// applies to clusters only), the expiry jitter, no local cache.
func startRatelimit(ctx context.Context, bin, redisAddr, dir string, limit uint32, env []string) (*process, error) {
	cfgDir := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "polybench.yaml"), []byte(peerConfig(limit)), 0o600); err != nil {
		return nil, err
	}
	var err error
	// A port found free may be taken before the service binds it: try
	// again. (It binds with SO_REUSEPORT: a port another ratelimit service
	// took meanwhile would be shared, not refused. Rare: the ports come
	// from bind :0 just before.)
	for range 3 {
		var p *process
		if p, err = launchRatelimit(ctx, bin, redisAddr, dir, env); err == nil || !errors.Is(err, errPeerExited) {
			return p, err
		}
	}
	return nil, err
}

var errPeerExited = errors.New("exited")

func launchRatelimit(ctx context.Context, bin, redisAddr, dir string, env []string) (*process, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "ratelimit.log")
	// Appended to: a retry's log follows the failed start's.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin)
	cmd.Env = append([]string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=" + ports[0],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[1],
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + ports[2],
	}, env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start ratelimit (%s): %w", bin, err)
	}
	p := &process{name: "ratelimit", cmd: cmd, addr: net.JoinHostPort("127.0.0.1", ports[2]), log: logPath,
		done: make(chan error, 1), metrics: make(chan string, 1)}
	go func() { p.done <- cmd.Wait() }()
	if err := p.awaitDecision(ctx, 30*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// freePorts returns n different free loopback ports: their listeners are all
// open at once, then closed.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

// awaitDecision asks the peer for a decision every 50 ms until one is
// answered OK (it has loaded its configuration and reached Redis), the
// process exits (errPeerExited), or wait passes.
func (p *process) awaitDecision(ctx context.Context, wait time.Duration) error {
	cc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	cl := &client{conns: []*grpc.ClientConn{cc}}
	deadline := time.Now().Add(wait)
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		err = cl.decide(actx, 0)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-p.done:
			p.done <- werr // for stop
			return fmt.Errorf("ratelimit %w before answering a decision: %v (log: %s)", errPeerExited, werr, p.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ratelimit did not answer a decision OK within %v: %v (log: %s)", wait, err, p.log)
		}
	}
}

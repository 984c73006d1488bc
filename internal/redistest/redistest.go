package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartTimeout bounds how long a server or a cluster may take to come up.
const StartTimeout = 20 * time.Second

// Server is one redis-server process on a loopback port. Stop and Start may
// be called again and again: the server comes back on the same port and in
// the same directory, so a test can take it down and bring it back.
type Server struct {
	t    testing.TB
	bin  string
	Addr string
	Port int
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// serverPath is the redis-server the helpers run; tests fail without it.
func serverPath(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server is not installed (install the redis-server package; these tests need a real Redis): %v", err)
	}
	return p
}

// AppendFsyncAlways are the arguments of a server that persists every write
// before answering it (AOF, fsync always): what it acknowledged survives a
// kill -9 and Start.
var AppendFsyncAlways = []string{"--appendonly", "yes", "--appendfsync", "always"}

// Start runs a redis-server with no persistence on a free loopback port,
// waits until it answers PING, and stops it when the test ends. extra are
// further redis-server arguments (for example "--appendonly", "yes").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return startOn(t, false, extra...)
}

func startOn(t testing.TB, bus bool, extra ...string) *Server {
	t.Helper()
	bin := serverPath(t)
	dir := t.TempDir()
	var err error
	// A port found free may be taken before the server binds it: try another.
	for range 5 {
		port := freePort(t, bus)
		s := &Server{t: t, bin: bin, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, dir: dir}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--logfile", "", "--daemonize", "no",
		}, extra...)
		t.Cleanup(s.Stop)
		if err = s.start(); err == nil {
			return s
		}
		if !errors.Is(err, errExited) {
			break
		}
	}
	t.Fatal(err)
	return nil
}

// Start (re)starts the process and waits until it answers PING.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("redistest: %s is already running", s.Addr)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("redistest: stdout of redis-server: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server on %s: %w", s.Addr, err)
	}
	ready := make(chan struct{})
	log := &tail{}
	go func() {
		// The server logs one line once it accepts connections: wait for it
		// rather than for a fixed time.
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			log.add(sc.Text())
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	select {
	case <-ready:
	case <-done:
		s.cmd = nil
		return fmt.Errorf("%w: redis-server on %s exited during start:\n%s", errExited, s.Addr, log)
	case <-time.After(StartTimeout):
		return fmt.Errorf("redistest: redis-server on %s not ready after %v:\n%s", s.Addr, StartTimeout, log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redistest: PING %s after start: %w", s.Addr, err)
	}
	return nil
}

var errExited = errors.New("redistest: redis-server exited")

// Stop kills the process (SIGKILL, as a crash would) and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Pause stops the process with SIGSTOP, as a stalled host or a long fork
// would: connections stay open and commands queue unanswered until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %v to %s, which is not running", sig, s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v to %s: %v", sig, s.Addr, err)
	}
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster is a Redis Cluster of three masters without replicas.
type Cluster struct {
	Servers []*Server
	Addrs   []string
}

// StartCluster starts three cluster-enabled servers, joins them with
// redis-cli --cluster create, and waits until every node says
// cluster_state:ok. The servers stop when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli is not installed (it comes with the redis-server package): %v", err)
	}
	c := &Cluster{}
	for range 3 {
		// The cluster bus listens on port+10000: both must be free.
		s := startOn(t, true, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, s := range c.Servers {
		waitClusterOK(t, ctx, s)
	}
	return c
}

// Client returns a cluster client of the cluster, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func waitClusterOK(t testing.TB, ctx context.Context, s *Server) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		last = fmt.Sprint(info, err)
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: node %s not cluster_state:ok within %v; last CLUSTER INFO: %s", s.Addr, StartTimeout, last)
		case <-tick.C:
		}
	}
}

// freePort finds a loopback port nobody listens on (and, for a cluster node,
// whose bus port, 10000 higher, is free too).
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			_ = l.Close()
			return port
		}
		if port+10000 > 65535 {
			_ = l.Close()
			continue
		}
		lb, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = lb.Close()
		return port
	}
	t.Fatalf("redistest: no free port pair found")
	return 0
}

// tail keeps the last lines a server logged, for failure messages.
type tail struct {
	mu    sync.Mutex
	lines []string
}

func (l *tail) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	if len(l.lines) > 30 {
		l.lines = l.lines[1:]
	}
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/boundedfile"
	"github.com/polygate/polygate/internal/buildinfo"
)

const usageText = `usage: polygatectl [options] COMMAND [ARGS] [options]
       polygatectl --version

commands:
  scopes                       every scope: backend, live calls, each source's breaker state
  describe SCOPE               one scope's sources: breaker state, cooldown left, probe, window
                               counts, quota in use against its limits, pacer ceiling, override
  override SCOPE SOURCE ACTION --reason TEXT [--actor NAME]
                               ACTION: force_open, force_closed, disable, clear or reset
  watch [SCOPE]                one line per event (every scope when none is named) until interrupted

options:
`

// defaultAddr is the sidecar's default listen address.
const defaultAddr = "127.0.0.1:50051"

// Bounds on what the command reads and echoes.
const (
	maxAddrLen      = 1024
	maxTokenFileLen = 64 << 10
	maxTimeout      = time.Hour
	maxEchoLen      = 512 // of a message or free text from the sidecar
)

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// options are the flags every command takes, before or after its name.
type options struct {
	addr       string
	token      string
	tokenFile  string
	tls        bool
	caFile     string
	certFile   string
	keyFile    string
	serverName string
	timeout    time.Duration
	json       bool
	version    bool
}

// register adds the options to fs, with their current values as defaults,
// so that flags given before the command carry over to its own flag set.
func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.addr, "addr", o.addr, "the sidecar's gRPC address: host:port or unix:///path (default: $POLYGATE_ADDR, else 127.0.0.1:50051)")
	fs.StringVar(&o.token, "token", o.token, "bearer token (default: $POLYGATE_TOKEN, else the sidecar's own $POLYGATE_AUTH__OPERATOR_TOKEN or $POLYGATE_AUTH__TOKEN)")
	fs.StringVar(&o.tokenFile, "token-file", o.tokenFile, "read the bearer token from this file")
	fs.BoolVar(&o.tls, "tls", o.tls, "connect with TLS (implied by --ca-file, --cert-file, --key-file, --server-name)")
	fs.StringVar(&o.caFile, "ca-file", o.caFile, "PEM CA certificates that sign the sidecar's certificate (default: the system's)")
	fs.StringVar(&o.certFile, "cert-file", o.certFile, "PEM client certificate, for mTLS (with --key-file)")
	fs.StringVar(&o.keyFile, "key-file", o.keyFile, "PEM client key, for mTLS (with --cert-file)")
	fs.StringVar(&o.serverName, "server-name", o.serverName, "the name the sidecar's certificate must carry (default: the host of --addr)")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "limit on each request (for watch: on opening the stream)")
	fs.BoolVar(&o.json, "json", o.json, "print the sidecar's answer as protojson, every field shown (watch: one object per line)")
	fs.BoolVar(&o.version, "version", o.version, "print polygatectl's version and exit")
}

// run is the whole command; main only supplies the process's arguments,
// environment and streams.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	// The application's variables (POLYGATE_ADDR, POLYGATE_TOKEN) are
	// where the SDKs and the Kubernetes example keep the sidecar's address
	// and token; flags win over them.
	o := &options{addr: defaultAddr, timeout: 10 * time.Second}
	if a := getenv("POLYGATE_ADDR"); a != "" {
		o.addr = a
	}
	top := newFlagSet("polygatectl", o, stderr)
	if err := top.Parse(args); err != nil {
		return flagError(err)
	}
	if o.version {
		_, err := fmt.Fprintln(stdout, buildinfo.Read().Line("polygatectl"))
		return err
	}
	if top.NArg() == 0 {
		top.Usage()
		return usagef("a command is required: scopes, describe, override or watch")
	}
	name, rest := top.Arg(0), top.Args()[1:]
	fs := newFlagSet("polygatectl "+name, o, stderr)
	var reason, actor string
	if name == "override" {
		fs.StringVar(&reason, "reason", "", "why (required; shown by describe, the event stream and the log)")
		fs.StringVar(&actor, "actor", "", "who asks (default: $USER)")
	}
	pos, err := parseInterspersed(fs, rest)
	if err != nil {
		return flagError(err)
	}
	cmd, err := command(name, pos, reason, actor, getenv)
	if err != nil {
		return err
	}
	token, err := o.check(getenv)
	if err != nil {
		return err
	}
	conn, err := o.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	c := &cli{client: admissionv1.NewAdmissionServiceClient(conn), opts: o, stdout: stdout, stderr: stderr}
	return cmd(ctx, c)
}

func newFlagSet(name string, o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	o.register(fs)
	return fs
}

// flagError: -h is not a failure; every other flag error is a usage error
// (the flag package has already printed it with the usage).
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return usageError{err.Error()}
}

// parseInterspersed parses flags wherever they stand among the positional
// arguments ("describe chat --json"), and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// command checks a command's arguments and returns what it does.
func command(name string, args []string, reason, actor string, getenv func(string) string) (func(context.Context, *cli) error, error) {
	switch name {
	case "scopes":
		if len(args) != 0 {
			return nil, usagef("scopes takes no arguments, got %d", len(args))
		}
		return func(ctx context.Context, c *cli) error { return c.scopes(ctx) }, nil
	case "describe":
		if len(args) != 1 {
			return nil, usagef("describe takes one SCOPE, got %d arguments", len(args))
		}
		return func(ctx context.Context, c *cli) error { return c.describe(ctx, args[0]) }, nil
	case "override":
		if len(args) != 3 {
			return nil, usagef("override takes SCOPE SOURCE ACTION, got %d arguments", len(args))
		}
		action, err := parseAction(args[2])
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(reason) == "" {
			return nil, usagef("override: --reason is required (it is shown to whoever looks at the breaker next)")
		}
		if actor == "" {
			actor = getenv("USER")
		}
		if strings.TrimSpace(actor) == "" {
			return nil, usagef("override: --actor is required when $USER is not set")
		}
		req := &admissionv1.OverrideBreakerRequest{Scope: args[0], Source: args[1], Action: action, Actor: actor, Reason: reason}
		return func(ctx context.Context, c *cli) error { return c.override(ctx, req) }, nil
	case "watch":
		if len(args) > 1 {
			return nil, usagef("watch takes at most one SCOPE, got %d arguments", len(args))
		}
		scope := ""
		if len(args) == 1 {
			scope = args[0]
		}
		return func(ctx context.Context, c *cli) error { return c.watch(ctx, scope) }, nil
	}
	return nil, usagef("unknown command %q: want scopes, describe, override or watch", bounded(name, 64))
}

// parseAction accepts force_open, force-open, FORCE_OPEN or
// OVERRIDE_ACTION_FORCE_OPEN.
func parseAction(s string) (admissionv1.OverrideAction, error) {
	name := strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
	name = strings.TrimPrefix(name, "OVERRIDE_ACTION_")
	if v, ok := admissionv1.OverrideAction_value["OVERRIDE_ACTION_"+name]; ok && v != 0 {
		return admissionv1.OverrideAction(v), nil
	}
	return 0, usagef("override: ACTION %q is not allowed; want force_open, force_closed, disable, clear or reset", bounded(s, 64))
}

// check validates the options and returns the token to send ("" for none).
func (o *options) check(getenv func(string) string) (string, error) {
	switch {
	case o.addr == "" || len(o.addr) > maxAddrLen:
		return "", usagef("--addr (or $POLYGATE_ADDR) %q is not allowed; want host:port or unix:///path of at most %d bytes", bounded(o.addr, 64), maxAddrLen)
	case o.timeout <= 0 || o.timeout > maxTimeout:
		return "", usagef("--timeout %s is not allowed; want a duration in (0, %s]", o.timeout, maxTimeout)
	case o.token != "" && o.tokenFile != "":
		return "", usagef("--token and --token-file are exclusive; give one")
	case (o.certFile == "") != (o.keyFile == ""):
		return "", usagef("--cert-file and --key-file go together; give both or neither")
	}
	if o.caFile != "" || o.certFile != "" || o.serverName != "" {
		o.tls = true
	}
	token, from := o.token, "--token"
	if o.tokenFile != "" {
		b, err := boundedfile.Read(o.tokenFile, maxTokenFileLen)
		if err != nil {
			return "", fmt.Errorf("--token-file %s: %w", o.tokenFile, err)
		}
		token, from = strings.TrimSpace(string(b)), "--token-file "+o.tokenFile
		if token == "" {
			return "", fmt.Errorf("--token-file %s is empty", o.tokenFile)
		}
	} else if token == "" {
		// The application's token; else, run inside the sidecar's own
		// container (kubectl exec), the sidecar's tokens, the operator's
		// first: it runs every command, the application's not override and
		// watch when an operator token is set.
		for _, name := range []string{"POLYGATE_TOKEN", "POLYGATE_AUTH__OPERATOR_TOKEN", "POLYGATE_AUTH__TOKEN"} {
			if token = getenv(name); token != "" {
				from = "$" + name
				break
			}
		}
	}
	for _, r := range token {
		if r < 0x21 || r > 0x7e {
			return "", usagef("the token from %s has a character %q that a gRPC header cannot carry; want printable ASCII without spaces", from, r)
		}
	}
	return token, nil
}

// dial returns a client connection; it does not connect yet.
func (o *options) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if o.tls {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.serverName}
		if o.caFile != "" {
			pool, err := boundedfile.CertPool(o.caFile)
			if err != nil {
				return nil, fmt.Errorf("--ca-file %s: %w", o.caFile, err)
			}
			cfg.RootCAs = pool
		}
		if o.certFile != "" {
			cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
			if err != nil {
				return nil, fmt.Errorf("--cert-file/--key-file: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("--addr %q: %w", bounded(o.addr, 64), err)
	}
	return conn, nil
}

// cli runs one command against a connected sidecar.
type cli struct {
	client admissionv1.AdmissionServiceClient
	opts   *options
	stdout io.Writer
	stderr io.Writer
}

// rpcError says what failed, the status code, the sidecar's stable reason
// and its (bounded) message, and what to check for the usual mistakes.
func (c *cli) rpcError(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	code := strings.ToUpper(strcase(st.Code().String()))
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() != "" {
			code += " (" + bounded(strings.TrimPrefix(info.GetReason(), "ERROR_REASON_"), 64) + ")"
		}
	}
	msg := fmt.Sprintf("%s: %s: %s", what, code, bounded(st.Message(), maxEchoLen))
	switch st.Code() {
	case codes.Unavailable:
		msg += fmt.Sprintf("\nis the sidecar running and listening on %s? (--addr or $POLYGATE_ADDR; --tls if it serves TLS)", c.opts.addr)
	case codes.Unauthenticated:
		msg += "\nthe sidecar wants a token: --token, --token-file or $POLYGATE_TOKEN"
	case codes.DeadlineExceeded:
		msg += fmt.Sprintf("\nno answer within --timeout %s", c.opts.timeout)
	}
	return errors.New(msg)
}

// strcase turns "NotFound" into "Not_Found" (upper-cased: NOT_FOUND, as
// the gRPC specification spells codes).
func strcase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// bounded cuts s to at most n bytes (on a rune boundary) and marks the cut.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

func (c *cli) scopes(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.client.ListScopes(ctx, &admissionv1.ListScopesRequest{})
	if err != nil {
		return c.rpcError("scopes", err)
	}
	if c.opts.json {
		return printJSON(c.stdout, resp)
	}
	return printScopes(c.stdout, resp.GetScopes())
}

func (c *cli) describe(ctx context.Context, scope string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.client.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: scope})
	if err != nil {
		return c.rpcError(fmt.Sprintf("describe %q", bounded(scope, 64)), err)
	}
	if c.opts.json {
		return printJSON(c.stdout, resp)
	}
	return printScope(c.stdout, resp.GetScope())
}

func (c *cli) override(ctx context.Context, req *admissionv1.OverrideBreakerRequest) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.client.OverrideBreaker(ctx, req)
	if err != nil {
		return c.rpcError(fmt.Sprintf("override %q %q", bounded(req.Scope, 64), bounded(req.Source, 64)), err)
	}
	if c.opts.json {
		return printJSON(c.stdout, resp)
	}
	return printBreakers(c.stdout, []*admissionv1.SourceState{resp.GetSource()})
}

// watch prints one line per event until ctx ends (an interrupt) or the
// sidecar ends the stream. --timeout bounds only the opening of the stream.
func (c *cli) watch(ctx context.Context, scope string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	what := "watch"
	if scope != "" {
		what = fmt.Sprintf("watch %q", bounded(scope, 64))
	}
	stream, err := c.client.WatchEvents(ctx, &admissionv1.WatchEventsRequest{Scope: scope})
	if err != nil {
		return c.rpcError(what, err)
	}
	late := time.AfterFunc(c.opts.timeout, cancel)
	header, err := stream.Header()
	if !late.Stop() {
		err = status.Error(codes.DeadlineExceeded, "the stream did not open")
	}
	if err == nil && header == nil {
		// No headers: the sidecar refused the watch at once (an unknown
		// scope, a wrong token); Recv has its status.
		_, err = stream.Recv()
	}
	if err != nil {
		return c.rpcError(what, err)
	}
	if scope == "" {
		fmt.Fprintln(c.stderr, "watching every scope; interrupt to stop")
	} else {
		fmt.Fprintf(c.stderr, "watching scope %s; interrupt to stop\n", bounded(scope, 64))
	}
	for {
		ev, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			fmt.Fprintln(c.stderr, "the sidecar ended the stream")
			return nil
		case err != nil && ctx.Err() != nil:
			return nil // interrupted
		case err != nil:
			// A status the server sent at the end of the stream, e.g. the
			// scope is unknown or the token is wrong.
			return c.rpcError(what, err)
		}
		if c.opts.json {
			err = printJSONLine(c.stdout, ev)
		} else {
			_, err = fmt.Fprintln(c.stdout, eventLine(ev))
		}
		if err != nil {
			return err
		}
	}
}

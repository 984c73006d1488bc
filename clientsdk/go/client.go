package polygate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Client asks a polygate sidecar for admission. It is safe for concurrent use.
type Client struct {
	rpc  admissionv1.AdmissionServiceClient
	conn *grpc.ClientConn  // nil when the connection is the caller's
	call []grpc.CallOption // sent with every RPC: the token's credentials
	tr   trace.Tracer

	watch *watch // what a call does when the sidecar is unreachable

	priority int32  // every call's, unless WithPriority
	tenant   string // every call's, unless WithTenant
}

// Option configures a Client.
type Option func(*clientConfig)

type clientConfig struct {
	token    string
	tokenSet bool // WithToken was given, even ""
	tls      *tls.Config
	caFile   string
	dial     []grpc.DialOption

	priority int32
	tenant   string

	tracerProvider trace.TracerProvider

	mode      SidecarUnavailable
	fallbacks map[string]Attempt
	logger    *slog.Logger
}

// WithDefaultPriority is every call's priority unless the call sets its own
// (WithPriority); default 0.
func WithDefaultPriority(p int32) Option { return func(c *clientConfig) { c.priority = p } }

// WithDefaultTenant is every call's tenant unless the call sets its own
// (WithTenant); default none: the tenant a tenant token names
// (POLYGATE_TOKEN), or else the scope's default tenant.
func WithDefaultTenant(t string) Option { return func(c *clientConfig) { c.tenant = t } }

// WithToken sends "authorization: Bearer token" with every RPC, for a sidecar
// configured with auth.token (or auth.operator_token). Over a plaintext
// connection the token travels in clear: keep plaintext to loopback and unix
// sockets, and use WithTLS or WithTLSCAFile for a sidecar beyond the host.
// Without WithToken the token is $POLYGATE_TOKEN, if set; WithToken("")
// sends none.
func WithToken(token string) Option {
	return func(c *clientConfig) { c.token, c.tokenSet = token, true }
}

// WithTLS makes Dial connect with TLS configured by cfg (server CA, client
// certificate for mTLS, server name). Without WithTLS or WithTLSCAFile the
// connection is plaintext, as a sidecar on the same host or pod usually is.
func WithTLS(cfg *tls.Config) Option { return func(c *clientConfig) { c.tls = cfg } }

// WithTLSCAFile makes Dial connect with TLS, trusting the PEM certificates in
// file (the sidecar's tls.cert_file or its CA) in addition to the system's.
// With WithTLS too, the file's certificates are added to that configuration's
// RootCAs.
func WithTLSCAFile(file string) Option { return func(c *clientConfig) { c.caFile = file } }

// WithDialOptions adds gRPC dial options (Dial only), e.g. interceptors.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *clientConfig) { c.dial = append(c.dial, opts...) }
}

// Dial returns a client of the sidecar at target: "host:port" or
// "unix:///path/to/socket"; "" is $POLYGATE_ADDR. It does not wait for the
// connection.
func Dial(target string, opts ...Option) (*Client, error) {
	cfg := configure(opts)
	if target == "" {
		if target = strings.TrimSpace(os.Getenv(EnvAddr)); target == "" {
			return nil, fmt.Errorf("polygate: Dial needs a target or $%s", EnvAddr)
		}
	}
	if _, err := cfg.modeOf(); err != nil {
		return nil, err
	}
	if err := cfg.tokenError(); err != nil {
		return nil, err
	}
	creds, err := cfg.transportCredentials()
	if err != nil {
		return nil, err
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.dial...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("polygate: dial sidecar %q: %w", target, err)
	}
	c := New(conn, opts...)
	c.conn = conn
	return c, nil
}

// New returns a client over a connection the caller owns (Close leaves it
// open). The options of the transport (TLS, dial options) do not apply: the
// connection's transport is the caller's. A bad value of
// $POLYGATE_ON_SIDECAR_UNAVAILABLE or $POLYGATE_TOKEN, which Dial returns as
// an error, is logged and ignored.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	cfg := configure(opts)
	w := newWatch(cfg)
	c := &Client{rpc: admissionv1.NewAdmissionServiceClient(watchedConn{tracedConn{conn}, w}), priority: cfg.priority, tenant: cfg.tenant, tr: cfg.tracer(), watch: w}
	if err := cfg.tokenError(); err != nil {
		w.log.Error(err.Error() + "; no token sent")
	} else if cfg.token != "" {
		c.call = []grpc.CallOption{grpc.PerRPCCredentials(bearer(cfg.token))}
	}
	return c
}

func configure(opts []Option) clientConfig {
	var cfg clientConfig
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.tokenSet {
		cfg.token = strings.TrimSpace(os.Getenv(EnvToken))
	}
	return cfg
}

// tokenError refuses a token that cannot be a header value.
func (cfg clientConfig) tokenError() error {
	for _, r := range cfg.token {
		if r < 0x21 || r > 0x7e {
			where := "WithToken"
			if !cfg.tokenSet {
				where = "$" + EnvToken
			}
			return fmt.Errorf("polygate: %s: only printable ASCII without spaces is allowed in a bearer token", where)
		}
	}
	return nil
}

// maxCAFile bounds the CA file WithTLSCAFile reads.
const maxCAFile = 1 << 20

func (cfg clientConfig) transportCredentials() (credentials.TransportCredentials, error) {
	if cfg.tls == nil && cfg.caFile == "" {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.tls != nil {
		tc = cfg.tls.Clone()
	}
	if cfg.caFile != "" {
		pem, err := readBounded(cfg.caFile, maxCAFile)
		if err != nil {
			return nil, fmt.Errorf("polygate: WithTLSCAFile %q: %w", cfg.caFile, err)
		}
		if tc.RootCAs == nil {
			if tc.RootCAs, err = x509.SystemCertPool(); err != nil {
				tc.RootCAs = x509.NewCertPool()
			}
		} else {
			tc.RootCAs = tc.RootCAs.Clone() // the caller's pool stays as it is
		}
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("polygate: WithTLSCAFile %q: no PEM certificate in the file", cfg.caFile)
		}
	}
	return credentials.NewTLS(tc), nil
}

func readBounded(file string, limit int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// bearer is the token's per-RPC credentials. It does not require transport
// security, so that plaintext loopback and unix sockets keep working (see
// WithToken).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

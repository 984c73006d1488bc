package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/polygate/polygate/config"
	"github.com/polygate/polygate/internal/boundedfile"
)

// TLSConfig is the gRPC listener's TLS configuration, or nil when
// tls.cert_file is not set. It serves tls.cert_file and, with
// tls.client_ca_file, requires a client certificate signed by that CA. The
// files are re-read when they change (their size or modification time,
// checked at most once a second, at a handshake), so a rotated certificate is
// served without a restart; a rotation that does not load keeps the previous
// certificate and is logged.
func TLSConfig(c config.TLS, log *slog.Logger) (*tls.Config, error) {
	if c.CertFile == "" {
		return nil, nil
	}
	return newCertFiles(c, log, time.Now)
}

func newCertFiles(c config.TLS, log *slog.Logger, now func() time.Time) (*tls.Config, error) {
	f := &certFiles{cfg: c, log: log, now: now}
	if _, err := f.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return f.get(), nil },
	}, nil
}

// certFiles holds the listener's certificate files and the configuration
// built from them, rebuilt when a file changes.
type certFiles struct {
	cfg config.TLS
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	stamp   string // the files' sizes and modification times when loaded
	checked time.Time
	current *tls.Config
}

// statInterval bounds how often a handshake looks at the files.
const statInterval = time.Second

func (f *certFiles) get() *tls.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := f.now(); now.Sub(f.checked) >= statInterval {
		f.checked = now
		if f.stampNow() != f.stamp {
			if _, err := f.loadLocked(); err != nil {
				f.log.Error("tls: the changed certificate files do not load; serving the previous certificate", "err", err)
			} else {
				f.log.Info("tls: certificate files reloaded", "cert_file", f.cfg.CertFile)
			}
		}
	}
	return f.current
}

func (f *certFiles) load() (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loadLocked()
}

func (f *certFiles) loadLocked() (*tls.Config, error) {
	stamp := f.stampNow()
	cert, err := tls.LoadX509KeyPair(f.cfg.CertFile, f.cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s, tls.key_file %s: %w", f.cfg.CertFile, f.cfg.KeyFile, err)
	}
	next := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}}
	if f.cfg.ClientCAFile != "" {
		pool, err := certPool("tls.client_ca_file", f.cfg.ClientCAFile)
		if err != nil {
			return nil, err
		}
		next.ClientCAs, next.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	f.stamp, f.current = stamp, next
	return next, nil
}

// stampNow describes the files' current versions.
func (f *certFiles) stampNow() string {
	var s string
	for _, p := range []string{f.cfg.CertFile, f.cfg.KeyFile, f.cfg.ClientCAFile} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			s += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
		} else {
			s += "missing;"
		}
	}
	return s
}

func certPool(key, path string) (*x509.CertPool, error) {
	pool, err := boundedfile.CertPool(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", key, path, err)
	}
	return pool, nil
}

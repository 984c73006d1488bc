package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/sidecartest"
)

// TestIncidentScript runs scripts/incident.sh — the reference library's
// incident over the wire with grpcurl — against the real binary.
func TestIncidentScript(t *testing.T) {
	grpcurl := filepath.Join(t.TempDir(), "grpcurl")
	build := exec.Command("go", "build", "-o", grpcurl, "github.com/fullstorydev/grpcurl/cmd/grpcurl")
	build.Dir = "../../tools"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building grpcurl from tools/go.mod: %v\n%s", err, out)
	}
	s := sidecartest.Start(t, []string{"--listen", "127.0.0.1:0", "--config", "../../scripts/incident.yaml"})
	cmd := exec.Command("bash", "../../scripts/incident.sh", s.Addr)
	cmd.Env = append(cmd.Environ(), "GRPCURL="+grpcurl)
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/incident.sh:\n%s", out)
	if err != nil || !strings.Contains(string(out), "incident reproduced") {
		t.Fatalf("the incident script failed: %v\nsidecar log:\n%s", err, s.Logs())
	}
}

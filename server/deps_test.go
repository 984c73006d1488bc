package server

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestServerDependsOnTheBackendSeamOnly fails if server (tests aside) comes
// to import a backend, go-redis, Prometheus, metrics or telemetry: those are wired by
// the composition root, internal/sidecar, which hands server a gate.Backend
// and its observers.
func TestServerDependsOnTheBackendSeamOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := regexp.MustCompile(`^(github\.com/polygate/polygate/(gate/(inmem|fallback|redisgate)|metrics|telemetry|internal/sidecar)(/.*)?|github\.com/redis/go-redis/.*|github\.com/prometheus/.*)$`)
	deps := strings.Fields(string(out))
	if len(deps) == 0 || !strings.Contains(string(out), "github.com/polygate/polygate/gate\n") {
		t.Fatalf("go list -deps printed no dependency list:\n%s", out)
	}
	for _, dep := range deps {
		if forbidden.MatchString(dep) {
			t.Errorf("server depends on %s; build it in internal/sidecar and pass server an interface", dep)
		}
	}
}

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// heavy are modules of the sidecar that an application importing only the Go
// SDK must not pull in.
var heavy = []string{"modernc.org/sqlite", "github.com/redis/go-redis", "github.com/knadh/koanf", "github.com/prometheus/"}

// A tiny application that imports only clientsdk/go (with the replace
// directives an in-repo build needs) resolves gRPC and protobuf, and none of
// the sidecar's storage, configuration or metrics modules: not in its module
// graph (go list -m all), not in its go.sum.
func TestGoSDK_AppPullsNoSidecarDependencies(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(app, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", `module example.com/app

go 1.26.0

require github.com/polygate/polygate/clientsdk/go v0.0.0

replace (
	github.com/polygate/polygate/clientsdk/go => `+filepath.Join(repo, "clientsdk", "go")+`
	github.com/polygate/polygate/gen => `+filepath.Join(repo, "gen")+`
)
`)
	write("main.go", `package main

import (
	"context"
	"fmt"
	"net/http"

	polygate "github.com/polygate/polygate/clientsdk/go"
)

func main() {
	c, err := polygate.Dial("127.0.0.1:50051", polygate.WithToken("t"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	n, err := polygate.Do(context.Background(), c, "chat", func(context.Context, polygate.Attempt) (int, polygate.Result) {
		return 1, polygate.Result{Outcome: polygate.Success}
	})
	fmt.Println(n, err, &http.Client{Transport: &polygate.Transport{Client: c, Scope: "chat"}})
}
`)
	ctx := ctxT(t)
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("mod", "tidy")
	gocmd("build", "-o", filepath.Join(app, "app"), ".")
	modules := gocmd("list", "-m", "all")
	sum, err := os.ReadFile(filepath.Join(app, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(modules, "google.golang.org/grpc ") || !strings.Contains(string(sum), "google.golang.org/grpc ") {
		t.Fatalf("the app does not resolve gRPC: the check below would prove nothing\n%s", modules)
	}
	for _, m := range heavy {
		if strings.Contains(modules, m) {
			t.Errorf("go list -m all of an app importing only the SDK lists %s:\n%s", m, modules)
		}
		if strings.Contains(string(sum), m) {
			t.Errorf("the go.sum of an app importing only the SDK has %s:\n%s", m, sum)
		}
	}
}

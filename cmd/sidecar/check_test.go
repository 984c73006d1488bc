package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/polygate/polygate/internal/sidecartest"
)

// TestCheckPrintsAFileThatGivesItself: --check prints the effective
// configuration as a configuration file; fed back with --config, that file
// gives the same configuration, so --check prints it again, byte for byte,
// in YAML and in JSON. So for the embedded demo and for every example
// configuration in the repository (the Kubernetes ConfigMap's with its token
// from the environment, as the Deployment gives it).
func TestCheckPrintsAFileThatGivesItself(t *testing.T) {
	dir := t.TempDir()
	examples := []struct {
		name string
		file string // "" the embedded demo
		env  []string
	}{
		{name: "embedded demo"},
		{name: "scripts/incident.yaml", file: "../../scripts/incident.yaml"},
		{name: "deploy/kubernetes/configmap.yaml", file: configMapFile(t, dir), env: []string{"POLYGATE_AUTH__TOKEN=t"}},
	}
	for _, ex := range examples {
		for _, output := range []string{"yaml", "json"} {
			t.Run(ex.name+"/"+output, func(t *testing.T) {
				first := check(t, ex.env, ex.file, output)
				printed := filepath.Join(t.TempDir(), "printed."+output)
				if err := os.WriteFile(printed, first, 0o600); err != nil {
					t.Fatal(err)
				}
				if again := check(t, ex.env, printed, output); !bytes.Equal(again, first) {
					t.Fatalf("--check --config (what --check printed) differs:\n--- first\n%s\n--- again\n%s", first, again)
				}
				other := map[string]string{"yaml": "json", "json": "yaml"}[output]
				if a, b := check(t, ex.env, ex.file, other), check(t, ex.env, printed, other); !bytes.Equal(a, b) {
					t.Fatalf("--output %s of the file and of what --check printed in %s differ:\n%s\n---\n%s", other, output, a, b)
				}
			})
		}
	}
}

// check runs --check on file ("" the embedded demo) and returns its stdout.
func check(t *testing.T, env []string, file, output string) []byte {
	t.Helper()
	args := []string{"--check", "--output", output}
	if file != "" {
		args = append(args, "--config", file)
	}
	cmd := exec.Command(sidecartest.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || !strings.Contains(stderr.String(), "configuration OK") {
		t.Fatalf("--check %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// configMapFile writes the Kubernetes example's polygate.yaml to a file in
// dir and returns its path.
func configMapFile(t *testing.T, dir string) string {
	t.Helper()
	text, err := os.ReadFile("../../deploy/kubernetes/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(text))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			t.Fatal("deploy/kubernetes/configmap.yaml has no ConfigMap with polygate.yaml")
		} else if err != nil {
			t.Fatal(err)
		}
		if body, ok := o.Data["polygate.yaml"]; o.Kind == "ConfigMap" && ok {
			file := filepath.Join(dir, "polygate.yaml")
			if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			return file
		}
	}
}

package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// k8sContainer is the part of a container spec the example must get right.
type k8sContainer struct {
	Name  string   `yaml:"name"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name string `yaml:"name"`
		Port int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	RestartPolicy string `yaml:"restartPolicy"`
}

type k8sProbe struct {
	GRPC *struct {
		Port    int    `yaml:"port"`
		Service string `yaml:"service"`
	} `yaml:"grpc"`
}

// k8sIngressRule is a NetworkPolicy's ingress rule: no ports means every
// port; a port without a number or name means every port.
type k8sIngressRule struct {
	From  []map[string]any `yaml:"from"`
	Ports []struct {
		Port any `yaml:"port"` // a number or a container port's name
	} `yaml:"ports"`
}

type k8sObject struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Data       map[string]string `yaml:"data"`
	Spec       struct {
		PodSelector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"podSelector"`
		PolicyTypes []string         `yaml:"policyTypes"`
		Ingress     []k8sIngressRule `yaml:"ingress"`
		Template    struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				InitContainers []k8sContainer `yaml:"initContainers"`
				Containers     []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestKubernetesExample keeps deploy/kubernetes honest: the sidecar's
// configuration passes the real validation, and the probes, ports, mounts
// and the application's address agree with it.
func TestKubernetesExample(t *testing.T) {
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var objects []k8sObject
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(text))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" {
				t.Fatalf("%s: a document without apiVersion or kind", f)
			}
			objects = append(objects, o)
		}
	}
	var cfg *config.Config
	var sidecar, app *k8sContainer
	var podLabels map[string]string
	var policies []*k8sObject
	for i := range objects {
		o := &objects[i]
		switch o.Kind {
		case "ConfigMap":
			if cfg, err = config.Parse([]byte(o.Data["polygate.yaml"]), []string{"POLYGATE_AUTH__TOKEN=t"}); err != nil {
				t.Fatalf("the ConfigMap's polygate.yaml: %v", err)
			}
		case "Deployment":
			for j := range o.Spec.Template.Spec.InitContainers {
				if c := &o.Spec.Template.Spec.InitContainers[j]; c.Name == "polygate" {
					sidecar = c
				}
			}
			app = &o.Spec.Template.Spec.Containers[0]
			podLabels = o.Spec.Template.Metadata.Labels
		case "NetworkPolicy":
			policies = append(policies, o)
		}
	}
	if cfg == nil || sidecar == nil || app == nil {
		t.Fatal("want a ConfigMap with polygate.yaml and a Deployment with a polygate init container and an app")
	}
	port := func(addr string) int {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%q: %v", addr, err)
		}
		n, _ := strconv.Atoi(p)
		return n
	}
	listen, metrics := port(cfg.Listen), port(cfg.MetricsListen)
	if sidecar.RestartPolicy != "Always" {
		t.Errorf("the sidecar is not a native sidecar (restartPolicy %q)", sidecar.RestartPolicy)
	}
	admission := admissionv1.AdmissionService_ServiceDesc.ServiceName
	for name, p := range map[string]*k8sProbe{"startup": sidecar.StartupProbe, "readiness": sidecar.ReadinessProbe, "liveness": sidecar.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != listen {
			t.Errorf("%s probe is not a grpc probe on the listen port %d", name, listen)
		} else if want := map[string]string{"startup": admission, "readiness": admission, "liveness": ""}[name]; p.GRPC.Service != want {
			t.Errorf("%s probe asks for %q, want %q", name, p.GRPC.Service, want)
		}
	}
	ports := map[string]int{}
	for _, p := range sidecar.Ports {
		ports[p.Name] = p.Port
	}
	if ports["grpc"] != listen || ports["metrics"] != metrics {
		t.Errorf("container ports %v, want grpc %d and metrics %d", ports, listen, metrics)
	}
	mounted := func(path string) bool {
		for _, m := range sidecar.VolumeMounts {
			if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return true
			}
		}
		return false
	}
	if cfg.Telemetry.Path == "" || !mounted(cfg.Telemetry.Path) {
		t.Errorf("telemetry.path %q is not on a mounted volume", cfg.Telemetry.Path)
	}
	if len(sidecar.Args) != 2 || sidecar.Args[0] != "--config" || !mounted(sidecar.Args[1]) {
		t.Errorf("args %v: want --config on the mounted ConfigMap", sidecar.Args)
	}
	for _, e := range app.Env {
		if e.Name == "POLYGATE_ADDR" && (!strings.HasPrefix(e.Value, "127.0.0.1:") || port(e.Value) != listen) {
			t.Errorf("the application dials %s; the sidecar listens on %s", e.Value, cfg.Listen)
		}
	}
	checkNetworkPolicy(t, policies, podLabels, sidecar, app, listen, metrics)
}

// checkNetworkPolicy: the policy selects the pod; the application's own
// ports stay reachable; the metrics port is reachable only from selected
// peers; no rule admits the sidecar's gRPC port from outside the pod.
func checkNetworkPolicy(t *testing.T, policies []*k8sObject, podLabels map[string]string, sidecar, app *k8sContainer, listen, metrics int) {
	t.Helper()
	if len(policies) != 1 {
		t.Fatalf("%d NetworkPolicies, want one", len(policies))
	}
	np := policies[0]
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("the NetworkPolicy selects %s=%s; the pod is labelled %v", k, v, podLabels)
		}
	}
	if len(np.Spec.PodSelector.MatchLabels) == 0 || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
		t.Fatalf("the NetworkPolicy must select the pod by label and restrict Ingress: %+v", np.Spec)
	}
	if len(app.Ports) == 0 {
		t.Fatal("the application container declares no port; the example must show how its own ingress stays open")
	}
	// Container port numbers by name, for rules that name ports.
	named := map[string]int{}
	for _, c := range []*k8sContainer{sidecar, app} {
		for _, p := range c.Ports {
			named[p.Name] = p.Port
		}
	}
	// admits returns the rules that let a connection to port in, and
	// whether one of them admits it from anywhere.
	admits := func(port int) (rules int, fromAnywhere bool) {
		for _, r := range np.Spec.Ingress {
			match := len(r.Ports) == 0
			for _, p := range r.Ports {
				switch v := p.Port.(type) {
				case nil:
					match = true
				case int:
					match = match || v == port
				case string:
					match = match || named[v] == port
				default:
					t.Fatalf("NetworkPolicy port %v (%T)", v, v)
				}
			}
			if match {
				rules++
				fromAnywhere = fromAnywhere || len(r.From) == 0
			}
		}
		return rules, fromAnywhere
	}
	for _, p := range app.Ports {
		if n, _ := admits(p.Port); n == 0 {
			t.Errorf("the NetworkPolicy blocks the application's own port %s (%d)", p.Name, p.Port)
		}
	}
	if n, _ := admits(listen); n > 0 {
		t.Errorf("the NetworkPolicy admits the sidecar's gRPC port %d from outside the pod", listen)
	}
	if n, anywhere := admits(metrics); n == 0 || anywhere {
		t.Errorf("the metrics port %d: admitted by %d rules, from anywhere %v; want it admitted from selected peers only", metrics, n, anywhere)
	}
}

// TestDockerfileExposesWhatListens: the image exposes exactly the ports the
// default configuration listens on (metrics are off by default).
func TestDockerfileExposesWhatListens(t *testing.T) {
	text, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var exposed []string
	for _, line := range strings.Split(string(text), "\n") {
		if rest, ok := strings.CutPrefix(line, "EXPOSE "); ok {
			exposed = append(exposed, strings.Fields(rest)...)
		}
	}
	cfg, err := config.Parse([]byte("scopes: {chat: {sources: [{name: a}]}}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, addr := range []string{cfg.Listen, cfg.MetricsListen} {
		if addr != "" {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("%q: %v", addr, err)
			}
			want = append(want, p)
		}
	}
	if !slices.Equal(exposed, want) {
		t.Errorf("the Dockerfile exposes %v; by default the sidecar listens on %v (listen %q, metrics_listen %q)", exposed, want, cfg.Listen, cfg.MetricsListen)
	}
}

// TestAlertRunbooks: every alerting rule has a runbook_url that points at a
// section of docs/operations.md, and has a summary.
func TestAlertRunbooks(t *testing.T) {
	text, err := os.ReadFile("../../deploy/prometheus/polygate-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(text, &rules); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "#") {
			anchors[githubAnchor(strings.TrimLeft(line, "# "))] = true
		}
	}
	const base = "https://github.com/polygate/polygate/blob/main/docs/operations.md#"
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, base)
			switch {
			case !ok:
				t.Errorf("%s: runbook_url %q, want %s<anchor>", r.Alert, url, base)
			case !anchors[anchor]:
				t.Errorf("%s: runbook_url %q points at no heading of docs/operations.md", r.Alert, url)
			case anchor != githubAnchor(r.Alert):
				t.Errorf("%s: runbook_url %q points at another alert's section", r.Alert, url)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d alerting rules; the file's shape changed", n)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// spaces as hyphens, punctuation other than hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

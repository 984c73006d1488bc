package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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

type k8sObject struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Data       map[string]string `yaml:"data"`
	Spec       struct {
		Template struct {
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
}

package sidecar

import (
	"fmt"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/polygate/polygate/config"
	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/server"
)

// backendChange is what a backend's report of its health means to the
// event stream and the metrics.
func backendChange(cfg *config.Config, degraded bool, cause error) server.BackendChange {
	c := server.BackendChange{Backend: cfg.Backend.Kind, Degraded: degraded}
	switch {
	case degraded && cause != nil:
		c.Detail = fmt.Sprintf("%v; on_unavailable: %s", cause, cfg.Backend.Redis.OnUnavailable)
	case degraded:
		c.Detail = "on_unavailable: " + cfg.Backend.Redis.OnUnavailable
	}
	return c
}

// BackendHealthService is the health service name that reports the backend:
// NOT_SERVING while a shared backend is unavailable (whatever on_unavailable
// says). The admission service itself turns NOT_SERVING only when it cannot
// decide: an unavailable backend under on_unavailable: fail_closed.
const BackendHealthService = "polygate.backend"

func backendHealth(hs *health.Server, cfg *config.Config, degraded bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if degraded {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	hs.SetServingStatus(BackendHealthService, st)
	admission := healthpb.HealthCheckResponse_SERVING
	if degraded && cfg.Backend.Redis.OnUnavailable == "fail_closed" {
		admission = healthpb.HealthCheckResponse_NOT_SERVING
	}
	hs.SetServingStatus(admissionv1.AdmissionService_ServiceDesc.ServiceName, admission)
}

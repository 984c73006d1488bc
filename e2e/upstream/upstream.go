// Package upstream is a fake LLM provider for end-to-end tests: each route
// (the first path segment, one per configured source) answers from a script
// of steps (200, 503 bursts, 429 with Retry-After, 401, slow answers, hangs,
// streams) and logs every request it receives. Tests in Go drive it directly; other
// languages drive the same server through its /_control/ HTTP API.
package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Step is one part of a route's script.
type Step struct {
	// Status is the HTTP status to answer (200 if 0).
	Status int `json:"status,omitempty"`
	// Headers are added to the answer, e.g. {"Retry-After": "1"}.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the answer's body; empty gives an OpenAI-style completion for a
	// 2xx and an OpenAI-style error otherwise.
	Body string `json:"body,omitempty"`
	// DelayMs delays the answer (a slow upstream); the request is still
	// logged when it arrives.
	DelayMs int `json:"delay_ms,omitempty"`
	// Hang never answers: the request is held until the client gives up or
	// the server closes (an upstream timeout).
	Hang bool `json:"hang,omitempty"`
	// Times is how many requests the step answers before the next step
	// takes over; 0 means every request from here on. The last step repeats.
	Times int `json:"times,omitempty"`
	// Stream answers a server-sent event stream in place of Body: one
	// "data:" event per element, each flushed as it is written, then
	// "data: [DONE]".
	Stream []string `json:"stream,omitempty"`
	// Gated holds each event of Stream after the first (and the closing
	// [DONE]) until the route is released once more (Release), so that a
	// test can show a client reads one event before the next is sent.
	Gated bool `json:"gated,omitempty"`
}

// Received is one logged request.
type Received struct {
	At time.Time
	// Status is what the step chose to answer (0 for a hang).
	Status int
}

type route struct {
	steps    []Step
	used     int // requests answered by steps[0]
	log      []Received
	released int // Release calls, for gated streams
}

// Server is a fake upstream listening on a loopback port.
type Server struct {
	// URL is the server's base URL; a route's base URL is URL + "/" + route.
	URL string

	start time.Time
	srv   *httptest.Server
	done  chan struct{}

	mu      sync.Mutex
	routes  map[string]*route
	changed chan struct{} // closed and replaced on every request
}

// New starts a fake upstream; every route answers 200 until scripted.
func New() *Server {
	s := &Server{start: time.Now(), done: make(chan struct{}), routes: make(map[string]*route), changed: make(chan struct{})}
	s.srv = httptest.NewServer(s)
	s.URL = s.srv.URL
	return s
}

// Close releases hanging requests and stops the server.
func (s *Server) Close() {
	close(s.done)
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Set replaces a route's script; its request log is kept.
func (s *Server) Set(name string, steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.route(name)
	r.steps, r.used = steps, 0
}

// Requests returns the route's request log, oldest first.
func (s *Server) Requests(name string) []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.route(name).log...)
}

// Count is how many requests the route received.
func (s *Server) Count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.route(name).log)
}

// Release lets a gated stream of the route send one more element.
func (s *Server) Release(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.route(name).released++
	s.notify()
}

// releasedAtLeast waits until the route was released at least n times, or ctx or
// the server ends; false when it did not happen.
func (s *Server) releasedAtLeast(ctx context.Context, name string, n int) bool {
	for {
		s.mu.Lock()
		got, changed := s.route(name).released, s.changed
		s.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		case <-s.done:
			return false
		}
	}
}

// notify wakes every waiter on s.changed; s.mu is held.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// WaitCount waits until the route has received at least n requests, or ctx ends.
func (s *Server) WaitCount(ctx context.Context, name string, n int) error {
	for {
		s.mu.Lock()
		got, changed := len(s.route(name).log), s.changed
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("route %s received %d requests, waiting for %d: %w", name, got, n, ctx.Err())
		}
	}
}

func (s *Server) route(name string) *route {
	r, ok := s.routes[name]
	if !ok {
		r = &route{}
		s.routes[name] = r
	}
	return r
}

// next logs a request and picks its step.
func (s *Server) next(name string) Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.route(name)
	step := Step{Status: http.StatusOK}
	if len(r.steps) > 0 {
		step = r.steps[0]
		r.used++
		if step.Times > 0 && r.used >= step.Times && len(r.steps) > 1 {
			r.steps, r.used = r.steps[1:], 0
		}
	}
	if step.Status == 0 {
		step.Status = http.StatusOK
	}
	status := step.Status
	if step.Hang {
		status = 0
	}
	r.log = append(r.log, Received{At: time.Now(), Status: status})
	s.notify()
	return step
}

// ServeHTTP answers /ROUTE/... from the route's script and /_control/ROUTE
// with the control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if name == "_control" {
		s.control(w, r)
		return
	}
	step := s.next(name)
	if step.Hang {
		select {
		case <-r.Context().Done():
		case <-s.done:
		}
		return
	}
	if step.DelayMs > 0 {
		t := time.NewTimer(time.Duration(step.DelayMs) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
	for k, v := range step.Headers {
		w.Header().Set(k, v)
	}
	if len(step.Stream) > 0 {
		s.stream(w, r, name, step)
		return
	}
	body := step.Body
	if body == "" {
		body = defaultBody(name, step.Status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(step.Status)
	_, _ = w.Write([]byte(body))
}

// stream writes step.Stream as server-sent events, one "data:" event per
// element and then "data: [DONE]", flushing each; a gated stream waits for
// one release of the route before each event after the first (counting
// from the route's releases when it began).
func (s *Server) stream(w http.ResponseWriter, r *http.Request, name string, step Step) {
	s.mu.Lock()
	base := s.route(name).released
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(step.Status)
	flusher, _ := w.(http.Flusher)
	for i, data := range append(step.Stream[:len(step.Stream):len(step.Stream)], "[DONE]") {
		if step.Gated && i > 0 && !s.releasedAtLeast(r.Context(), name, base+i) {
			return
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}

func defaultBody(route string, status int) string {
	if status >= 200 && status <= 299 {
		b, _ := json.Marshal(map[string]any{
			"object": "chat.completion", "model": "fake-" + route,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": "ok from " + route}}},
			"usage": map[string]int{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
		})
		return string(b)
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": http.StatusText(status), "type": "fake", "code": nil}})
	return string(b)
}

// controlState is the control API's view of a route.
type controlState struct {
	Count    int `json:"count"`
	Requests []struct {
		AtMs   float64 `json:"at_ms"`
		Status int     `json:"status"`
	} `json:"requests"`
}

// control serves the API for drivers in other languages:
//
//	PUT /_control/ROUTE   {"steps": [Step...]}   replaces the route's script
//	POST /_control/ROUTE  releases one element of a gated stream (Release)
//	GET /_control/ROUTE[?wait_count=N&timeout_ms=T]
//	    the route's log (at_ms since the server started), after waiting up
//	    to T ms for at least N requests (408 if they did not come)
func (s *Server) control(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/_control/")
	if name == "" || strings.Contains(name, "/") {
		http.Error(w, "want /_control/ROUTE", http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodPut:
		var req struct {
			Steps []Step `json:"steps"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.Set(name, req.Steps...)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodPost:
		s.Release(name)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		if n, err := strconv.Atoi(r.URL.Query().Get("wait_count")); err == nil {
			ms, _ := strconv.Atoi(r.URL.Query().Get("timeout_ms"))
			ctx, cancel := context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
			err := s.WaitCount(ctx, name, n)
			cancel()
			if err != nil {
				http.Error(w, err.Error(), http.StatusRequestTimeout)
				return
			}
		}
		var st controlState
		for _, rec := range s.Requests(name) {
			st.Requests = append(st.Requests, struct {
				AtMs   float64 `json:"at_ms"`
				Status int     `json:"status"`
			}{float64(rec.At.Sub(s.start).Microseconds()) / 1000, rec.Status})
		}
		st.Count = len(st.Requests)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	default:
		http.Error(w, "PUT, POST or GET", http.StatusMethodNotAllowed)
	}
}

package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestScript(t *testing.T) {
	s := New()
	defer s.Close()
	s.Set("a", Step{Status: 503, Times: 2}, Step{Status: 429, Headers: map[string]string{"Retry-After": "1"}, Times: 1}, Step{})
	want := []int{503, 503, 429, 200, 200}
	for i, w := range want {
		if code, _ := get(t, s.URL+"/a/v1/chat"); code != w {
			t.Errorf("request %d answered %d; want %d", i+1, code, w)
		}
	}
	if code, _ := get(t, s.URL+"/b"); code != 200 {
		t.Errorf("an unscripted route answered %d; want 200", code)
	}
	if s.Count("a") != len(want) || s.Count("b") != 1 {
		t.Errorf("counts a=%d b=%d; want %d and 1", s.Count("a"), s.Count("b"), len(want))
	}
}

func TestHangEndsWithTheClient(t *testing.T) {
	s := New()
	defer s.Close()
	s.Set("h", Step{Hang: true})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/h", nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a hanging route answered")
	}
	if got := s.Requests("h"); len(got) != 1 || got[0].Status != 0 {
		t.Errorf("log %v; want one hang", got)
	}
}

func TestControlAPI(t *testing.T) {
	s := New()
	defer s.Close()
	body, _ := json.Marshal(map[string]any{"steps": []Step{{Status: 401}}})
	req, _ := http.NewRequest(http.MethodPut, s.URL+"/_control/x", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /_control/x = %v %v", resp, err)
	}
	resp.Body.Close()
	if code, _ := get(t, s.URL+"/x/v1"); code != 401 {
		t.Errorf("scripted route answered %d; want 401", code)
	}
	if code, _ := get(t, s.URL+"/_control/x?wait_count=2&timeout_ms=10"); code != http.StatusRequestTimeout {
		t.Errorf("waiting for a request that never comes answered %d; want 408", code)
	}
	code, out := get(t, s.URL+"/_control/x?wait_count=1&timeout_ms=1000")
	var st controlState
	if err := json.Unmarshal([]byte(out), &st); code != 200 || err != nil || st.Count != 1 || st.Requests[0].Status != 401 {
		t.Errorf("GET /_control/x = %d %s", code, out)
	}
}

func TestGatedStream(t *testing.T) {
	s := New()
	defer s.Close()
	s.Set("a", Step{Stream: []string{"1", "2"}, Gated: true})
	resp, err := http.Get(s.URL + "/a/chat")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q; want text/event-stream", ct)
	}
	r := bufio.NewReader(resp.Body)
	for i, want := range []string{"data: 1\n", "\n", "data: 2\n", "\n", "data: [DONE]\n", "\n"} {
		if i > 0 && i%2 == 0 {
			// The next element is sent only after a release: reading it
			// first would block until the test's deadline.
			s.Release("a")
		}
		line, err := r.ReadString('\n')
		if err != nil || line != want {
			t.Fatalf("line %d = %q, %v; want %q", i, line, err, want)
		}
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("after the stream: %v; want EOF", err)
	}
}

// A gated stream sends nothing after its first event until it is released:
// a request given up right after that event got that event alone.
func TestGatedStreamHoldsUntilReleased(t *testing.T) {
	s := New()
	defer s.Close()
	s.Set("a", Step{Stream: []string{"1", "2"}, Gated: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelOnFlush{ResponseRecorder: httptest.NewRecorder(), cancel: cancel}
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/a/chat", nil).WithContext(ctx))
	if got := w.Body.String(); got != "data: 1\n\n" {
		t.Errorf("sent %q without a release; want the first event alone", got)
	}
}

// cancelOnFlush gives the request up once the first event is flushed.
type cancelOnFlush struct {
	*httptest.ResponseRecorder
	cancel context.CancelFunc
}

func (w *cancelOnFlush) Flush() {
	w.ResponseRecorder.Flush()
	w.cancel()
}

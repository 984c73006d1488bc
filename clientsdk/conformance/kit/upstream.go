package kit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxUpstreamBody bounds the request body the fake upstream reads.
const maxUpstreamBody = 1 << 20

// serveUpstream answers /SOURCE/... from the script.
func (f *Fake) serveUpstream(w http.ResponseWriter, r *http.Request) {
	source, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	rest = "/" + rest
	if r.URL.RawQuery != "" {
		rest += "?" + r.URL.RawQuery
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxUpstreamBody))
	if err != nil {
		return // the client went away while sending
	}
	s, done := f.arrive(fmt.Sprintf("upstream %s %s %s", source, r.Method, rest), "", source, func(s *Step) []string {
		want := s.want.(*UpstreamWant)
		var m []string
		if want.Method != "" {
			m = append(m, differ("method", r.Method, want.Method)...)
		}
		if want.Path != "" {
			m = append(m, differ("path", rest, want.Path)...)
		}
		for _, k := range sortedKeys(want.Headers) {
			m = append(m, differ("header "+strings.ToLower(k), r.Header.Get(k), want.Headers[k])...)
		}
		if want.Body != nil {
			m = append(m, differ("body", string(body), *want.Body)...)
		}
		return m
	})
	if s == nil {
		http.Error(w, "conformance: this request is not the script's next step", http.StatusTeapot)
		return
	}
	reply := s.reply.(*UpstreamReply)
	if reply.Hang {
		select {
		case <-r.Context().Done():
		case <-done:
		}
		return
	}
	defer f.replied()
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	for k, v := range reply.Headers {
		w.Header().Set(k, v)
	}
	if reply.Stream != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		flusher, _ := w.(http.Flusher)
		for _, chunk := range reply.Stream {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		return
	}
	text := defaultBody(source, status)
	if reply.Body != nil {
		text = *reply.Body
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// defaultBody is an OpenAI-style completion for a 2xx, an OpenAI-style error otherwise.
func defaultBody(source string, status int) string {
	var doc any
	if status >= 200 && status <= 299 {
		doc = map[string]any{
			"object": "chat.completion", "model": "fake-" + source,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": "ok from " + source}}},
			"usage": map[string]int{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
		}
	} else {
		doc = map[string]any{"error": map[string]any{"message": http.StatusText(status), "type": "upstream", "code": nil}}
	}
	b, _ := json.Marshal(doc)
	return string(b)
}

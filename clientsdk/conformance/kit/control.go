package kit

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
)

// maxWait bounds how long a control request waits for events.
const maxWait = 5 * time.Minute

// Control is the fake's HTTP API, for runners in any language:
//
//	POST /exchange          body: an exchange (JSON)  → 200 Endpoints; 400 names what is wrong
//	POST /sidecar/stop      stops the exchange's sidecar → 204
//	GET  /events?count=N&timeout_ms=T
//	                        waits for N events of the exchange → 204; 408 if they did not come
//	GET  /result?timeout_ms=T
//	                        waits for every step (at most T ms) → 200 Report
func Control(f *Fake) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /exchange", func(w http.ResponseWriter, r *http.Request) {
		data, err := io.ReadAll(io.LimitReader(r.Body, maxExchange+1)) // Parse refuses more than maxExchange
		if err != nil {
			http.Error(w, "exchange: unreadable: "+err.Error(), http.StatusBadRequest)
			return
		}
		ex, err := Parse(data)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ep, err := f.Begin(ex)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, ep)
	})
	mux.HandleFunc("POST /sidecar/stop", func(w http.ResponseWriter, r *http.Request) {
		f.StopSidecar()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("count"))
		if err != nil || n < 0 {
			http.Error(w, "count: want a number of events, 0 or more", http.StatusBadRequest)
			return
		}
		ctx, cancel := waitContext(r)
		defer cancel()
		if err := f.WaitEvents(ctx, n); err != nil {
			http.Error(w, err.Error(), http.StatusRequestTimeout)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /result", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := waitContext(r)
		defer cancel()
		writeJSON(w, f.Result(ctx))
	})
	return mux
}

// waitContext ends after the request's timeout_ms (at most maxWait).
func waitContext(r *http.Request) (context.Context, context.CancelFunc) {
	ms, err := strconv.ParseInt(r.URL.Query().Get("timeout_ms"), 10, 64)
	d := maxWait
	if err == nil && ms >= 0 && ms < maxWait.Milliseconds() {
		d = time.Duration(ms) * time.Millisecond
	}
	return context.WithTimeout(r.Context(), d)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

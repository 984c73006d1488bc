package status

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// Refresh is how often the HTML page reloads itself.
const Refresh = 5 * time.Second

// readTimeout bounds reading every scope for one page.
const readTimeout = 5 * time.Second

// Scopes is what the page reads: the admission service's own answers, so
// the page shows exactly what DescribeScope does.
type Scopes interface {
	Scopes() []string
	DescribeScope(ctx context.Context, req *admissionv1.DescribeScopeRequest) (*admissionv1.DescribeScopeResponse, error)
}

// Page serves /status and /status.json.
type Page struct {
	scopes Scopes
	rec    *Recorder
	now    func() time.Time
	log    *slog.Logger
}

// New returns the page of scopes, with rec's transitions and waiting calls.
func New(scopes Scopes, rec *Recorder, now func() time.Time, log *slog.Logger) *Page {
	return &Page{scopes: scopes, rec: rec, now: now, log: log}
}

// Register adds /status and /status.json to mux.
func (p *Page) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /status", p.serveHTML)
	mux.HandleFunc("GET /status.json", p.serveJSON)
}

// scope is one scope as the page shows it.
type scope struct {
	Name        string
	Description *admissionv1.ScopeDescription
	Waiting     int
	Err         string
}

func (p *Page) read(ctx context.Context) []scope {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	var out []scope
	for _, name := range p.scopes.Scopes() {
		s := scope{Name: name, Waiting: p.rec.WaitingIn(name)}
		d, err := p.scopes.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: name})
		if err != nil {
			s.Err = err.Error()
		} else {
			s.Description = d.GetScope()
		}
		out = append(out, s)
	}
	return out
}

func (p *Page) serveJSON(w http.ResponseWriter, r *http.Request) {
	type scopeJSON struct {
		Name         string          `json:"name"`
		WaitingCalls int             `json:"waiting_calls"`
		Error        string          `json:"error,omitempty"`
		Description  json.RawMessage `json:"description,omitempty"`
	}
	doc := struct {
		GeneratedAt time.Time    `json:"generated_at"`
		Scopes      []scopeJSON  `json:"scopes"`
		Transitions []Transition `json:"transitions"`
	}{GeneratedAt: p.now().UTC(), Scopes: []scopeJSON{}, Transitions: p.rec.Transitions()}
	// Zero values are shown: an operator reads epoch 0 and window_calls 0.
	marshal := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	for _, s := range p.read(r.Context()) {
		js := scopeJSON{Name: s.Name, WaitingCalls: s.Waiting, Error: s.Err}
		if s.Description != nil {
			b, err := marshal.Marshal(s.Description)
			if err != nil {
				p.fail(w, err)
				return
			}
			js.Description = b
		}
		doc.Scopes = append(doc.Scopes, js)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(doc)
}

func (p *Page) serveHTML(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	err := page.Execute(&b, struct {
		Refresh     int
		Now         string
		Scopes      []scope
		Transitions []Transition
	}{int(Refresh / time.Second), p.now().UTC().Format(time.RFC3339), p.read(r.Context()), p.rec.Transitions()})
	if err != nil {
		p.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

func (p *Page) fail(w http.ResponseWriter, err error) {
	p.log.Error("status page", "err", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}

//go:embed status.html
var pageText string

var page = template.Must(template.New("status").Funcs(template.FuncMap{
	"state": func(s admissionv1.BreakerState) string {
		return strings.TrimPrefix(s.String(), "BREAKER_STATE_")
	},
	"reason": func(r admissionv1.Reason) string {
		if r == admissionv1.Reason_REASON_UNSPECIFIED {
			return "admits"
		}
		return strings.ToLower(strings.TrimPrefix(r.String(), "REASON_"))
	},
	"override": func(o admissionv1.Override) string {
		if o == admissionv1.Override_OVERRIDE_UNSPECIFIED {
			return "none"
		}
		return strings.ToLower(strings.TrimPrefix(o.String(), "OVERRIDE_"))
	},
	"dur": func(d *durationpb.Duration) string {
		if d == nil {
			return "0s"
		}
		return short(d.AsDuration())
	},
	"ns":    short,
	"int64": func(n int32) int64 { return int64(n) },
	"limit": func(n int64) string {
		if n == 0 {
			return "∞"
		}
		return itoa(n)
	},
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
}).Parse(pageText))

// short shows d to the second (to the millisecond under a second).
func short(d time.Duration) string {
	if d > 0 && d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

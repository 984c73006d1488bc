package status

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
	"github.com/polygate/polygate/internal/buildinfo"
)

// Refresh is how often the page fetches itself again and swaps in what
// changed (status.js), or reloads without JavaScript.
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

// New returns the page of scopes, with what rec kept.
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
	Err         string
	Record      ScopeRecord
	Headline    Headline
}

// read returns the configured scopes' names, and reads those scopes (only
// the one named only, when it is one of them) with what the Recorder kept
// of each; it forgets the scopes no longer configured.
func (p *Page) read(ctx context.Context, only string) (names []string, out []scope) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	names = p.scopes.Scopes()
	p.rec.Keep(names)
	only = pick(only, names)
	for _, name := range names {
		if only != "" && name != only {
			continue
		}
		s := scope{Name: name, Record: p.rec.Scope(name)}
		d, err := p.scopes.DescribeScope(ctx, &admissionv1.DescribeScopeRequest{Scope: name})
		if err != nil {
			s.Err = err.Error()
		} else {
			s.Description = d.GetScope()
		}
		s.Headline = headline(s.Description, s.Err, s.Record)
		out = append(out, s)
	}
	return names, out
}

func (p *Page) serveJSON(w http.ResponseWriter, r *http.Request) {
	type scopeJSON struct {
		Name         string            `json:"name"`
		Headline     Headline          `json:"headline"`
		WaitingCalls int               `json:"waiting_calls"`
		Error        string            `json:"error,omitempty"`
		Description  json.RawMessage   `json:"description,omitempty"`
		Sources      map[string]Source `json:"sources"`
		History      []Interval        `json:"history"`
	}
	doc := struct {
		GeneratedAt time.Time    `json:"generated_at"`
		Scopes      []scopeJSON  `json:"scopes"`
		Transitions []Transition `json:"transitions"`
	}{GeneratedAt: p.now().UTC(), Scopes: []scopeJSON{}, Transitions: p.rec.Transitions()}
	// Zero values are shown: an operator reads epoch 0 and window_calls 0.
	marshal := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	_, scopes := p.read(r.Context(), "")
	for _, s := range scopes {
		js := scopeJSON{Name: s.Name, Headline: s.Headline, WaitingCalls: s.Record.Waiting, Error: s.Err,
			Sources: s.Record.Sources, History: s.Record.Intervals}
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

// scopeData is one scope's section of the page.
type scopeData struct {
	scope
	Sources     []sourceView
	Chart       chartView
	Transitions []transitionRow
}

// pageData is what status.html renders; Live is the part status.js swaps.
type pageData struct {
	Refresh int
	Now     string
	Build   string
	Filter  Filter
	// ScopeNames and SourceNames fill the filter's choices.
	ScopeNames, SourceNames []string
	Scopes                  []scopeData
	Script                  template.JS
}

func (p *Page) serveHTML(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := Filter{Scope: q.Get("scope"), Source: q.Get("source"), Kind: q.Get("kind")}
	now := p.now()
	names, scopes := p.read(r.Context(), f.Scope)
	data := pageData{Refresh: int(Refresh / time.Second), Now: now.UTC().Format(time.RFC3339), Build: buildinfo.Read().Version,
		ScopeNames: names, Script: template.JS(script)}
	for _, s := range scopes {
		sd := scopeData{scope: s, Chart: chart(s.Record.Intervals)}
		for _, src := range s.Description.GetSources() {
			sd.Sources = append(sd.Sources, viewSource(src, s.Record.Sources[src.GetName()], now))
			if !slices.Contains(data.SourceNames, src.GetName()) {
				data.SourceNames = append(data.SourceNames, src.GetName())
			}
		}
		data.Scopes = append(data.Scopes, sd)
	}
	slices.Sort(data.SourceNames)
	// A filter names only what the page offers; anything else selects all.
	data.Filter = Filter{Scope: pick(f.Scope, names), Source: pick(f.Source, data.SourceNames), Kind: pick(f.Kind, []string{"transition", "override"})}
	for i := range data.Scopes {
		data.Scopes[i].Transitions = groupTransitions(data.Scopes[i].Record.Transitions, data.Filter)
	}
	name := "status"
	if q.Get("fragment") == "1" {
		name = "live"
	}
	var b bytes.Buffer
	if err := page.ExecuteTemplate(&b, name, data); err != nil {
		p.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", csp)
	_, _ = w.Write(b.Bytes())
}

// pick is v when it is one of allowed, else "".
func pick(v string, allowed []string) string {
	if slices.Contains(allowed, v) {
		return v
	}
	return ""
}

func (p *Page) fail(w http.ResponseWriter, err error) {
	p.log.Error("status page", "err", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}

var (
	//go:embed status.html
	pageText string
	//go:embed status.js
	script string
)

// csp lets the page run its own script and nothing else: no external
// script, style, image or connection but its own fetch of itself.
var csp = func() string {
	sum := sha256.Sum256([]byte(script))
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
}()

var page = template.Must(template.New("status").Funcs(template.FuncMap{
	"state": state,
	"reason": func(r admissionv1.Reason) string {
		if r == admissionv1.Reason_REASON_UNSPECIFIED {
			return "admitted"
		}
		return strings.ToLower(strings.TrimPrefix(r.String(), "REASON_"))
	},
	"dur":   dur,
	"ns":    short,
	"int64": func(n int32) int64 { return int64(n) },
	"limit": func(n int64) string {
		if n == 0 {
			return "∞"
		}
		return strconv.FormatInt(n, 10)
	},
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
	"upper": strings.ToUpper,
}).Parse(pageText))

func state(s admissionv1.BreakerState) string {
	return strings.TrimPrefix(s.String(), "BREAKER_STATE_")
}

func dur(d *durationpb.Duration) string {
	if d == nil {
		return "0s"
	}
	return short(d.AsDuration())
}

// short shows d to the second (to the millisecond under a second).
func short(d time.Duration) string {
	if d > 0 && d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

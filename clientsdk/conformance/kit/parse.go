package kit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Names the format accepts.
var (
	rpcs         = []string{"Pick", "OnNoRunnable", "RecordOutcome", "CancelCall"}
	outcomes     = []string{"SUCCESS", "TRANSIENT", "RATE_LIMITED", "SOURCE_DEAD", "CLIENT_ERROR", "CANCELLED"}
	appErrors    = []string{"aborted", "unavailable"}
	sidecarModes = []string{"fail", "allow"}
	tlsModes     = []string{"tls", "mtls"}
)

// maxExchange bounds an exchange's JSON text.
const maxExchange = 1 << 20

// maxMs bounds every _ms field the fake or a runner makes a duration of:
// a day is far beyond any exchange's waits, and no duration made of it (a
// grant's lease adds a margin) can wrap.
const maxMs = 24 * 60 * 60 * 1000

// maxExpectedMs bounds the _ms fields only compared with what the SDK sends:
// the longest google.protobuf.Duration, which an SDK saturates to.
const maxExpectedMs = 315_576_000_000 * 1000

// Parse decodes and validates one exchange; unknown fields are errors.
func Parse(data []byte) (*Exchange, error) {
	if len(data) > maxExchange {
		return nil, fmt.Errorf("exchange: more than %d bytes", maxExchange)
	}
	var ex Exchange
	if err := strictDecode(data, &ex); err != nil {
		return nil, err
	}
	if err := ex.validate(); err != nil {
		return nil, fmt.Errorf("exchange %q: %w", ex.Name, err)
	}
	return &ex, nil
}

// Load reads every *.json exchange of dir, in file name order.
func Load(dir string) ([]*Exchange, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	var out []*Exchange
	names := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		ex, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
		if prev, ok := names[ex.Name]; ok {
			return nil, fmt.Errorf("%s: name %q is also %s's", filepath.Base(f), ex.Name, prev)
		}
		names[ex.Name] = filepath.Base(f)
		out = append(out, ex)
	}
	return out, nil
}

func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

func oneOf(field, v string, allowed []string) error {
	if !slices.Contains(allowed, v) {
		return fmt.Errorf("%s: %q is not allowed; one of %s", field, v, strings.Join(allowed, ", "))
	}
	return nil
}

func msValid(field string, v int64) error { return within(field, v, maxMs) }

func within(field string, v, most int64) error {
	if v < 0 || v > most {
		return fmt.Errorf("%s: %d is not within 0..%d", field, v, most)
	}
	return nil
}

func (ex *Exchange) validate() error {
	if ex.Name == "" {
		return fmt.Errorf("name: empty")
	}
	if ex.Scope == "" {
		ex.Scope = "chat"
	}
	if m := ex.Client.OnSidecarUnavailable; m != "" {
		if err := oneOf("client.on_sidecar_unavailable", m, sidecarModes); err != nil {
			return err
		}
	}
	if m := ex.Client.TLS; m != "" {
		if err := oneOf("client.tls", m, tlsModes); err != nil {
			return err
		}
	}
	if len(ex.Calls) == 0 {
		return fmt.Errorf("calls: none")
	}
	for i, c := range ex.Calls {
		if c.Request.Method == "" || !strings.HasPrefix(c.Request.Path, "/") {
			return fmt.Errorf("calls[%d].request: want a method and a path starting with /", i)
		}
		s := c.AppSees
		if s.Error != "" {
			if err := oneOf(fmt.Sprintf("calls[%d].app_sees.error", i), s.Error, appErrors); err != nil {
				return err
			}
			if s.Status != 0 || s.Headers != nil || s.Body != nil || s.BodyJSON != nil {
				return fmt.Errorf("calls[%d].app_sees: an error has no status, headers or body", i)
			}
		} else if s.Status < 100 || s.Status > 599 {
			return fmt.Errorf("calls[%d].app_sees: want a status in 100..599 or an error", i)
		}
		if err := msValid(fmt.Sprintf("calls[%d].options.deadline_ms", i), c.Options.DeadlineMs); err != nil {
			return err
		}
		if c.AbortAfter < 0 || c.AbortAfter > len(ex.Script) {
			return fmt.Errorf("calls[%d].abort_after: %d is not within 0..%d, the script's events", i, c.AbortAfter, len(ex.Script))
		}
	}
	for i := range ex.Script {
		if err := ex.Script[i].parse(); err != nil {
			return fmt.Errorf("script[%d]: %w", i, err)
		}
	}
	return nil
}

func (s *Step) parse() error {
	if (s.RPC == "") == (s.Upstream == "") {
		return fmt.Errorf("want exactly one of rpc and upstream")
	}
	if err := msValid("after_ms", s.AfterMs); err != nil {
		return err
	}
	decode := func(raw json.RawMessage, field string, v any) error {
		if len(raw) == 0 {
			raw = json.RawMessage("{}")
		}
		if err := strictDecode(raw, v); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		return nil
	}
	if s.Upstream != "" {
		w, r := &UpstreamWant{}, &UpstreamReply{}
		if err := decode(s.Request, "request", w); err != nil {
			return err
		}
		if err := decode(s.Reply, "reply", r); err != nil {
			return err
		}
		if r.Status != 0 && (r.Status < 200 || r.Status > 599) {
			return fmt.Errorf("reply.status: %d is not within 200..599", r.Status)
		}
		if r.Hang && (r.Status != 0 || r.Body != nil || r.Stream != nil) {
			return fmt.Errorf("reply: a hang has no status, body or stream")
		}
		s.want, s.reply = w, r
		return nil
	}
	if err := oneOf("rpc", s.RPC, rpcs); err != nil {
		return err
	}
	var alternatives int
	count := func(set ...bool) {
		for _, b := range set {
			if b {
				alternatives++
			}
		}
	}
	switch s.RPC {
	case "Pick":
		w, r := &PickWant{}, &PickReply{}
		if err := decode(s.Request, "request", w); err != nil {
			return err
		}
		if err := decode(s.Reply, "reply", r); err != nil {
			return err
		}
		count(r.Grant != nil, r.NoRunnable != nil, r.Failure != nil, r.Error != nil, r.Hang)
		if err := within("request.deadline_ms_at_most", w.DeadlineMsAtMost, maxExpectedMs); err != nil {
			return err
		}
		if g := r.Grant; g != nil {
			if g.Source == "" {
				return fmt.Errorf("reply.grant.source: empty")
			}
			if err := msValid("reply.grant.timeout_ms", g.TimeoutMs); err != nil {
				return err
			}
		}
		if r.NoRunnable != nil {
			if err := reasonsValid("reply.no_runnable.reasons", r.NoRunnable.Reasons); err != nil {
				return err
			}
		}
		s.want, s.reply = w, r
		if !w.Opens && (w.EstimatedTokens != 0 || w.Priority != 0 || w.Tenant != "" || w.DeadlineMsAtMost != 0) {
			return fmt.Errorf("request: estimated_tokens, priority, tenant and deadline_ms_at_most are only on the Pick that opens the call")
		}
		if err := failureValid("reply.failure", r.Failure); err != nil {
			return err
		}
	case "OnNoRunnable":
		r := &OnNoRunnableReply{}
		if err := decode(s.Request, "request", &struct{}{}); err != nil {
			return err
		}
		if err := decode(s.Reply, "reply", r); err != nil {
			return err
		}
		count(r.Wait != nil, r.Failure != nil, r.Error != nil, r.Hang)
		if r.Wait != nil {
			if err := msValid("reply.wait.sleep_ms", r.Wait.SleepMs); err != nil {
				return err
			}
		}
		s.reply = r
		if err := failureValid("reply.failure", r.Failure); err != nil {
			return err
		}
	case "RecordOutcome":
		w, r := &RecordWant{}, &RecordReply{}
		if err := decode(s.Request, "request", w); err != nil {
			return err
		}
		if err := oneOf("request.outcome", w.Outcome, outcomes); err != nil {
			return err
		}
		if err := within("request.retry_after_hint_ms", w.RetryAfterHintMs, maxExpectedMs); err != nil {
			return err
		}
		if err := decode(s.Reply, "reply", r); err != nil {
			return err
		}
		count(r.Done != nil, r.Retry != nil, r.Failure != nil, r.Error != nil, r.Hang)
		if r.Retry != nil {
			if err := msValid("reply.retry.backoff_ms", r.Retry.BackoffMs); err != nil {
				return err
			}
		}
		s.want, s.reply = w, r
		if err := failureValid("reply.failure", r.Failure); err != nil {
			return err
		}
	case "CancelCall":
		r := &CancelReply{}
		if err := decode(s.Request, "request", &struct{}{}); err != nil {
			return err
		}
		if err := decode(s.Reply, "reply", r); err != nil {
			return err
		}
		// An answer (ended_now unless not_ended), an error or a hang.
		if (r.Error != nil) && r.Hang || r.NotEnded && (r.Error != nil || r.Hang) {
			return fmt.Errorf("reply: want one of an answer, an error and a hang")
		}
		alternatives = 1
		s.reply = r
	}
	if alternatives != 1 {
		return fmt.Errorf("reply: want exactly one answer of %s, got %d", s.RPC, alternatives)
	}
	return errorValid(s.reply.(rpcReply).errorOrHang().Error)
}

func failureValid(field string, f *FailureReply) error {
	if f == nil {
		return nil
	}
	if _, ok := failureReasons[f.Reason]; !ok {
		return fmt.Errorf("%s.reason: %q is not a failure reason; one of %s", field, f.Reason, strings.Join(sortedKeys(failureReasons), ", "))
	}
	if err := msValid(field+".retry_after_ms", f.RetryAfterMs); err != nil {
		return err
	}
	return reasonsValid(field+".reasons", f.Reasons)
}

func reasonsValid(field string, rs []Reason) error {
	for i, r := range rs {
		if _, ok := refusalReasons[r.Reason]; !ok {
			return fmt.Errorf("%s[%d].reason: %q is not a refusal; one of %s", field, i, r.Reason, strings.Join(sortedKeys(refusalReasons), ", "))
		}
		if err := msValid(fmt.Sprintf("%s[%d].retry_after_ms", field, i), r.RetryAfterMs); err != nil {
			return err
		}
	}
	return nil
}

func errorValid(e *ErrorReply) error {
	if e == nil {
		return nil
	}
	if _, ok := statusCodes[e.Code]; !ok {
		return fmt.Errorf("reply.error.code: %q is not a gRPC code; one of %s", e.Code, strings.Join(sortedKeys(statusCodes), ", "))
	}
	return nil
}

package promcheck

import (
	"slices"
	"testing"
)

const scrape = `# TYPE polygate_live_calls gauge
polygate_live_calls{scope="chat"} 0
# TYPE polygate_call_attempts histogram
polygate_call_attempts_bucket{scope="chat",result="done",le="1"} 1
polygate_call_attempts_bucket{scope="chat",result="done",le="+Inf"} 1
polygate_call_attempts_sum{scope="chat",result="done"} 1
polygate_call_attempts_count{scope="chat",result="done"} 1
# TYPE polygate_grants_total counter
polygate_grants_total{scope="chat",source="a"} 1
`

func TestUnknown(t *testing.T) {
	f, err := Parse([]byte(scrape))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text string
		want []string
	}{
		{`sum(polygate_live_calls{scope="x"})`, nil},
		{`rate(polygate_call_attempts_count[5m]) / rate(polygate_call_attempts_sum[5m])`, nil},
		{`histogram_quantile(0.9, rate(polygate_call_attempts_bucket[5m]))`, nil},
		// _total of a counter is its family name in the text format.
		{`rate(polygate_grants_total[1m])`, nil},
		// A gauge has no _count series; a typo is unknown; each once.
		{`polygate_live_calls_count + polygate_live_call + polygate_live_call`, []string{"polygate_live_calls_count", "polygate_live_call"}},
		{`grpc_server_handled_total`, []string{"grpc_server_handled_total"}},
		{`up == 0`, nil}, // not a sidecar metric: not checked
	} {
		if got := f.Unknown(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("Unknown(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

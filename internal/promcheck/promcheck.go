// Package promcheck reads a Prometheus scrape and checks that the metric
// names a document mentions (alerting rules, a dashboard, the docs) are ones
// the sidecar exports, for tests.
package promcheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are a scrape's metric families by name.
type Families map[string]*dto.MetricFamily

// maxScrape bounds what Scrape reads.
const maxScrape = 16 << 20

// Scrape reads url (e.g. http://127.0.0.1:9090/metrics) and parses it.
func Scrape(ctx context.Context, url string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxScrape))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return Parse(body)
}

// Parse parses the Prometheus text format.
func Parse(body []byte) (Families, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing the scrape: %w", err)
	}
	return Families(fams), nil
}

// namePattern matches the metric names of the sidecar: its own and those
// of the gRPC server middleware.
var namePattern = regexp.MustCompile(`\b(polygate|grpc_server)_[a-z_]+\b`)

// Names returns the metric names text mentions, each once, in order of
// first appearance.
func Names(text string) []string {
	var names []string
	for _, n := range namePattern.FindAllString(text, -1) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// Unknown returns the names text mentions that the scrape does not export.
// A histogram's series (_bucket, _count, _sum) count as its family.
func (f Families) Unknown(text string) []string {
	var unknown []string
	for _, n := range Names(text) {
		if !f.Exports(n) {
			unknown = append(unknown, n)
		}
	}
	return unknown
}

// Exports reports whether name is a family of the scrape, or a series of
// one of its histograms.
func (f Families) Exports(name string) bool {
	if f[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && f[base] != nil && f[base].GetType() == dto.MetricType_HISTOGRAM {
			return true
		}
	}
	return false
}

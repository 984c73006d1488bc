package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// health is the degradation state the writer logs: one line when records
// start being lost, at most one reminder per warnEvery while losses go on,
// and one line when a whole interval passed without a loss.
type health struct {
	degraded            bool
	since, lastLine     time.Time
	seenQueue, seenDrop uint64 // losses already accounted for
	lineQueue, lineDrop uint64 // losses at the last line
	startQueue          uint64 // losses when the degradation began
	startDrop           uint64
	lostThisTick        bool  // a loss was seen since the last tick
	lastWriteOK         bool  // the last transaction committed
	err                 error // the last write error
}

// check looks at the loss counters after a write (tick false) or at each
// warnEvery tick (tick true), and logs the changes of state.
func (s *Sink) check(tick bool) {
	h := &s.health
	q, d := s.queueDropped.Load(), s.writeDropped.Load()
	now := s.now()
	lost := q > h.seenQueue || d > h.seenDrop
	switch {
	case lost && !h.degraded:
		h.degraded, h.since, h.lastLine = true, now, now
		h.startQueue, h.startDrop = h.seenQueue, h.seenDrop
		s.degraded.Store(true)
		s.log.Warn("telemetry degraded: records are being dropped; decisions are not affected", s.lossAttrs(q-h.seenQueue, d-h.seenDrop)...)
		h.lineQueue, h.lineDrop = q, d
	case lost && now.Sub(h.lastLine) >= warnEvery:
		h.lastLine = now
		s.log.Warn("telemetry still degraded: records are being dropped", s.lossAttrs(q-h.lineQueue, d-h.lineDrop)...)
		h.lineQueue, h.lineDrop = q, d
	case tick && h.degraded && !lost && !h.lostThisTick && h.lastWriteOK:
		h.degraded = false
		s.degraded.Store(false)
		s.log.Info("telemetry recovered: records are written again", "path", s.path,
			"dropped_queue_full", q-h.startQueue, "dropped_write_failed", d-h.startDrop, "degraded_for", now.Sub(h.since))
		h.err = nil
	}
	if tick {
		h.lostThisTick = false
	} else if lost {
		h.lostThisTick = true
	}
	h.seenQueue, h.seenDrop = q, d
}

func (s *Sink) lossAttrs(queue, write uint64) []any {
	attrs := []any{"path", s.path, "dropped_queue_full", queue, "dropped_write_failed", write, "queue_size", cap(s.queue)}
	if s.health.err != nil {
		attrs = append(attrs, "err", s.health.err)
	}
	return attrs
}

// Counts are what the sink did so far.
type Counts struct {
	// Rows written.
	Calls, Attempts uint64
	// Records lost to a full queue, and to failed transactions.
	DroppedQueueFull, DroppedWriteFailed uint64
	FailedWrites                         uint64
	Pruned                               uint64
	Degraded                             bool
}

// Counts reads the sink's counters.
func (s *Sink) Counts() Counts {
	return Counts{
		Calls: s.calls.Load(), Attempts: s.attempts.Load(),
		DroppedQueueFull: s.queueDropped.Load(), DroppedWriteFailed: s.writeDropped.Load(),
		FailedWrites: s.failedWrites.Load(), Pruned: s.pruned.Load(), Degraded: s.degraded.Load(),
	}
}

var (
	recordsDesc  = prometheus.NewDesc("polygate_telemetry_records_total", "Rows written to the telemetry database, by table.", []string{"table"}, nil)
	droppedDesc  = prometheus.NewDesc("polygate_telemetry_dropped_records_total", "Records lost, by reason (queue_full, write_failed).", []string{"reason"}, nil)
	failedDesc   = prometheus.NewDesc("polygate_telemetry_failed_writes_total", "Transactions that failed (their records are counted as dropped).", nil, nil)
	degradedDesc = prometheus.NewDesc("polygate_telemetry_degraded", "1 while telemetry records are being lost.", nil, nil)
	queueDesc    = prometheus.NewDesc("polygate_telemetry_queue_length", "Records waiting to be written.", nil, nil)
	capDesc      = prometheus.NewDesc("polygate_telemetry_queue_capacity", "Records the queue holds before it drops.", nil, nil)
	prunedDesc   = prometheus.NewDesc("polygate_telemetry_pruned_rows_total", "Rows deleted for being older than telemetry.retention.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Sink) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{recordsDesc, droppedDesc, failedDesc, degradedDesc, queueDesc, capDesc, prunedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Sink) Collect(ch chan<- prometheus.Metric) {
	c := func(d *prometheus.Desc, t prometheus.ValueType, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	c(recordsDesc, prometheus.CounterValue, s.calls.Load(), "calls")
	c(recordsDesc, prometheus.CounterValue, s.attempts.Load(), "attempts")
	c(droppedDesc, prometheus.CounterValue, s.queueDropped.Load(), "queue_full")
	c(droppedDesc, prometheus.CounterValue, s.writeDropped.Load(), "write_failed")
	c(failedDesc, prometheus.CounterValue, s.failedWrites.Load())
	degraded := uint64(0)
	if s.degraded.Load() {
		degraded = 1
	}
	c(degradedDesc, prometheus.GaugeValue, degraded)
	c(queueDesc, prometheus.GaugeValue, uint64(len(s.queue)))
	c(capDesc, prometheus.GaugeValue, uint64(cap(s.queue)))
	c(prunedDesc, prometheus.CounterValue, s.pruned.Load())
}

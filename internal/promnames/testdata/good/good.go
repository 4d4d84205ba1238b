// Package good defines metrics in each way the finder reads, for its test.
package good

import "github.com/prometheus/client_golang/prometheus"

const subsystem = "queue"

var (
	Calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sample_calls_total"}, []string{"lane", "code"})
	Wait  = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sample", Subsystem: subsystem, Name: "wait_seconds"})
)

type collector struct{ used, resident *prometheus.Desc }

func newCollector() *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("sample_"+name, help, labels, nil)
	}
	return &collector{used: d("used", "Used."), resident: d("resident_shapes", "Resident.", "lane")}
}

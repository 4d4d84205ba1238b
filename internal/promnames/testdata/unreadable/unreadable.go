// Package unreadable defines a metric whose name is not a constant.
package unreadable

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

var Calls = prometheus.NewCounter(prometheus.CounterOpts{Name: os.Getenv("METRIC")})

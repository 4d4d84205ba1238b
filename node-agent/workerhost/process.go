/*
Copyright 2026 The Synapse Fleet Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package workerhost

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// Process is one worker: a process, or whatever gave its Streams.
type Process struct {
	stdin  io.WriteCloser
	kill   func() error
	r      *protocol.Reader
	w      *protocol.Writer
	nextID uint64
	frame  []byte // the last Execute request frame's buffer, reused (Exchange)
	log    logr.Logger
	cfg    Config

	exited  chan struct{}
	waitErr error

	mu     sync.Mutex
	tail   []string // the last stderr lines, for error messages
	close  sync.Once
	onLine func(line string)
}

// attach is the host's end of the started worker s: its stderr lines are logged (and passed to
// onLine, if set), and its exit is confirmed once it has said everything.
func attach(s Streams, cfg Config, log logr.Logger, onLine func(line string)) *Process {
	p := &Process{stdin: s.Stdin, kill: s.Kill, r: protocol.NewReader(s.Stdout, 0), w: protocol.NewWriter(s.Stdin, 0),
		exited: make(chan struct{}), log: log, cfg: cfg, onLine: onLine}
	stderrDone := make(chan struct{})
	go p.logStderr(s.Stderr, stderrDone)
	go func() {
		<-stderrDone // read everything the worker said before reaping it
		p.waitErr = s.Wait()
		close(p.exited)
	}()
	return p
}

func (p *Process) logStderr(r io.Reader, done chan<- struct{}) {
	defer close(done)
	readLines(r, maxStderrLine, func(line string) {
		p.log.Info(line)
		if p.onLine != nil {
			p.onLine(line)
		}
		p.mu.Lock()
		p.tail = append(p.tail, line)
		if len(p.tail) > 5 {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
	})
}

// maxStderrLine bounds what is kept of one stderr line; the rest of a longer line is read and
// dropped, so the worker never blocks writing to a pipe nobody reads.
const maxStderrLine = 16 << 10

// readLines calls f with each line of r until r ends, a line cut to its first max bytes and
// marked with how much was dropped. Unlike a bufio.Scanner, which stops at the first line longer
// than its buffer, it reads r to its end whatever the worker writes.
func readLines(r io.Reader, max int, f func(line string)) {
	br := bufio.NewReaderSize(r, max)
	for {
		chunk, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line, dropped := string(chunk), 0
			for errors.Is(err, bufio.ErrBufferFull) {
				chunk, err = br.ReadSlice('\n')
				dropped += len(chunk)
			}
			if bytes.HasSuffix(chunk, []byte("\n")) {
				dropped-- // the newline is not part of the line
			}
			f(fmt.Sprintf("%s... (%d more bytes of this line dropped)", line, dropped))
		} else if len(chunk) > 0 {
			f(string(bytes.TrimSuffix(chunk, []byte("\n"))))
		}
		if err != nil {
			return
		}
	}
}

func (p *Process) lastWords() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tail) == 0 {
		return ""
	}
	return "; it said: " + strings.Join(p.tail, " | ")
}

// errFault marks a fault of unknown outcome: the stream is broken and the worker recovers.
var errFault = errors.New("worker fault")

// call runs one exchange, bounded by timeout (bounded). A reply that is not the answer to this
// request is a fault; an Error frame is the worker's refusal.
func (p *Process) call(ctx context.Context, timeout time.Duration, req *pb.Request) (*pb.Response, error) {
	p.nextID++
	req.Id = p.nextID
	var resp *pb.Response
	if err := p.bounded(ctx, timeout, func() (err error) { resp, err = p.exchange(ctx, req); return err }); err != nil {
		return nil, err
	}
	return answerTo(req.Id, resp)
}

// answerTo is resp as the answer to request id: a reply to another request is a fault, an
// Error frame the worker's refusal.
func answerTo(id uint64, resp *pb.Response) (*pb.Response, error) {
	if resp.Id != id {
		return nil, fmt.Errorf("%w: reply %d to request %d", errFault, resp.Id, id)
	}
	if e := resp.GetError(); e != nil {
		return nil, &supervisor.WorkerError{Code: e.Code, Message: e.Message}
	}
	return resp, nil
}

// bounded runs exchange, one write and its reads, bounded by timeout. A broken stream or a
// timeout is a fault of unknown outcome. The exchange runs on the caller's goroutine (a
// hand-off to another goroutine and back would cost two wake-ups on every call): a timeout or
// the caller going away kills the worker, which ends the write or read in progress, and the
// call reports why.
func (p *Process) bounded(ctx context.Context, timeout time.Duration, exchange func() error) error {
	// ended is set once: by the exchange when it finishes, or by the first of the timer and the
	// caller's cancellation, which then kills the worker.
	var (
		ended  sync.Once
		killed error
	)
	kill := func(why func() error) func() {
		return func() {
			ended.Do(func() {
				killed = why()
				_ = p.Kill()
			})
		}
	}
	timer := p.cfg.Clock.AfterFunc(timeout, kill(func() error { return fmt.Errorf("no answer within %s", timeout) }))
	defer timer.Stop()
	stop := context.AfterFunc(ctx, kill(func() error { return ctx.Err() }))
	defer stop()
	err := exchange()
	finished := false
	ended.Do(func() { finished = true })
	if !finished {
		// The worker was killed, whatever the exchange saw: its stream is not reused.
		return fmt.Errorf("%w: %v, worker killed", errFault, killed)
	}
	if err != nil {
		return fmt.Errorf("%w: %v%s", errFault, err, p.lastWords())
	}
	return nil
}

// exchange writes req and reads its answer, reporting an admission's progress on the way.
func (p *Process) exchange(ctx context.Context, req *pb.Request) (*pb.Response, error) {
	if err := p.w.Write(req); err != nil {
		return nil, err
	}
	for {
		resp := &pb.Response{}
		err := p.r.Read(resp)
		if pr := resp.GetAdmitProgress(); err == nil && pr != nil && resp.Id == req.Id && req.GetAdmit() != nil {
			// Progress of this admission: report it and read on for its answer.
			supervisor.ReportProgress(ctx, int(pr.LayersDone))
			continue
		}
		return resp, err
	}
}

// Admit implements supervisor.Worker.
func (p *Process) Admit(ctx context.Context, rung int) (supervisor.Admission, error) {
	resp, err := p.call(ctx, p.cfg.AdmitTimeout, &pb.Request{Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: uint32(rung), ReportProgress: true}}})
	if err != nil {
		return supervisor.Admission{}, err
	}
	a := resp.GetAdmitted()
	if a == nil || a.Rung != uint32(rung) {
		return supervisor.Admission{}, fmt.Errorf("%w: admit %d answered with %v", errFault, rung, resp)
	}
	var out supervisor.Admission
	if a.CacheHitLayers != nil {
		v := int(*a.CacheHitLayers)
		out.CacheHitLayers = &v
	}
	if a.CompiledLayers != nil {
		v := int(*a.CompiledLayers)
		out.CompiledLayers = &v
	}
	return out, nil
}

// Evict implements supervisor.Worker.
func (p *Process) Evict(ctx context.Context, rung int) error {
	resp, err := p.call(ctx, p.cfg.CallTimeout, &pb.Request{Body: &pb.Request_Evict{Evict: &pb.Evict{Rung: uint32(rung)}}})
	if err != nil {
		return err
	}
	if r := resp.GetReleased(); r == nil || r.Rung != uint32(rung) {
		return fmt.Errorf("%w: evict %d answered with %v", errFault, rung, resp)
	}
	return nil
}

// Inventory implements supervisor.Worker.
func (p *Process) Inventory(ctx context.Context) ([]int, error) {
	resp, err := p.call(ctx, p.cfg.CallTimeout, &pb.Request{Body: &pb.Request_Inventory{Inventory: &pb.Inventory{}}})
	if err != nil {
		return nil, err
	}
	inv := resp.GetInventory()
	if inv == nil {
		return nil, fmt.Errorf("%w: inventory answered with %v", errFault, resp)
	}
	out := make([]int, len(inv.Resident))
	for i, r := range inv.Resident {
		out[i] = int(r)
	}
	return out, nil
}

// Probe implements supervisor.Worker.
func (p *Process) Probe(ctx context.Context, rung int) (device, cpu time.Duration, err error) {
	resp, err := p.call(ctx, p.cfg.CallTimeout, &pb.Request{Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: uint32(rung)}}})
	if err != nil {
		return 0, 0, err
	}
	r := resp.GetProbeResult()
	if r == nil || r.Rung != uint32(rung) || !(r.DeviceMs > 0) || !(r.CpuMs > 0) {
		return 0, 0, fmt.Errorf("%w: probe %d answered with %v", errFault, rung, resp)
	}
	return time.Duration(r.DeviceMs * float64(time.Millisecond)), time.Duration(r.CpuMs * float64(time.Millisecond)), nil
}

// Close closes the worker's channel; it finishes and exits.
func (p *Process) Close() error {
	var err error
	p.close.Do(func() { err = p.stdin.Close() })
	return err
}

// Kill ends the process.
func (p *Process) Kill() error { return p.kill() }

// Exited is closed once the process has been waited on: its exit is confirmed.
func (p *Process) Exited() <-chan struct{} { return p.exited }

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

package hollow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// Spawner starts a hollow Mac's workers in this process: each generation is the real worker
// protocol loop (worker.Server) in front of the sim backend on the Mac's one simane.Machine (its
// compiler serving one layer at a time, its aned cache, its program limit, at the Machine's
// scale), spoken to over in-memory pipes in protocol v3 frames, as the agent speaks to a worker
// process over its stdin and stdout. Only the process is missing: a crash fault closes the
// pipes where a process would exit.
type Spawner struct {
	Machine *simane.Machine
	// SigningID and BinaryDigest are what the worker reports in its hello.
	SigningID, BinaryDigest string
	Clock                   clock.Clock
	// Faults, if set, is a worker.ParseFaults list injected into every generation.
	Faults string
	// CallTimeout bounds every exchange but an admission; AdmitTimeout an admission.
	CallTimeout, AdmitTimeout time.Duration

	mu     sync.Mutex
	onLine func(lane string, gen int64, line string)
}

// OnStderr makes every line the workers write on their stderr reach f, as the worker host
// passes on a worker process's.
func (s *Spawner) OnStderr(f func(lane string, gen int64, line string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onLine = f
}

// lineWriter calls f with every whole line written to it.
type lineWriter struct {
	f       func(string)
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.f(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
}

var _ supervisor.Spawner = (*Spawner)(nil)

// Spawn implements supervisor.Spawner: it starts the generation, says hello and loads the model.
func (s *Spawner) Spawn(ctx context.Context, spec supervisor.ModelSpec, gen int64) (supervisor.Worker, []int, error) {
	faults, err := worker.ParseFaults(s.Faults)
	if err != nil {
		return nil, nil, err
	}
	toWorker, fromAgent := io.Pipe()
	toAgent, fromWorker := io.Pipe()
	serveCtx, stop := context.WithCancel(context.Background())
	var stderr io.Writer = io.Discard
	s.mu.Lock()
	if f := s.onLine; f != nil {
		stderr = &lineWriter{f: func(line string) { f(spec.Lane, gen, line) }}
	}
	s.mu.Unlock()
	w := &pipeWorker{spawner: s, r: protocol.NewReader(toAgent, 0), w: protocol.NewWriter(fromAgent, 0),
		in: fromAgent, out: toAgent, stop: stop, exited: make(chan struct{})}
	srv := &worker.Server{
		Backend:  &worker.Sim{Machine: s.Machine, SigningID: s.SigningID, Clock: s.Clock},
		Identity: worker.Identity{Backend: "sim", SigningIdentifier: s.SigningID, BinaryDigest: s.BinaryDigest},
		Stderr:   stderr,
		Faults:   faults,
		// A crash: the process would be gone, and its pipes with it.
		Exit: func(int) { w.sever(errors.New("the hollow worker crashed")) },
	}
	go func() {
		err := srv.Serve(serveCtx, toWorker, fromWorker)
		if err == nil {
			err = io.EOF
		}
		_ = toWorker.CloseWithError(err)
		_ = fromWorker.CloseWithError(err)
		close(w.exited)
	}()

	resp, err := w.call(ctx, s.CallTimeout, &pb.Request{Body: &pb.Request_Hello{Hello: &pb.Hello{ProtocolVersion: worker.ProtocolVersion}}})
	if err == nil && (resp.GetHello() == nil || resp.GetHello().BinaryDigest != s.BinaryDigest) {
		err = fmt.Errorf("the worker answered hello with %v", resp)
	}
	if err == nil {
		rungs := make([]uint32, len(spec.Rungs))
		for i, r := range spec.Rungs {
			rungs[i] = uint32(r)
		}
		resp, err = w.call(ctx, s.CallTimeout, &pb.Request{Body: &pb.Request_Load{Load: &pb.Load{Lane: spec.Lane, Identity: spec.Identity,
			Model: spec.Model, Layers: uint32(spec.Layers), Dimensions: uint32(spec.Dimensions), Rungs: rungs, ArtifactDir: spec.ArtifactDir}}})
		if err == nil && resp.GetLoaded() == nil {
			err = fmt.Errorf("the worker answered load with %v", resp)
		}
	}
	if err != nil {
		_ = w.Kill()
		<-w.exited
		return nil, nil, fmt.Errorf("hollow worker generation %d of lane %s did not start: %w", gen, spec.Lane, err)
	}
	var cached []int
	if c := resp.GetLoaded().GetAneCachedShapes(); c != nil {
		cached = []int{}
		for _, r := range c.Rungs {
			cached = append(cached, int(r))
		}
	}
	return w, cached, nil
}

// pipeWorker is the agent's end of one hollow worker generation.
type pipeWorker struct {
	spawner *Spawner
	r       *protocol.Reader
	w       *protocol.Writer
	in      *io.PipeWriter // the worker's stdin
	out     *io.PipeReader // the worker's stdout
	stop    context.CancelFunc
	nextID  uint64
	exited  chan struct{}
	once    sync.Once
}

var _ supervisor.Worker = (*pipeWorker)(nil)

// errFault marks a fault of unknown outcome: the stream is broken and the worker recovers.
var errFault = errors.New("hollow worker fault")

// sever ends the generation as a process exit would: its stream breaks and it stops.
func (p *pipeWorker) sever(err error) {
	p.once.Do(func() {
		p.stop()
		_ = p.in.CloseWithError(err)
		_ = p.out.CloseWithError(err)
	})
}

// call runs one exchange, bounded by timeout, as the worker host does: progress frames of an
// admission are reported to the supervisor, an Error frame is the worker's refusal, anything
// else that goes wrong is a fault and the worker is ended.
func (p *pipeWorker) call(ctx context.Context, timeout time.Duration, req *pb.Request) (*pb.Response, error) {
	p.nextID++
	req.Id = p.nextID
	type result struct {
		resp *pb.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		if err := p.w.Write(req); err != nil {
			done <- result{err: err}
			return
		}
		for {
			resp := &pb.Response{}
			err := p.r.Read(resp)
			if pr := resp.GetAdmitProgress(); err == nil && pr != nil && resp.Id == req.Id {
				supervisor.ReportProgress(ctx, int(pr.LayersDone))
				continue
			}
			done <- result{resp: resp, err: err}
			return
		}
	}()
	timer := p.spawner.Clock.NewTimer(timeout)
	defer timer.Stop()
	var res result
	select {
	case res = <-done:
	case <-timer.C():
		_ = p.Kill()
		<-done
		return nil, fmt.Errorf("%w: no answer within %s, worker ended", errFault, timeout)
	case <-ctx.Done():
		_ = p.Kill()
		<-done
		return nil, fmt.Errorf("%w: %v, worker ended", errFault, ctx.Err())
	}
	switch {
	case res.err != nil:
		return nil, fmt.Errorf("%w: %v", errFault, res.err)
	case res.resp.Id != req.Id:
		return nil, fmt.Errorf("%w: reply %d to request %d", errFault, res.resp.Id, req.Id)
	case res.resp.GetError() != nil:
		return nil, &supervisor.WorkerError{Code: res.resp.GetError().Code, Message: res.resp.GetError().Message}
	}
	return res.resp, nil
}

// Admit implements supervisor.Worker.
func (p *pipeWorker) Admit(ctx context.Context, rung int) (supervisor.Admission, error) {
	resp, err := p.call(ctx, p.spawner.AdmitTimeout, &pb.Request{Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: uint32(rung), ReportProgress: true}}})
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
func (p *pipeWorker) Evict(ctx context.Context, rung int) error {
	resp, err := p.call(ctx, p.spawner.CallTimeout, &pb.Request{Body: &pb.Request_Evict{Evict: &pb.Evict{Rung: uint32(rung)}}})
	if err != nil {
		return err
	}
	if r := resp.GetReleased(); r == nil || r.Rung != uint32(rung) {
		return fmt.Errorf("%w: evict %d answered with %v", errFault, rung, resp)
	}
	return nil
}

// Exchange implements supervisor.Worker: payload is a serialised Execute, the reply a
// serialised Reply.
func (p *pipeWorker) Exchange(ctx context.Context, rung int, payload []byte) ([]byte, error) {
	exec := &pb.Execute{}
	if err := proto.Unmarshal(payload, exec); err != nil {
		return nil, &supervisor.WorkerError{Code: "invalid_input", Message: err.Error()}
	}
	exec.Rung = uint32(rung)
	resp, err := p.call(ctx, p.spawner.CallTimeout, &pb.Request{Body: &pb.Request_Execute{Execute: exec}})
	if err != nil {
		return nil, err
	}
	if resp.GetReply() == nil {
		return nil, fmt.Errorf("%w: execute answered with %v", errFault, resp)
	}
	return proto.Marshal(resp.GetReply())
}

// Inventory implements supervisor.Worker.
func (p *pipeWorker) Inventory(ctx context.Context) ([]int, error) {
	resp, err := p.call(ctx, p.spawner.CallTimeout, &pb.Request{Body: &pb.Request_Inventory{Inventory: &pb.Inventory{}}})
	if err != nil {
		return nil, err
	}
	if resp.GetInventory() == nil {
		return nil, fmt.Errorf("%w: inventory answered with %v", errFault, resp)
	}
	var out []int
	for _, r := range resp.GetInventory().Resident {
		out = append(out, int(r))
	}
	return out, nil
}

// Probe implements supervisor.Worker.
func (p *pipeWorker) Probe(ctx context.Context, rung int) (device, cpu time.Duration, err error) {
	resp, err := p.call(ctx, p.spawner.CallTimeout, &pb.Request{Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: uint32(rung)}}})
	if err != nil {
		return 0, 0, err
	}
	r := resp.GetProbeResult()
	if r == nil || r.Rung != uint32(rung) || !(r.DeviceMs > 0) || !(r.CpuMs > 0) {
		return 0, 0, fmt.Errorf("%w: probe %d answered with %v", errFault, rung, resp)
	}
	return time.Duration(r.DeviceMs * float64(time.Millisecond)), time.Duration(r.CpuMs * float64(time.Millisecond)), nil
}

// Close implements supervisor.Worker: the worker reads the end of its input and exits.
func (p *pipeWorker) Close() error { return p.in.Close() }

// Kill implements supervisor.Worker.
func (p *pipeWorker) Kill() error {
	p.sever(errors.New("the hollow worker was killed"))
	return nil
}

// Exited implements supervisor.Worker.
func (p *pipeWorker) Exited() <-chan struct{} { return p.exited }
